//! Instance migrations: the lazy one a node applies to a row of an old version it claims,
//! and the bulk `migrate_instances`. One FSM, `Plan`, at three versions: v1 counts `n`;
//! v2 holds `cents` (`n * 100`) and renames or drops v1's steps; v3 adds a currency.
//! Each scenario first `deploy`s the code it needs: the old code alone (rows park on v1),
//! then the new code with its migrations.

use std::time::Duration;

use gen_durable::{
    DurableState, Error, Event, MigrateOptions, Migration, MigrationError, MigrationReport,
    Registry, Status, Step,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::S;

pub mod v1 {
    use super::*;
    use crate::test_fsm;

    test_fsm!(Plan, state = S, queue = "conf", version = 1, {
        Start => "start" |ctx| { ctx.state.log.push("v1:start".into()); Ok(Step::next(Plan::Wait)) },
        Wait => "wait" |_ctx| { Ok(Step::await_signal(["go"], Plan::Finish)) },
        Finish => "finish" |ctx| { Ok(Step::done(json!({ "v": 1, "n": ctx.state.n, "log": ctx.state.log }))) },
        // Dropped in v2: its rows go on at v2's `close`.
        Legacy => "legacy" |_ctx| { Ok(Step::done(json!("v1 legacy ran"))) },
    });
}

/// v2's state: `n` became `cents`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S2 {
    pub cents: i64,
    #[serde(default)]
    pub log: Vec<String>,
    #[serde(default)]
    pub tag: String,
}

impl DurableState for S2 {
    const TYPE_NAME: &'static str = "S2";
}

/// v3's state: v2's with a currency.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S3 {
    pub cents: i64,
    pub currency: String,
    #[serde(default)]
    pub log: Vec<String>,
    #[serde(default)]
    pub tag: String,
}

impl DurableState for S3 {
    const TYPE_NAME: &'static str = "S3";
}

pub mod v2 {
    use super::*;
    use crate::test_fsm;

    test_fsm!(Plan, state = S2, queue = "conf", version = 2, {
        Open => "open" |ctx| { ctx.state.log.push("v2:open".into()); Ok(Step::next(Plan::Wait)) },
        Wait => "wait" |_ctx| { Ok(Step::await_signal(["go"], Plan::Close)) },
        Close => "close" |ctx| {
            Ok(Step::done(json!({ "v": 2, "cents": ctx.state.cents, "log": ctx.state.log, "awaited": ctx.awaited().len() })))
        },
    });
}

pub mod v3 {
    use super::*;
    use crate::test_fsm;

    test_fsm!(Plan, state = S3, queue = "conf", version = 3, {
        Open => "open" |ctx| { ctx.state.log.push("v3:open".into()); Ok(Step::next(Plan::Wait)) },
        Wait => "wait" |_ctx| { Ok(Step::await_signal(["go"], Plan::Close)) },
        Close => "close" |ctx| {
            Ok(Step::done(json!({ "v": 3, "cents": ctx.state.cents, "currency": ctx.state.currency, "log": ctx.state.log })))
        },
    });
}

/// v1 → v2: refuses a negative `n` and panics on 666; `legacy` goes on at `close`.
impl Migration for v2::Plan {
    type From = v1::Plan;

    fn migrate_state(old: S) -> Result<S2, MigrationError> {
        if old.n == 666 {
            panic!("cannot migrate 666");
        }
        if old.n < 0 {
            return Err(MigrationError::new(format!("negative n {}", old.n)));
        }
        let mut log = old.log;
        log.push("1->2".into());
        Ok(S2 {
            cents: old.n * 100,
            log,
            tag: old.tag,
        })
    }

    fn migrate_step(old: v1::Plan) -> Self {
        match old {
            v1::Plan::Start => v2::Plan::Open,
            v1::Plan::Wait => v2::Plan::Wait,
            v1::Plan::Finish | v1::Plan::Legacy => v2::Plan::Close,
        }
    }
}

/// v2 → v3.
impl Migration for v3::Plan {
    type From = v2::Plan;

    fn migrate_state(old: S2) -> Result<S3, MigrationError> {
        let mut log = old.log;
        log.push("2->3".into());
        Ok(S3 {
            cents: old.cents,
            currency: "EUR".into(),
            log,
            tag: old.tag,
        })
    }

    fn migrate_step(old: v2::Plan) -> Self {
        match old {
            v2::Plan::Open => v3::Plan::Open,
            v2::Plan::Wait => v3::Plan::Wait,
            v2::Plan::Close => v3::Plan::Close,
        }
    }
}

/// The suite's FSMs with `Plan` v1 only: the code that wrote the old rows.
fn old_code() -> Registry {
    let mut r = crate::fsms::registry();
    r.register::<v1::Plan>();
    r
}

/// v1 and v2 with the migration between them.
fn v2_code() -> Registry {
    let mut r = old_code();
    r.register::<v2::Plan>();
    r.add_migration::<v2::Plan>();
    r
}

/// v1 and v3 with both migrations: v2 itself is not run, only crossed.
fn v3_code() -> Registry {
    let mut r = old_code();
    r.register::<v3::Plan>();
    r.add_migration::<v2::Plan>();
    r.add_migration::<v3::Plan>();
    r
}

fn plan(n: i64, tag: &str) -> S {
    S {
        n,
        ..S::tagged(tag)
    }
}

fn report(dry_run: bool, migrated: &[(i32, u64)], failures: &[(i64, &str)]) -> MigrationReport {
    MigrationReport {
        fsm: "Plan".into(),
        to: 2,
        dry_run,
        migrated: migrated.iter().copied().collect(),
        failed: failures.len() as u64,
        failures: failures.iter().map(|(i, e)| (*i, e.to_string())).collect(),
        executing: 0,
        skipped: 0,
    }
}

fn migrated(id: i64, from: i32, to: i32) -> Event {
    Event::InstanceMigrated {
        id,
        fsm: "Plan",
        from,
        to,
    }
}

fn failed(id: i64, error: &str) -> Event {
    Event::MigrationFailed {
        id,
        fsm: "Plan",
        from: 1,
        to: 2,
        error: error.into(),
    }
}

const NEGATIVE: &str = "migrating Plan v1 to v2 failed: negative n -1";

/// A runnable v1 row claimed by a node that runs v2 moves to v2 (state transformed, step
/// mapped) and its step runs on v2 under the same claim.
pub async fn a_runnable_old_row_is_migrated_on_claim_and_runs_on_the_new_version<B: Backend>(
    b: &mut B,
) {
    b.deploy(v2_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(5, &tag), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 1, await: 1, steps: 2}");
    let i = b.get(id).await;
    i.assert_awaiting(["go"])
        .assert_step("close")
        .assert_state(json!({ "cents": 500, "log": ["1->2", "v2:open"], "tag": tag }));
    assert_eq!((i.fsm_version, i.attempt, i.last_error), (2, 0, None));
    assert_eq!(b.events(), [migrated(id, 1, 2)]);
    assert_eq!(b.kinds(id), ["next", "await"]);

    b.signal(id, "go", json!({})).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "v": 2, "cents": 500, "log": ["1->2", "v2:open"], "awaited": 1 }));
    assert_eq!(b.events().len(), 1, "migrated once");
}

/// A chain 1 → 2 → 3 is applied whole on one claim (v2 need not run on the node): both
/// transforms, both step maps, one event from v1 to v3.
pub async fn a_chain_moves_a_row_through_every_version_at_once<B: Backend>(b: &mut B) {
    b.deploy(v3_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(7, &tag), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 1, await: 1, steps: 2}");
    let i = b.get(id).await;
    i.assert_awaiting(["go"])
        .assert_step("close")
        .assert_state(json!({
            "cents": 700, "currency": "EUR", "log": ["1->2", "2->3", "v3:open"], "tag": tag
        }));
    assert_eq!(i.fsm_version, 3);
    assert_eq!(b.events(), [migrated(id, 1, 3)]);
    b.signal(id, "go", json!({})).await.unwrap();
    b.run().await;
    b.get(id).await.assert_done(json!({
        "v": 3, "cents": 700, "currency": "EUR", "log": ["1->2", "2->3", "v3:open"]
    }));
}

/// A transform that returns an error: the row stays on v1 as it was, its step not run,
/// replayed after `backoff(attempt)` with the error as `last_error`; once its state
/// migrates, it moves and runs on v2.
pub async fn a_failing_transform_leaves_the_row_on_its_version_and_retries_after_the_backoff<
    B: Backend,
>(
    b: &mut B,
) {
    b.deploy(v2_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(-1, &tag), Opts::default())
        .await
        .unwrap();
    let stored = b.get(id).await.state;
    assert_eq!(
        b.run().await.to_string(),
        "{steps: 0}",
        "a failed migration is no step"
    );
    let i = b.get(id).await;
    i.assert_status(Status::Runnable)
        .assert_step("start")
        .assert_state(stored.clone());
    assert_eq!(
        (i.fsm_version, i.attempt, i.last_error.as_deref()),
        (1, 1, Some(NEGATIVE))
    );
    assert_eq!(i.eligible_at, b.now() + chrono::Duration::seconds(1));
    assert_eq!(b.events(), [failed(id, NEGATIVE)]);
    assert!(b.kinds(id).is_empty());

    assert_eq!(b.run().await.steps, 0, "not before the backoff");
    assert_eq!(b.events().len(), 1);
    b.advance(Duration::from_secs(1)).await;
    b.run().await;
    let i = b.get(id).await;
    assert_eq!((i.fsm_version, i.attempt), (1, 2));
    assert_eq!(i.eligible_at, b.now() + chrono::Duration::seconds(2));
    assert_eq!(b.events(), [failed(id, NEGATIVE), failed(id, NEGATIVE)]);

    // Fixed by hand: the next claim migrates it.
    b.overwrite_state(id, json!({ "n": 4, "tag": tag })).await;
    b.advance(Duration::from_secs(2)).await;
    assert_eq!(b.run().await.to_string(), "{next: 1, await: 1, steps: 2}");
    let i = b.get(id).await;
    i.assert_awaiting(["go"])
        .assert_state(json!({ "cents": 400, "log": ["1->2", "v2:open"], "tag": tag }));
    assert_eq!((i.fsm_version, i.attempt, i.last_error), (2, 0, None));
    assert_eq!(b.events().last(), Some(&migrated(id, 1, 2)));
}

/// A transform that panics is a failed migration like an error, the panic's message in
/// `last_error`.
pub async fn a_panicking_transform_is_a_failed_migration<B: Backend>(b: &mut B) {
    b.deploy(v2_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(666, &tag), Opts::default())
        .await
        .unwrap();
    let before = b.get(id).await;
    assert_eq!(b.run().await.steps, 0);
    let i = b.get(id).await;
    let error = "migrating Plan v1 to v2 failed: the state transform panicked: cannot migrate 666";
    i.assert_status(Status::Runnable)
        .assert_step("start")
        .assert_state(before.state);
    assert_eq!(
        (i.fsm_version, i.attempt, i.last_error.as_deref()),
        (1, 1, Some(error))
    );
    assert_eq!(b.events(), [failed(id, error)]);
}

/// A row that the old code parked, migrated in bulk while parked: it stays parked on the
/// same signal, at the mapped step on v2, where the signal wakes it.
pub async fn a_parked_row_migrated_in_bulk_continues_at_the_mapped_step<B: Backend>(b: &mut B) {
    b.deploy(old_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(2, &tag), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 1, await: 1, steps: 2}");
    b.get(id)
        .await
        .assert_awaiting(["go"])
        .assert_step("finish");

    b.deploy(v2_code()).await;
    let r = b
        .migrate_instances("Plan", 2, MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(r, report(false, &[(1, 1)], &[]));
    let i = b.get(id).await;
    i.assert_awaiting(["go"])
        .assert_step("close")
        .assert_state(json!({ "cents": 200, "log": ["v1:start", "1->2"], "tag": tag }));
    assert_eq!(i.fsm_version, 2);
    assert!(
        b.events().is_empty(),
        "a bulk migration emits no claim event"
    );

    assert!(b.signal(id, "go", json!({})).await.unwrap().woke);
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "v": 2, "cents": 200, "log": ["v1:start", "1->2"], "awaited": 1 }));
    assert_eq!(b.kinds(id), ["next", "await", "done"]);
}

/// A dry run runs the transforms and reports what a real run does, writing nothing; the
/// real run moves the good rows, leaves the bad one where it is with `last_error`, and
/// never touches finished rows.
pub async fn a_bulk_dry_run_reports_and_changes_nothing<B: Backend>(b: &mut B) {
    b.deploy(old_code()).await;
    let tag = b.tag().to_string();
    let good = b.insert::<v1::Plan>(plan(1, &tag), Opts::default()).await;
    let bad = b.insert::<v1::Plan>(plan(-1, &tag), Opts::default()).await;
    let other = b.insert::<v1::Plan>(plan(2, &tag), Opts::default()).await;
    let over = b
        .insert::<v1::Plan>(plan(3, &tag), Opts::default().step("legacy"))
        .await;
    let ids = [good.unwrap(), bad.unwrap(), other.unwrap(), over.unwrap()];
    assert_eq!(
        b.run().await.to_string(),
        "{next: 3, await: 3, done: 1, steps: 7}"
    );
    b.deploy(v2_code()).await;
    let mut before = Vec::new();
    for id in ids {
        before.push(b.get(id).await);
    }

    let dry = b
        .migrate_instances("Plan", 2, MigrateOptions::dry_run())
        .await
        .unwrap();
    assert_eq!(dry, report(true, &[(1, 2)], &[(ids[1], NEGATIVE)]));
    for (id, was) in ids.iter().zip(&before) {
        assert_eq!(&b.get(*id).await, was, "a dry run wrote to {id}");
    }

    let done = b
        .migrate_instances("Plan", 2, MigrateOptions::default().with_batch(2))
        .await
        .unwrap();
    assert_eq!(done, report(false, &[(1, 2)], &[(ids[1], NEGATIVE)]));
    for id in [ids[0], ids[2]] {
        let i = b.get(id).await;
        i.assert_awaiting(["go"]).assert_step("close");
        assert_eq!(i.fsm_version, 2);
    }
    let i = b.get(ids[1]).await;
    i.assert_awaiting(["go"])
        .assert_step("finish")
        .assert_state(before[1].state.clone());
    assert_eq!(
        (i.fsm_version, i.attempt, i.last_error.as_deref()),
        (1, 0, Some(NEGATIVE))
    );
    assert_eq!(
        b.get(ids[3]).await,
        before[3],
        "a finished row is not moved"
    );

    let again = b
        .migrate_instances("Plan", 2, MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(again, report(false, &[], &[(ids[1], NEGATIVE)]));
}

/// Every chain is checked before anything is written: with no migration from a version a
/// live row is at, or none to the version asked for, the answer is `NoMigration` and
/// nothing changes.
pub async fn a_bulk_migration_without_a_chain_is_no_migration_and_changes_nothing<B: Backend>(
    b: &mut B,
) {
    let mut no_first_hop = old_code();
    no_first_hop.register::<v3::Plan>();
    no_first_hop.add_migration::<v3::Plan>();
    b.deploy(no_first_hop).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(1, &tag), Opts::default())
        .await
        .unwrap();
    let before = b.get(id).await;
    for to in [3, 4] {
        let e = b
            .migrate_instances("Plan", to, MigrateOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::NoMigration { fsm, from: 1, to: t, known }
                if fsm == "Plan" && *t == to && known == &[(2, 3)]),
            "{e:?}"
        );
        assert_eq!(b.get(id).await, before);
    }

    b.deploy(v3_code()).await;
    let r = b
        .migrate_instances("Plan", 3, MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(r.migrated_total(), 1, "{r:?}");
    assert_eq!(b.get(id).await.fsm_version, 3);
}

/// A step v2 dropped: its rows go on at the step the map names.
pub async fn a_removed_step_is_mapped_to_its_replacement<B: Backend>(b: &mut B) {
    b.deploy(v2_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(3, &tag), Opts::default().step("legacy"))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_done(json!({ "v": 2, "cents": 300, "log": ["1->2"], "awaited": 0 }))
        .assert_step("close");
    assert_eq!(i.fsm_version, 2);
    assert_eq!(b.events(), [migrated(id, 1, 2)]);
}

/// A node that has the migration but not the version it leads to runs the row on its own
/// version (the migration is for nodes that run the new one).
pub async fn a_node_without_the_new_version_runs_the_old_one<B: Backend>(b: &mut B) {
    let mut migration_only = old_code();
    migration_only.add_migration::<v2::Plan>();
    b.deploy(migration_only).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(-1, &tag), Opts::default().step("legacy"))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_done(json!("v1 legacy ran"));
    assert_eq!((i.fsm_version, i.last_error), (1, None));
    assert!(b.events().is_empty());
}

/// A row woken on v1 whose migration fails keeps what woke it: the replay is on its old
/// step with its awaits and inbox, so once it migrates, the new step sees the signal.
pub async fn a_failed_migration_keeps_the_signal_that_woke_the_row<B: Backend>(b: &mut B) {
    b.deploy(old_code()).await;
    let tag = b.tag().to_string();
    let id = b
        .insert::<v1::Plan>(plan(-1, &tag), Opts::default())
        .await
        .unwrap();
    b.run().await;
    assert!(b.signal(id, "go", json!({})).await.unwrap().woke);

    b.deploy(v2_code()).await;
    assert_eq!(b.run().await.steps, 0);
    let i = b.get(id).await;
    i.assert_status(Status::Runnable)
        .assert_step("finish")
        .assert_inbox(["go"]);
    assert_eq!(i.awaits, ["go"]);
    assert_eq!(
        (i.fsm_version, i.attempt, i.last_error.as_deref()),
        (1, 1, Some(NEGATIVE))
    );

    b.overwrite_state(id, json!({ "n": 3, "log": ["v1:start"], "tag": tag }))
        .await;
    b.advance(Duration::from_secs(1)).await;
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "v": 2, "cents": 300, "log": ["v1:start", "1->2"], "awaited": 1 }))
        .assert_inbox(Vec::<&str>::new());
    assert_eq!(b.events(), [failed(id, NEGATIVE), migrated(id, 1, 2)]);
}
