//! What only the kit has: determinism, the runaway guard, assertion messages, events,
//! and its stated differences from Postgres.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use gen_durable::{Child, Entry, Event, Key, Status, Step, StepError};
use gen_durable_testkit::{Instance, Tally, TestKit};
use serde_json::json;

use crate::fsms::*;
use crate::test_fsm;

test_fsm!(Looper, state = S, queue = "conf", version = 1, {
    Spin => "spin" |ctx| { ctx.state.n += 1; Ok(Step::next(Looper::Spin)) },
});

test_fsm!(Orphaner, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |_ctx| { Ok(Step::schedule_children(vec![Child::new::<Unknown>(S::default())], Orphaner::Sum)) },
    Sum => "sum" |_ctx| { Ok(Step::done(json!("children finished"))) },
});

test_fsm!(Unknown, state = S, queue = "conf", version = 1, {
    Only => "only" |_ctx| { Ok(Step::done(json!(null))) },
});

test_fsm!(Transactional, state = S, queue = "conf", version = 1, {
    Only => "only" |ctx| { ctx.transaction().await.map_err(StepError::new)?; Ok(Step::done(json!(null))) },
});

fn kit() -> TestKit {
    TestKit::new().with_registry(registry())
}

/// A scenario mixing every outcome, signals, timeouts and children.
async fn mixed() -> (Vec<Tally>, Vec<Instance>) {
    let mut kit = kit();
    let mut tallies = Vec::new();
    let parent = S {
        n: 4,
        log: vec!["fail:1".into()],
        ..S::default()
    };
    kit.insert::<Parent>(parent).await.unwrap();
    let acc = kit.insert::<Acc>(S::default()).await.unwrap();
    let timed = kit.insert::<Timed>(S::default()).await.unwrap();
    let branch = kit
        .insert::<Branch>(S::default())
        .priority(-1)
        .await
        .unwrap();
    kit.insert::<Replayer>(S::default()).await.unwrap();
    kit.insert_all([
        Entry::<Counter>::new(S::n(1)).priority(3),
        Entry::<Counter>::new(S::n(2)).unique_key("c"),
        Entry::<Counter>::new(S::n(3)).unique_key("c"),
    ])
    .await
    .unwrap();
    kit.insert::<Grand>(S::default()).await.unwrap();
    tallies.push(kit.run_until_idle().await);
    for (name, x) in [("a", 1), ("c", 3), ("b", 5)] {
        kit.signal(acc, name, json!({ "x": x })).await.unwrap();
        tallies.push(kit.run_until_idle().await);
    }
    kit.signal(branch, "approve", json!({})).await.unwrap();
    kit.signal(timed, "noise", json!({})).await.unwrap();
    for _ in 0..4 {
        kit.advance(Duration::from_secs(1800));
        tallies.push(kit.run_until_idle().await);
    }
    (tallies, kit.instances())
}

#[tokio::test]
async fn the_same_scenario_gives_the_same_tally_and_states_100_times() {
    let first = mixed().await;
    assert_eq!(
        first.0.iter().map(Tally::to_string).collect::<Vec<_>>(),
        [
            "{next: 4, replay: 1, await: 3, schedule_children: 4, done: 13, stop: 1, steps: 26}",
            "{await: 1, steps: 1}",
            "{await: 1, steps: 1}",
            "{done: 1, steps: 1}",
            "{replay: 1, done: 1, steps: 2}",
            "{next: 1, done: 2, steps: 3}",
            "{steps: 0}",
            "{steps: 0}",
        ]
    );
    for run in 1..100 {
        let again = mixed().await;
        assert_eq!(again.0, first.0, "tallies differ on run {run}");
        assert_eq!(again.1, first.1, "final states differ on run {run}");
    }
}

#[tokio::test]
async fn a_runaway_loop_panics_naming_the_instance() {
    let mut kit = kit().with_max_steps(50);
    kit.insert::<Clocked>(S::default()).await.unwrap();
    let id = kit.insert::<Looper>(S::default()).await.unwrap();
    let err = AssertUnwindSafe(kit.run_until_idle())
        .catch_unwind_message()
        .await;
    assert!(err.contains("50 steps without going idle"), "{err}");
    assert!(
        err.contains(&format!("by instance {id} (Looper v1)")),
        "{err}"
    );
    assert!(err.contains("step \"spin\""), "{err}");
    assert!(err.contains(&format!("{id}:spin->next")), "{err}");
}

/// `assert_steps` reads the history: the steps that committed an outcome, a retried step
/// once; it names what it found when they differ. Without an actor, the kit's actions are
/// recorded as `testkit`.
#[tokio::test]
async fn assert_steps_reads_the_steps_from_the_history() {
    let mut kit = kit();
    let id = kit.insert::<Journey>(S::default()).await.unwrap();
    kit.run_until_idle().await;
    kit.assert_steps(id, ["a", "b", "c"]);
    kit.signal(id, "go", json!({})).await.unwrap();
    kit.run_until_idle().await;
    kit.assert_steps(id, ["a", "b", "c", "d", "e"]);
    assert_eq!(kit.entries(id).len(), 6, "the retry of b is an entry too");
    let err = std::panic::catch_unwind(AssertUnwindSafe(|| kit.assert_steps(id, ["a", "e"])))
        .expect_err("a wrong list panics");
    let err = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        err.contains(&format!("the steps instance {id} committed")),
        "{err}"
    );
    kit.restart(id, "a").await.unwrap();
    let last = kit.entries(id).pop().unwrap();
    assert_eq!(last.actor.as_deref(), Some(gen_durable_testkit::KIT_ACTOR));
}

#[tokio::test]
async fn a_due_instance_of_an_unknown_fsm_panics_with_the_fix() {
    let mut kit = kit();
    kit.insert::<Orphaner>(S::default()).await.unwrap();
    let err = AssertUnwindSafe(kit.run_until_idle())
        .catch_unwind_message()
        .await;
    assert!(
        err.contains("does not know Unknown v1") && err.contains(".register::<T>()"),
        "{err}"
    );
    // Registered, it runs.
    let mut kit = kit.register::<Unknown>();
    kit.run_until_idle().await;
}

#[tokio::test]
async fn assertion_failures_show_status_step_and_last_error() {
    let mut kit = kit();
    let id = kit.insert::<Plain>(S::default()).await.unwrap();
    let w = kit.insert::<Waiter>(S::default()).await.unwrap();
    kit.run_until_idle().await;
    let msg = panic_message(|| {
        kit.assert_done(id, json!("ok"));
    });
    assert!(msg.contains("expected done with \"ok\""), "{msg}");
    assert!(msg.contains("status failed"), "{msg}");
    assert!(msg.contains("step \"only\""), "{msg}");
    assert!(msg.contains("last_error Some(\"bad input\")"), "{msg}");
    let msg = panic_message(|| {
        kit.assert_failed(w, "boom");
    });
    assert!(
        msg.contains("status awaiting_signal") && msg.contains("awaits [\"go\"]"),
        "{msg}"
    );
    let msg = panic_message(|| {
        kit.assert_awaiting(id, ["go"]);
    });
    assert!(
        msg.contains("expected awaiting_signal on [\"go\"]"),
        "{msg}"
    );
    let msg = panic_message(|| {
        kit.assert_step(w, "park");
    });
    assert!(
        msg.contains("expected step \"park\"") && msg.contains("step \"use\""),
        "{msg}"
    );
    kit.assert_failed(id, "bad input");
    kit.assert_awaiting(w, ["go"]).assert_step("use");
}

#[tokio::test]
async fn the_kit_asserts_by_key() {
    let mut kit = kit();
    let id = kit
        .insert::<Waiter>(S::default())
        .correlation_key("order:7")
        .await
        .unwrap();
    kit.run_until_idle().await;
    kit.assert_awaiting(Key("order:7"), ["go"])
        .assert_step("use");
    kit.signal(Key("order:7"), "go", json!({ "v": 1 }))
        .await
        .unwrap();
    kit.run_until_idle().await;
    // Finished and the key freed: found as the newest row inserted with it.
    let done = kit.assert_done(
        Key("order:7"),
        json!({ "v": 1, "attempt": 0, "awaited": 1 }),
    );
    assert_eq!(done.id, id);
    kit.assert_status(Key("order:7"), Status::Done);
    let msg = panic_message(|| {
        kit.assert_done(Key("order:8"), json!(null));
    });
    assert!(
        msg.contains("no instance in this TestKit has the key \"order:8\""),
        "{msg}"
    );
}

/// Schedules on the virtual clock: nothing before the first fire time, one instance per
/// fire time as the clock passes each, keyed as the engine keys them; after a jump over
/// ten fire times, the default catch-up (`RunOnce`) inserts one, for the newest.
#[tokio::test]
async fn the_kit_fires_schedules_on_its_virtual_clock() {
    use chrono::{TimeZone, Utc};
    use gen_durable::{fire_key, Schedule};

    let at = |m: u32| Utc.with_ymd_and_hms(2026, 1, 1, 0, m, 0).unwrap();
    let tick =
        Schedule::cron("tick", "* * * * *", |_| Entry::<Counter>::new(S::default())).unwrap();
    let mut kit = kit()
        .with_start_time(at(0) + chrono::Duration::seconds(30))
        .schedule(tick);
    kit.run_until_idle().await;
    assert!(kit.instances().is_empty(), "no fire time has come");
    for _ in 0..3 {
        kit.advance(Duration::from_secs(60));
        kit.run_until_idle().await;
    }
    kit.advance(Duration::from_secs(600));
    kit.run_until_idle().await;
    let keys: Vec<_> = kit
        .instances()
        .into_iter()
        .map(|i| i.unique_key.expect("keyed"))
        .collect();
    let expected: Vec<_> = [1, 2, 3, 13]
        .iter()
        .map(|m| fire_key("tick", at(*m)))
        .collect();
    assert_eq!(keys, expected);
    let skipped: Vec<_> = kit
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::ScheduleSkipped { count, .. } => Some(*count),
            _ => None,
        })
        .collect();
    assert_eq!(skipped, vec![9], "00:04 to 00:12 left out");
}

#[tokio::test]
async fn the_kit_emits_step_stop_with_the_committed_kind() {
    let mut kit = kit();
    let id = kit
        .insert::<Failing>(S::default())
        .step("fails")
        .await
        .unwrap();
    let c = kit.insert::<Counter>(S::default()).await.unwrap();
    kit.run_until_idle().await;
    assert_eq!(
        kit.kinds(id),
        ["done"],
        "handle's outcome is what is reported"
    );
    assert_eq!(kit.kinds(c), ["next", "next", "done"]);
    let steps: Vec<(i64, String)> = kit
        .events()
        .iter()
        .map(|e| match e {
            Event::StepStop { id, step, fsm, .. } => {
                assert!(*fsm == "Failing" || *fsm == "Counter");
                (*id, step.clone())
            }
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(
        steps,
        [
            (id, "fails".into()),
            (c, "a".into()),
            (c, "b".into()),
            (c, "c".into())
        ]
    );
}

#[tokio::test]
async fn ctx_transaction_is_an_error_in_the_kit() {
    let mut kit = kit();
    let id = kit.insert::<Transactional>(S::default()).await.unwrap();
    kit.run_until_idle().await;
    kit.assert_failed(id, "needs the Postgres engine");
}

#[tokio::test]
async fn signals_sent_through_the_sender_are_reported() {
    let mut kit = kit();
    let id = kit.insert::<Waiter>(S::default()).await.unwrap();
    let sender = kit.sender();
    sender.send(id, "go", json!({ "v": 1 }));
    sender.send(id + 99, "go", json!({}));
    kit.run_until_idle().await;
    kit.assert_done(id, json!({ "v": 1, "attempt": 0, "awaited": 1 }));
    assert_eq!(kit.sent().len(), 2);
    assert!(kit.sent()[0].2.as_ref().unwrap().signal_id.is_some());
    assert!(kit.sent()[1].2.is_err());
}

#[tokio::test]
async fn insert_json_checks_like_the_client() {
    let mut kit = kit();
    let id = kit
        .insert_json("Counter", 1, json!({ "n": 1 }))
        .step("b")
        .await
        .unwrap();
    kit.run_until_idle().await;
    kit.assert_done(id, json!({ "total": 111 }));
    assert!(kit.insert_json("Nope", 1, json!({})).await.is_err());
    assert!(kit.insert_json("Counter", 9, json!({})).await.is_err());
    assert!(kit
        .insert_json("Counter", 1, json!({}))
        .step("zz")
        .await
        .is_err());
    assert!(kit
        .insert_json("Counter", 1, json!({ "n": "x" }))
        .await
        .is_err());
}

/// `.migration::<M>()` adds a migration as `EngineBuilder::migration` does: a row of the
/// old version moves to the new one when the kit claims it, if the kit runs the new one.
#[tokio::test]
async fn the_kit_takes_a_migration_from_its_builder() {
    use crate::migrations::{v1, v2};

    let mut kit = kit().migration::<v2::Plan>();
    let old = kit
        .insert::<v1::Plan>(S::n(2))
        .step("legacy")
        .await
        .unwrap();
    kit.run_until_idle().await;
    kit.assert_done(old, json!("v1 legacy ran"));
    assert_eq!(
        kit.instance(old).fsm_version,
        1,
        "v2 is not run: not migrated"
    );

    let mut kit = kit.register::<v2::Plan>();
    let id = kit
        .insert::<v1::Plan>(S::n(2))
        .step("legacy")
        .await
        .unwrap();
    kit.run_until_idle().await;
    kit.assert_done(
        id,
        json!({ "v": 2, "cents": 200, "log": ["1->2"], "awaited": 0 }),
    );
    assert_eq!(kit.instance(id).fsm_version, 2);
}

mod broken {
    use crate::fsms::S;
    use crate::migrations::v1;
    use crate::test_fsm;
    use gen_durable::{Migration, MigrationError, Step};
    use serde_json::json;

    test_fsm!(Plan, state = S, queue = "conf", version = 9, {
        Only => "only" |_ctx| { Ok(Step::done(json!(null))) },
    });

    /// A step map that panics on one old step: an engine refuses to start with it.
    impl Migration for Plan {
        type From = v1::Plan;
        fn migrate_state(old: S) -> Result<S, MigrationError> {
            Ok(old)
        }
        fn migrate_step(old: v1::Plan) -> Self {
            match old {
                v1::Plan::Legacy => panic!("no place for legacy"),
                _ => Plan::Only,
            }
        }
    }
}

/// Where an engine fails to start (`Error::BadMigration`), the kit's run panics.
#[tokio::test]
async fn a_migration_whose_step_map_panics_fails_the_run() {
    let mut kit = kit().register::<broken::Plan>().migration::<broken::Plan>();
    let err = AssertUnwindSafe(kit.run_until_idle())
        .catch_unwind_message()
        .await;
    assert!(
        err.contains("from v1 to v9 is invalid")
            && err.contains("the step map panicked on \"legacy\": no place for legacy"),
        "{err}"
    );
}

fn panic_message(f: impl FnOnce()) -> String {
    let err = std::panic::catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    message(err)
}

fn message(err: Box<dyn std::any::Any + Send>) -> String {
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

trait CatchUnwindMessage {
    async fn catch_unwind_message(self) -> String;
}

impl<F: std::future::Future> CatchUnwindMessage for AssertUnwindSafe<F> {
    async fn catch_unwind_message(self) -> String {
        use futures_util::FutureExt;
        match self.catch_unwind().await {
            Ok(_) => panic!("expected a panic"),
            Err(e) => message(e),
        }
    }
}
