//! Bad input gets a typed error that says what was wrong, and writes nothing.

mod common;

use std::time::Duration;

use common::scenario::{assert_typed_err, incompressible};
use common::{count, registry, Checkout, Count, Order};
use gen_durable::{Client, Entry, Error, Status, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

async fn nothing_written(db: &TestDb) {
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
}

#[tokio::test]
async fn insert_json_checks_fsm_version_step_and_state() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());

    match gd
        .insert_json("Checkout", 2, json!({ "order": "forty-two" }))
        .await
    {
        Err(Error::InvalidState(e)) => {
            assert_eq!(e.path, "state.order");
            assert_eq!(e.to_string(), "state.order: expected u64, found string");
        }
        other => panic!("expected InvalidState, got {other:?}"),
    }
    match gd.insert_json("Checkout", 2, json!({ "paid": 3 })).await {
        Err(Error::InvalidState(e)) => assert_eq!(e.path, "state.order", "{e}"),
        other => panic!("expected InvalidState, got {other:?}"),
    }
    match gd.insert_json("Nope", 1, json!({})).await {
        Err(Error::UnknownFsm { name, known }) => {
            assert_eq!(name, "Nope");
            assert!(known.contains("Checkout"));
        }
        other => panic!("expected UnknownFsm, got {other:?}"),
    }
    match gd.insert_json("Checkout", 7, json!({ "order": 1 })).await {
        Err(Error::UnknownVersion {
            version: 7, known, ..
        }) => assert_eq!(known, vec![2]),
        other => panic!("expected UnknownVersion, got {other:?}"),
    }
    match gd
        .insert_json("Checkout", 2, json!({ "order": 1 }))
        .step("teleport")
        .await
    {
        Err(Error::UnknownStep { step, known, .. }) => {
            assert_eq!(step, "teleport");
            assert_eq!(known, vec!["reserve", "ship"]);
        }
        other => panic!("expected UnknownStep, got {other:?}"),
    }
    nothing_written(&db).await;

    // The same call with good input works, and unknown keys are ignored.
    let id = gd
        .insert_json("Checkout", 2, json!({ "order": 1, "extra": true }))
        .step("ship")
        .await
        .unwrap();
    assert!(id > 0);
    db.close().await;
}

#[tokio::test]
async fn typed_insert_rejects_an_unknown_step() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let r = gd.insert::<Checkout>(Order::default()).step("nope").await;
    assert!(matches!(r, Err(Error::UnknownStep { .. })), "{r:?}");
    nothing_written(&db).await;
    db.close().await;
}

#[tokio::test]
async fn signal_names_and_payloads_are_checked() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_max_signal_payload(1024);
    let id = gd.insert::<Checkout>(Order::default()).await.unwrap();

    assert!(matches!(
        gd.signal(id, "", json!({})).await,
        Err(Error::InvalidSignalName { len: 0 })
    ));
    let long = "n".repeat(256);
    assert!(matches!(
        gd.signal(id, long, json!({})).await,
        Err(Error::InvalidSignalName { len: 256 })
    ));
    let big = json!({ "blob": "x".repeat(2000) });
    match gd.signal(id, "ok", big).await {
        Err(Error::PayloadTooLarge { size, limit: 1024 }) => assert!(size > 2000),
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    // 255 bytes is fine.
    gd.signal(id, "n".repeat(255), json!({})).await.unwrap();
    db.close().await;
}

// ---------------------------------------------------------------------------------------
// E8 and other bad input: refused at the call, with a typed error, nothing written
// ---------------------------------------------------------------------------------------

/// E8: a 3,000-byte (incompressible) partition_key is refused at insert with a typed
/// error — awaited, `.execute(..)` and `insert_all` — and no row is written (it would
/// otherwise fail every claim of its queue on the btree size limit).
#[tokio::test]
async fn e8_overlong_partition_key_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let key = incompressible(3000);
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .partition_key(key.clone())
        .await;
    assert_typed_err(&res, "awaited insert with a 3,000-byte partition_key");
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .partition_key(key.clone())
        .execute(db.pool())
        .await;
    assert_typed_err(&res, "insert(..).execute with a 3,000-byte partition_key");
    let res = gd
        .insert_all::<common::Checkout>([Entry::new(Order::default()).partition_key(key)])
        .await;
    assert_typed_err(&res, "insert_all with a 3,000-byte partition_key");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0,
        "no row written"
    );
    db.close().await;
}

/// E8: a 3,000-byte (incompressible) unique_key is refused with a typed error, not the
/// raw "index row size" error; no row is written.
#[tokio::test]
async fn e8_overlong_unique_key_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key(incompressible(3000))
        .await;
    assert_typed_err(&res, "insert with a 3,000-byte unique_key");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

// A one-step FSM whose state holds strings.
test_fsm!(Logged, state = Count, queue = "bad_input", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!(null))) },
});

/// E8/E3 input side: a state holding a NUL character is refused with a typed error
/// (jsonb cannot store it); nothing is written.
#[tokio::test]
async fn e8_state_with_nul_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<Logged>(Count {
            n: 0,
            log: vec!["a\u{0}b".into()],
        })
        .await;
    assert_typed_err(&res, "insert of a state holding NUL");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

/// E8/E3 input side: `.schedule_in(Duration::MAX)` is refused with a typed error (the
/// interval is out of range); nothing is written.
#[tokio::test]
async fn e8_schedule_in_duration_max_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .schedule_in(Duration::MAX)
        .await;
    assert_typed_err(&res, "insert with schedule_in(Duration::MAX)");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

/// E8: a signal with a 3,000-byte (incompressible) dedup_key is refused with a typed
/// error; nothing is stored in gd_signals.
#[tokio::test]
async fn e8_overlong_signal_dedup_key_is_refused() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd
        .insert::<common::Checkout>(Order::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    let res = gd
        .signal(id, "note", json!({}))
        .dedup_key(incompressible(3000))
        .await;
    assert_typed_err(&res, "signal with a 3,000-byte dedup_key");
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    db.close().await;
}

/// E8/E3 input side: a signal payload holding a NUL character is refused with a typed
/// error; nothing is stored.
#[tokio::test]
async fn e8_signal_payload_with_nul_is_refused() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd
        .insert::<common::Checkout>(Order::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    let res = gd.signal(id, "note", json!({ "t": "a\u{0}b" })).await;
    assert_typed_err(&res, "signal whose payload holds NUL");
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    db.close().await;
}

// ---------------------------------------------------------------------------------------
// E2: a unique_scope that misses a live status is refused
// ---------------------------------------------------------------------------------------

/// E2: `.unique_key("k").unique_scope([Runnable])` is refused with a typed error and
/// writes nothing (an instance coming back into such a scope violates unique_guard in
/// the engine's statements). A scope of every non-terminal status, and one of every
/// status, are accepted.
#[tokio::test]
async fn e2_unique_scope_missing_a_live_status_is_refused() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key("k")
        .unique_scope([Status::Runnable])
        .await;
    assert_typed_err(&res, "insert with unique_scope [runnable]");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0,
        "nothing written"
    );
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key("k2")
        .unique_scope(Status::NON_TERMINAL)
        .await;
    assert!(res.is_ok(), "every non-terminal status: {res:?}");
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key("k3")
        .unique_scope([
            Status::Runnable,
            Status::Executing,
            Status::AwaitingSignal,
            Status::AwaitingChildren,
            Status::Done,
            Status::Failed,
        ])
        .await;
    assert!(res.is_ok(), "every status: {res:?}");
    db.close().await;
}
