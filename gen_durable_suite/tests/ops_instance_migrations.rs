//! Instance migrations on the engine: lazy on claim (fenced, once), in bulk
//! (`Client::migrate_instances`), chains, failing and panicking transforms, and a
//! rolling deploy where old and new nodes overlap while rows migrate under them.

mod common;

use std::time::Duration;

use common::{eventually, finished, status, Events};
use gen_durable::{
    Client, DurableState, Engine, Error, Event, HistoryKind, MigrateOptions, Migration,
    MigrationError, QueueConfig, Registry, Step,
};
use gen_durable_testkit::TestDb;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Version 1's state. `v1_log` has no default, so v1's code cannot run on a later state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S1 {
    pub v1_log: Vec<String>,
    pub plan: String,
}
impl DurableState for S1 {
    const TYPE_NAME: &'static str = "S1";
}

/// Version 2's state. `cents` has no default, so v2's code cannot run on a v1 state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S2 {
    pub log: Vec<String>,
    pub cents: u64,
}
impl DurableState for S2 {
    const TYPE_NAME: &'static str = "S2";
}

/// Version 3's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S3 {
    pub log: Vec<String>,
    pub cents: u64,
    pub currency: String,
}
impl DurableState for S3 {
    const TYPE_NAME: &'static str = "S3";
}

mod v1 {
    use super::*;
    test_fsm!(Sub, state = S1, queue = "subs", version = 1, {
        Charge => "charge" |ctx| { ctx.state.v1_log.push("v1:charge".into()); Ok(Step::next(Sub::Wait)) },
        Wait => "wait" |ctx| { ctx.state.v1_log.push("v1:wait".into()); Ok(Step::await_signal(["go"], Sub::Notify)) },
        Notify => "notify" |ctx| { ctx.state.v1_log.push("v1:notify".into()); Ok(Step::done(json!(ctx.state.v1_log.clone()))) },
    });
}

mod v2 {
    use super::*;
    test_fsm!(Sub, state = S2, queue = "subs", version = 2, {
        Charge => "charge" |ctx| { ctx.state.log.push("v2:charge".into()); Ok(Step::next(Sub::Wait)) },
        Wait => "wait" |ctx| { ctx.state.log.push("v2:wait".into()); Ok(Step::await_signal(["go"], Sub::Email)) },
        Email => "email" |ctx| { ctx.state.log.push("v2:email".into()); Ok(Step::done(json!({"log": ctx.state.log.clone(), "cents": ctx.state.cents}))) },
    });

    impl Migration for Sub {
        type From = v1::Sub;
        fn migrate_state(old: S1) -> Result<S2, MigrationError> {
            let cents = match old.plan.as_str() {
                "basic" => 500,
                "pro" => 2_000,
                "panic" => panic!("the transform blew up"),
                other => return Err(format!("unknown plan {other:?}").into()),
            };
            Ok(S2 {
                log: old.v1_log,
                cents,
            })
        }
        fn migrate_step(old: v1::Sub) -> Self {
            match old {
                v1::Sub::Charge => Sub::Charge,
                v1::Sub::Wait => Sub::Wait,
                v1::Sub::Notify => Sub::Email,
            }
        }
    }
}

mod v3 {
    use super::*;
    test_fsm!(Sub, state = S3, queue = "subs", version = 3, {
        Charge => "charge" |ctx| { ctx.state.log.push("v3:charge".into()); Ok(Step::next(Sub::Wait)) },
        Wait => "wait" |ctx| { ctx.state.log.push("v3:wait".into()); Ok(Step::await_signal(["go"], Sub::Email)) },
        Email => "email" |ctx| { ctx.state.log.push("v3:email".into()); Ok(Step::done(json!({"log": ctx.state.log.clone(), "currency": ctx.state.currency.clone()}))) },
    });

    impl Migration for Sub {
        type From = v2::Sub;
        fn migrate_state(old: S2) -> Result<S3, MigrationError> {
            if old.cents > 1_000 {
                return Err(MigrationError::new("no EUR price above 10.00"));
            }
            Ok(S3 {
                log: old.log,
                cents: old.cents,
                currency: "EUR".into(),
            })
        }
        fn migrate_step(old: v2::Sub) -> Self {
            match old {
                v2::Sub::Charge => Sub::Charge,
                v2::Sub::Wait => Sub::Wait,
                v2::Sub::Email => Sub::Email,
            }
        }
    }
}

fn plan(p: &str) -> S1 {
    S1 {
        v1_log: Vec::new(),
        plan: p.into(),
    }
}

async fn node(pool: &sqlx::PgPool, id: &str, registry: Registry, events: &Events) -> Engine {
    Engine::builder(pool.clone())
        .with_node_id(id)
        .with_registry(registry)
        .queue_with(
            "subs",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(20)),
        )
        .on_event(events.handler())
        .start()
        .await
        .unwrap()
}

/// `(fsm_version, status, step, attempt, last_error)` of a row.
async fn row(pool: &sqlx::PgPool, id: i64) -> (i32, String, String, i32, Option<String>) {
    sqlx::query_as(
        "SELECT fsm_version, status::text, step, attempt, last_error FROM gd_instances WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The `migrated` entries of an instance's history: (step, next step, actor, node, detail).
type MigratedEntry = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

async fn migrations_in_history(gd: &Client, id: i64) -> Vec<MigratedEntry> {
    gd.history(id, None, 100)
        .await
        .unwrap()
        .entries
        .into_iter()
        .filter(|e| e.kind == HistoryKind::Migrated)
        .map(|e| (e.step, e.next_step, e.actor, e.node, e.detail))
        .collect()
}

async fn state(pool: &sqlx::PgPool, id: i64) -> Value {
    sqlx::query_scalar("SELECT state FROM gd_instances WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn parked(pool: &sqlx::PgPool, id: i64) {
    eventually(10, &format!("instance {id} parked"), || async move {
        status(pool, id).await == "awaiting_signal"
    })
    .await;
}

fn migrated_events(events: &Events) -> Vec<(i64, i32, i32)> {
    events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::InstanceMigrated { id, from, to, .. } => Some((*id, *from, *to)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_node_that_knows_the_migration_moves_old_rows_on_claim_and_runs_them_on_the_new_version()
{
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(gd.insert::<v1::Sub>(plan("basic")).await.unwrap());
    }
    // Release 2 keeps no v1 code: only v2 and the migration.
    let mut release_2 = Registry::new();
    release_2.register::<v2::Sub>();
    release_2.add_migration::<v2::Sub>();
    let events = Events::default();
    let engine = node(db.pool(), "new", release_2, &events).await;
    for &id in &ids {
        parked(db.pool(), id).await;
        assert_eq!(row(db.pool(), id).await.0, 2, "moved to v2 on its claim");
        gd.signal(id, "go", json!({})).await.unwrap();
    }
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 10).await, "done");
        let result: Value = sqlx::query_scalar("SELECT result FROM gd_instances WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(
            result,
            json!({"log": ["v2:charge", "v2:wait", "v2:email"], "cents": 500})
        );
    }
    let mut migrated = migrated_events(&events);
    migrated.sort_unstable();
    let want: Vec<(i64, i32, i32)> = ids.iter().map(|&id| (id, 1, 2)).collect();
    assert_eq!(migrated, want, "one migration per row, committed once");
    // The history says so, once per row, as the node that did it.
    for &id in &ids {
        assert_eq!(
            migrations_in_history(&gd, id).await,
            vec![(
                "charge".to_string(),
                Some("charge".to_string()),
                None,
                Some("new".to_string()),
                Some("from version 1 to 2".to_string())
            )],
        );
    }
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_failing_or_panicking_transform_leaves_the_row_on_its_version_for_the_old_code() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let gold = gd.insert::<v1::Sub>(plan("gold")).await.unwrap();
    let boom = gd.insert::<v1::Sub>(plan("panic")).await.unwrap();
    let mut release_2 = Registry::new();
    release_2.register::<v2::Sub>();
    release_2.add_migration::<v2::Sub>();
    let events = Events::default();
    let engine = node(db.pool(), "new", release_2, &events).await;
    eventually(10, "both migrations failed", || async {
        events
            .all()
            .iter()
            .filter(|e| matches!(e, Event::MigrationFailed { .. }))
            .count()
            >= 2
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    for (id, why) in [
        (gold, "unknown plan \"gold\""),
        (boom, "panicked: the transform blew up"),
    ] {
        let (version, status, step, attempt, last_error) = row(db.pool(), id).await;
        assert_eq!(
            (version, status.as_str(), step.as_str()),
            (1, "runnable", "charge")
        );
        assert!(
            attempt >= 1,
            "a failed migration is a replay of the old step"
        );
        let err = last_error.unwrap();
        assert!(
            err.contains("migrating Sub v1 to v2 failed") && err.contains(why),
            "{err}"
        );
        assert_eq!(
            state(db.pool(), id).await,
            json!({"v1_log": [], "plan": plan_of(id, gold)})
        );
    }
    // Nothing is lost: a node that still runs v1 finishes them on v1's code.
    let mut release_1 = Registry::new();
    release_1.register::<v1::Sub>();
    let old = node(db.pool(), "old", release_1, &Events::default()).await;
    for id in [gold, boom] {
        parked(db.pool(), id).await;
        gd.signal(id, "go", json!({})).await.unwrap();
        assert_eq!(finished(db.pool(), id, 10).await, "done");
        assert_eq!(row(db.pool(), id).await.0, 1);
    }
    old.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

fn plan_of(id: i64, gold: i64) -> &'static str {
    if id == gold {
        "gold"
    } else {
        "panic"
    }
}

#[tokio::test]
async fn a_chain_moves_a_row_all_the_way_or_leaves_it_where_it_was() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let basic = gd.insert::<v1::Sub>(plan("basic")).await.unwrap();
    // v1 -> v2 works for "pro", v2 -> v3 refuses it: the row stays on v1, not v2.
    let pro = gd.insert::<v1::Sub>(plan("pro")).await.unwrap();
    let mut release_3 = Registry::new();
    release_3.register::<v3::Sub>();
    release_3.add_migration::<v2::Sub>();
    release_3.add_migration::<v3::Sub>();
    let events = Events::default();
    let engine = node(db.pool(), "new", release_3, &events).await;
    parked(db.pool(), basic).await;
    assert_eq!(row(db.pool(), basic).await.0, 3);
    assert_eq!(
        state(db.pool(), basic).await,
        json!({"log": ["v3:charge", "v3:wait"], "cents": 500, "currency": "EUR"})
    );
    eventually(10, "the chain failed for pro", || async {
        row(db.pool(), pro).await.4.is_some()
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    let (version, _, step, _, err) = row(db.pool(), pro).await;
    assert_eq!((version, step.as_str()), (1, "charge"), "never half-way");
    let err = err.unwrap();
    assert!(
        err.contains("v2 to v3") && err.contains("no EUR price"),
        "{err}"
    );
    assert_eq!(migrated_events(&events), vec![(basic, 1, 3)]);
    db.close().await;
}

#[tokio::test]
async fn bulk_migration_moves_parked_rows_skips_executing_ones_and_a_dry_run_writes_nothing() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry({
        let mut r = Registry::new();
        r.register::<v1::Sub>();
        r.register::<v2::Sub>();
        r.add_migration::<v2::Sub>();
        r
    });
    let mut parked_ids = Vec::new();
    for _ in 0..7 {
        parked_ids.push(gd.insert::<v1::Sub>(plan("basic")).await.unwrap());
    }
    let gold = gd.insert::<v1::Sub>(plan("gold")).await.unwrap();
    let mut release_1 = Registry::new();
    release_1.register::<v1::Sub>();
    let old = node(db.pool(), "old", release_1, &Events::default()).await;
    for &id in parked_ids.iter().chain([&gold]) {
        parked(db.pool(), id).await;
    }
    old.shutdown(Duration::from_secs(5)).await;
    // One row is executing (as a node would leave it mid-step): never touched.
    let busy = parked_ids.pop().unwrap();
    sqlx::query(
        "UPDATE gd_instances SET status = 'executing', locked_by = 'elsewhere', \
         lease_expires_at = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(busy)
    .execute(db.pool())
    .await
    .unwrap();

    let snapshot = || async {
        sqlx::query_as::<_, (i64, i32, String, Value, Option<String>, String)>(
            "SELECT id, fsm_version, step, state, last_error, updated_at::text FROM gd_instances ORDER BY id",
        )
        .fetch_all(db.pool())
        .await
        .unwrap()
    };
    let before = snapshot().await;
    let dry = gd
        .migrate_instances("Sub", 2, MigrateOptions::dry_run().with_batch(4))
        .await
        .unwrap();
    assert_eq!(snapshot().await, before, "a dry run writes nothing");
    assert!(dry.dry_run);
    assert_eq!(dry.migrated.get(&1), Some(&6));
    assert_eq!((dry.failed, dry.executing, dry.skipped), (1, 1, 0));
    assert_eq!(dry.failures.len(), 1);
    assert_eq!(dry.failures[0].0, gold);

    // No chain to v3: a typed error, and nothing changes.
    let err = gd
        .migrate_instances("Sub", 3, MigrateOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NoMigration { from: 1, to: 3, .. }),
        "{err}"
    );
    assert_eq!(snapshot().await, before);

    let done = gd
        .clone()
        .with_actor("ops")
        .migrate_instances("Sub", 2, MigrateOptions::default().with_batch(4))
        .await
        .unwrap();
    // The history records each row moved, once, as the actor did it; none for the rest.
    for &id in &parked_ids {
        assert_eq!(
            migrations_in_history(&gd, id).await,
            vec![(
                "notify".to_string(),
                Some("email".to_string()),
                Some("ops".to_string()),
                None,
                Some("from version 1 to 2".to_string())
            )],
        );
    }
    assert_eq!(migrations_in_history(&gd, gold).await, vec![]);
    assert_eq!(migrations_in_history(&gd, busy).await, vec![]);
    assert_eq!(done.migrated.get(&1), Some(&6));
    assert_eq!((done.failed, done.executing, done.skipped), (1, 1, 0));
    for &id in &parked_ids {
        let (version, status, step, _, _) = row(db.pool(), id).await;
        // A parked row's step is the one it runs when woken: v1's notify, mapped to email.
        assert_eq!(
            (version, status.as_str(), step.as_str()),
            (2, "awaiting_signal", "email")
        );
        assert_eq!(
            state(db.pool(), id).await,
            json!({"log": ["v1:charge", "v1:wait"], "cents": 500})
        );
    }
    let (version, status, _, _, err) = row(db.pool(), gold).await;
    assert_eq!((version, status.as_str()), (1, "awaiting_signal"));
    assert!(err.unwrap().contains("unknown plan \"gold\""));
    assert_eq!(
        row(db.pool(), busy).await.0,
        1,
        "an executing row is not touched"
    );
    // A second run finds nothing new to move.
    let again = gd
        .migrate_instances("Sub", 2, MigrateOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (again.migrated_total(), again.failed, again.executing),
        (0, 1, 1)
    );

    // Release 2 finishes the migrated rows at the mapped step, on v2's code.
    let mut release_2 = Registry::new();
    release_2.register::<v2::Sub>();
    let new = node(db.pool(), "new", release_2, &Events::default()).await;
    for &id in &parked_ids {
        gd.signal(id, "go", json!({})).await.unwrap();
        assert_eq!(finished(db.pool(), id, 10).await, "done");
        let result: Value = sqlx::query_scalar("SELECT result FROM gd_instances WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(
            result,
            json!({"log": ["v1:charge", "v1:wait", "v2:email"], "cents": 500})
        );
    }
    new.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct R1 {
    pub old: Vec<String>,
}
impl DurableState for R1 {
    const TYPE_NAME: &'static str = "R1";
}
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct R2 {
    pub new: Vec<String>,
    pub migrated: bool,
}
impl DurableState for R2 {
    const TYPE_NAME: &'static str = "R2";
}

mod roll_v1 {
    use super::*;
    test_fsm!(Roll, state = R1, queue = "subs", version = 1, {
        A => "a" |ctx| { tokio::time::sleep(Duration::from_millis(3)).await; ctx.state.old.push("v1:a".into()); Ok(Step::next(Roll::B)) },
        B => "b" |ctx| { tokio::time::sleep(Duration::from_millis(3)).await; ctx.state.old.push("v1:b".into()); Ok(Step::next(Roll::C)) },
        C => "c" |ctx| { ctx.state.old.push("v1:c".into()); Ok(Step::done(json!(ctx.state.old.clone()))) },
    });
}
mod roll_v2 {
    use super::*;
    test_fsm!(Roll, state = R2, queue = "subs", version = 2, {
        A => "a" |ctx| { tokio::time::sleep(Duration::from_millis(3)).await; ctx.state.new.push("v2:a".into()); Ok(Step::next(Roll::B)) },
        B => "b" |ctx| { tokio::time::sleep(Duration::from_millis(3)).await; ctx.state.new.push("v2:b".into()); Ok(Step::next(Roll::D)) },
        D => "d" |ctx| { ctx.state.new.push("v2:d".into()); Ok(Step::done(json!(ctx.state.new.clone()))) },
    });
    impl Migration for Roll {
        type From = roll_v1::Roll;
        fn migrate_state(old: R1) -> Result<R2, MigrationError> {
            Ok(R2 {
                new: old.old,
                migrated: true,
            })
        }
        fn migrate_step(old: roll_v1::Roll) -> Self {
            match old {
                roll_v1::Roll::A => Roll::A,
                roll_v1::Roll::B => Roll::B,
                roll_v1::Roll::C => Roll::D,
            }
        }
    }
}

/// A rolling deploy with a migration: two release-1 nodes run v1; a release-2 node
/// (v2 and the migration, no v1 code) starts while they work, a bulk migration runs
/// while all three claim, then the old nodes drain and stop. Nothing is lost, every step
/// ran once, no row ran on code that does not match its version (each version's state
/// does not cast into the other's), and each migrated row was migrated exactly once.
#[tokio::test]
async fn a_rolling_deploy_migrates_rows_under_running_nodes_once_and_loses_nothing() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry({
        let mut r = Registry::new();
        r.register::<roll_v1::Roll>();
        r.add_migration::<roll_v2::Roll>();
        r
    });
    let mut ids = Vec::new();
    for _ in 0..200 {
        ids.push(gd.insert::<roll_v1::Roll>(R1::default()).await.unwrap());
    }
    let mut release_1 = Registry::new();
    release_1.register::<roll_v1::Roll>();
    let mut release_2 = Registry::new();
    release_2.register::<roll_v2::Roll>();
    release_2.add_migration::<roll_v2::Roll>();
    let quiet = Events::default();
    let old_a = node(db.pool(), "old-a", release_1.clone(), &quiet).await;
    let old_b = node(db.pool(), "old-b", release_1, &quiet).await;
    eventually(20, "release 1 at work", || async {
        common::count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            >= 5
    })
    .await;
    let on_new = Events::default();
    let new_c = node(db.pool(), "new-c", release_2, &on_new).await;
    // A bulk migration races the claims of all three nodes.
    let bulk = gd
        .migrate_instances("Roll", 2, MigrateOptions::default().with_batch(16))
        .await
        .unwrap();
    assert_eq!(bulk.failed, 0);
    tokio::join!(
        old_a.shutdown(Duration::from_secs(10)),
        old_b.shutdown(Duration::from_secs(10))
    );
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 30).await, "done", "instance {id}");
    }
    let rows: Vec<(i64, i32, Value)> =
        sqlx::query_as("SELECT id, fsm_version, result FROM gd_instances ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let mut on_v2 = 0;
    for (id, version, log) in rows {
        let log: Vec<String> = serde_json::from_value(log).unwrap();
        let steps: Vec<&str> = log.iter().map(|s| &s[3..]).collect();
        let versions: Vec<&str> = log.iter().map(|s| &s[..2]).collect();
        let last = if version == 2 { "d" } else { "c" };
        assert_eq!(
            steps,
            ["a", "b", last],
            "instance {id}: each step once: {log:?}"
        );
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "instance {id}: never v1 code after v2: {log:?}"
        );
        assert_eq!(versions[2], format!("v{version}"), "instance {id}: {log:?}");
        on_v2 += i64::from(version == 2);
    }
    // Every row on v2 was migrated exactly once: by the bulk run or on a claim.
    let lazy = migrated_events(&on_new);
    let mut lazy_ids: Vec<i64> = lazy.iter().map(|m| m.0).collect();
    lazy_ids.sort_unstable();
    lazy_ids.dedup();
    assert_eq!(
        lazy_ids.len(),
        lazy.len(),
        "no row migrated twice on claims"
    );
    assert_eq!(
        bulk.migrated_total() as i64 + lazy.len() as i64,
        on_v2,
        "bulk {} + lazy {} = rows on v2",
        bulk.migrated_total(),
        lazy.len()
    );
    assert!(on_v2 > 0);
    new_c.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
