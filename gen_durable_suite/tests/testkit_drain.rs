//! The testkit's Postgres helpers: `drain` runs a database to a standstill through the
//! engine, `fire_timeouts` fires armed await timeouts, `Instance::load_by_key` finds an
//! instance by its correlation key.

mod common;

use std::time::Duration;

use common::Count;
use gen_durable::{Child, Client, Registry, Status, Step};
use gen_durable_testkit::{drain, fire_timeouts, DrainError, Instance, TestDb};
use serde_json::json;

test_fsm!(Parent, state = Count, queue = "d", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Leaf>(Count { n: 1, log: vec![] }), Child::new::<Leaf>(Count { n: 2, log: vec![] })], Parent::Sum))
    },
    Sum => "sum" |ctx| {
        let sum: i64 = ctx.children().iter().map(|c| c.result.as_ref().and_then(|r| r.as_i64()).unwrap_or(0)).sum();
        Ok(Step::done(json!(sum)))
    },
});

test_fsm!(Leaf, state = Count, queue = "d", version = 1, {
    Run => "run" |ctx| { Ok(Step::done(json!(ctx.state.n * 10))) },
});

test_fsm!(Parked, state = Count, queue = "d", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Parked::After).timeout(Duration::from_secs(3600))) },
    After => "after" |ctx| { Ok(Step::done(json!({ "signals": ctx.awaited().len() }))) },
});

/// The order gated steps ran in, by their `n`.
static RAN: std::sync::Mutex<Vec<i64>> = std::sync::Mutex::new(Vec::new());

test_fsm!(Keyed, state = Count, queue = "d", version = 1, {
    Run => "run" |ctx| {
        RAN.lock().unwrap().push(ctx.state.n);
        Ok(Step::done(json!(null)))
    },
});

test_fsm!(Forever, state = Count, queue = "d", version = 1, {
    Spin => "spin" |_ctx| { Ok(Step::next(Forever::Spin)) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Parent>();
    r.register::<Leaf>();
    r.register::<Parked>();
    r.register::<Forever>();
    r.register::<Keyed>();
    r
}

#[tokio::test]
async fn drain_runs_children_scheduled_rows_and_timeouts_and_lookups_work_by_key() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let gd = Client::new(pool.clone()).with_registry(registry());
    gd.insert::<Parent>(Count::default())
        .correlation_key("parent:1")
        .await
        .unwrap();
    let later = gd
        .insert::<Leaf>(Count { n: 7, log: vec![] })
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();

    // A drain of another queue runs nothing of queue "d".
    let other = drain(pool)
        .with_registry(registry())
        .queue("elsewhere")
        .await
        .unwrap();
    assert_eq!(other.steps, 0);
    Instance::load_by_key(pool, "parent:1")
        .await
        .unwrap()
        .unwrap()
        .assert_status(Status::Runnable);

    // Without pulling scheduled rows forward, the scheduled leaf stays.
    let tally = drain(pool)
        .with_registry(registry())
        .queue("d")
        .with_scheduled(false)
        .await
        .unwrap();
    assert_eq!(
        tally.to_string(),
        "{schedule_children: 1, done: 3, steps: 4}"
    );
    Instance::load_by_key(pool, "parent:1")
        .await
        .unwrap()
        .expect("found by key once finished")
        .assert_done(json!(30));
    Instance::load(pool, later)
        .await
        .unwrap()
        .unwrap()
        .assert_status(Status::Runnable);

    // By default it is pulled forward.
    let tally = drain(pool).with_registry(registry()).await.unwrap();
    assert_eq!(tally.done, 1);
    Instance::load(pool, later)
        .await
        .unwrap()
        .unwrap()
        .assert_done(json!(70));

    // An await with an hour's timeout parks; fire_timeouts makes the next drain run it.
    let parked = gd
        .insert::<Parked>(Count::default())
        .correlation_key("parked")
        .await
        .unwrap();
    let tally = drain(pool).with_registry(registry()).await.unwrap();
    assert_eq!(tally.await_, 1);
    Instance::load_by_key(pool, "parked")
        .await
        .unwrap()
        .unwrap()
        .assert_awaiting(["go"]);
    assert_eq!(fire_timeouts(pool).await.unwrap(), 1);
    drain(pool).with_registry(registry()).await.unwrap();
    Instance::load(pool, parked)
        .await
        .unwrap()
        .unwrap()
        .assert_done(json!({ "signals": 0 }));
    assert!(Instance::load_by_key(pool, "nobody")
        .await
        .unwrap()
        .is_none());
    db.close().await;
}

#[tokio::test]
async fn a_drain_that_never_settles_stops_with_a_typed_error() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    gd.insert::<Forever>(Count::default()).await.unwrap();
    let e = drain(db.pool())
        .with_registry(registry())
        .with_max_steps(20)
        .await
        .unwrap_err();
    match &e {
        DrainError::MaxSteps { max: 20, tally } => assert!(tally.next > 20, "{tally}"),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("runaway loop"), "{e}");
    db.close().await;
}

#[tokio::test]
async fn drain_leaves_a_paused_queue_and_runs_it_once_resumed() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let gd = Client::new(pool.clone()).with_registry(registry());
    let id = gd
        .insert::<Leaf>(Count { n: 4, log: vec![] })
        .await
        .unwrap();
    assert!(gd.pause_queue("d", Some("test")).await.unwrap());
    let tally = drain(pool).with_registry(registry()).await.unwrap();
    assert_eq!(tally.steps, 0, "the paused queue's row does not run");
    let i = Instance::load(pool, id).await.unwrap().unwrap();
    i.assert_status(Status::Runnable);
    assert!(gd.resume_queue("d").await.unwrap());
    let tally = drain(pool).with_registry(registry()).await.unwrap();
    assert_eq!(tally.done, 1);
    Instance::load(pool, id)
        .await
        .unwrap()
        .unwrap()
        .assert_done(json!(40));
    db.close().await;
}

/// The drain runs one step at a time in the pick's order, as the in-memory kit does, gate
/// keys included: a gate key's slot freed by a step is not handed to that key's next row
/// ahead of an older row of another key (the engine's hand-off is off for the drain).
#[tokio::test]
async fn drain_runs_gated_rows_of_several_keys_in_the_picks_order() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    gd.set_gate("g", gen_durable::Gate::new(1)).await.unwrap();
    for (n, key) in [(1, "a"), (2, "b"), (3, "a"), (4, "b")] {
        gd.insert::<Keyed>(Count { n, log: vec![] })
            .gate(("g", key))
            .await
            .unwrap();
    }
    let tally = drain(db.pool()).with_registry(registry()).await.unwrap();
    assert_eq!(tally.done, 4);
    assert_eq!(*RAN.lock().unwrap(), [1, 2, 3, 4]);
    db.close().await;
}
