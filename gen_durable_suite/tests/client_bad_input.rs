//! Bad input gets a typed error that says what was wrong, and writes nothing.

mod common;

use common::{count, registry, Checkout, Order};
use gen_durable::{Client, Error};
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
