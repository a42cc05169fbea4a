//! `Client::signal` on real Postgres (the sending side).

mod common;

use common::{column, count, Checkout, Order};
use std::future::IntoFuture;

use gen_durable::{Client, Error, Key};
use gen_durable_testkit::TestDb;
use serde_json::json;

async fn parked(db: &TestDb, gd: &Client, awaits: &[&str]) -> i64 {
    let id = gd
        .insert::<Checkout>(Order {
            order: 1,
            paid: None,
        })
        .await
        .unwrap();
    sqlx::query("UPDATE gd_instances SET status = 'awaiting_signal', awaits = $2, step = 'ship' WHERE id = $1")
        .bind(id)
        .bind(awaits.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .execute(db.pool())
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn a_hundred_concurrent_deliveries_of_one_dedup_key_store_one() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = parked(&db, &gd, &["other"]).await;
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let gd = gd.clone();
            tokio::spawn(async move {
                gd.signal(id, "paid", json!({ "try": i }))
                    .dedup_key("evt-7")
                    .await
            })
        })
        .collect();
    let mut stored = 0;
    for t in tasks {
        let d = t.await.unwrap().expect("every delivery succeeds");
        stored += d.signal_id.is_some() as i32;
    }
    assert_eq!(stored, 1);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 1);
    // Without a key, each delivery is stored.
    gd.signal(id, "paid", json!({})).await.unwrap();
    gd.signal(id, "paid", json!({})).await.unwrap();
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 3);
    db.close().await;
}

#[tokio::test]
async fn a_matching_signal_wakes_and_keeps_awaits() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = parked(&db, &gd, &["approve", "reject"]).await;
    let d = gd.signal(id, "reject", json!({"why": "no"})).await.unwrap();
    assert!(d.woke);
    assert_eq!(
        column(db.pool(), id, "status").await.as_deref(),
        Some("runnable")
    );
    assert_eq!(
        column(db.pool(), id, "awaits").await.as_deref(),
        Some("{approve,reject}")
    );
    // The woken instance's queue was notified… and a second matching signal just waits.
    let d = gd.signal(id, "approve", json!({})).await.unwrap();
    assert!(!d.woke);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 2);
    db.close().await;
}

#[tokio::test]
async fn a_non_matching_signal_is_stored_and_leaves_the_instance_parked() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = parked(&db, &gd, &["payment_confirmed"]).await;
    let d = gd.signal(id, "stray", json!(1)).await.unwrap();
    assert!(!d.woke);
    assert!(d.signal_id.is_some());
    assert_eq!(
        column(db.pool(), id, "status").await.as_deref(),
        Some("awaiting_signal")
    );
    // A runnable (not parked) instance also just stores it.
    let other = gd.insert::<Checkout>(Order::default()).await.unwrap();
    let d = gd
        .signal(other, "payment_confirmed", json!(1))
        .await
        .unwrap();
    assert!(!d.woke);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 2);
    db.close().await;
}

#[tokio::test]
async fn a_dedup_redelivery_does_not_wake_again() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = parked(&db, &gd, &["go"]).await;
    assert!(
        gd.signal(id, "go", json!({}))
            .dedup_key("k")
            .await
            .unwrap()
            .woke
    );
    // The step consumed it and parked again on the same name.
    sqlx::query("DELETE FROM gd_signals")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE gd_instances SET status = 'awaiting_signal' WHERE id = $1")
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    // Deleted signals no longer dedup, by design (the key lives with the signal) …
    let d = gd.signal(id, "go", json!({})).dedup_key("k").await.unwrap();
    assert!(d.woke);
    // … but a redelivery of a key still in the inbox neither stores nor wakes.
    sqlx::query("UPDATE gd_instances SET status = 'awaiting_signal' WHERE id = $1")
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    let d = gd.signal(id, "go", json!({})).dedup_key("k").await.unwrap();
    assert_eq!((d.signal_id, d.woke), (None, false));
    assert_eq!(
        column(db.pool(), id, "status").await.as_deref(),
        Some("awaiting_signal")
    );
    db.close().await;
}

#[tokio::test]
async fn unknown_and_finished_targets_store_nothing() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    assert!(matches!(
        gd.signal(999_999, "x", json!({})).await,
        Err(Error::NotFound { id: 999_999 })
    ));
    for status in ["done", "failed"] {
        let id = gd.insert::<Checkout>(Order::default()).await.unwrap();
        sqlx::query(&format!(
            "UPDATE gd_instances SET status = '{status}' WHERE id = $1"
        ))
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
        match gd.signal(id, "x", json!({})).await {
            Err(Error::Finished {
                id: got,
                status: st,
            }) => {
                assert_eq!((got, st.as_str()), (id, status))
            }
            other => panic!("expected Finished, got {other:?}"),
        }
    }
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    db.close().await;
}

/// A signal by key races the holder's end and a new holder's insert, 40 times: it is
/// stored on exactly the row the answer names, or the caller gets an error and nothing
/// is stored — never on a row the caller was not told about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_by_key_racing_a_change_of_holder_lands_on_the_row_it_names() {
    let db = TestDb::with_pool_size(8).await;
    let gd = Client::new(db.pool().clone());
    let order = || Order {
        order: 1,
        paid: None,
    };
    let (mut to_old, mut to_new, mut refused) = (0, 0, 0);
    for round in 0..40 {
        let key = format!("race:{round}");
        let old = gd
            .insert::<Checkout>(order())
            .correlation_key(key.clone())
            .await
            .unwrap();
        let name = format!("note-{round}");
        let end_old = async {
            gd.cancel(old).await.unwrap();
        };
        let insert_new = async {
            loop {
                match gd
                    .insert::<Checkout>(order())
                    .correlation_key(key.clone())
                    .await
                {
                    Ok(id) => return id,
                    Err(Error::Duplicate { .. }) => tokio::task::yield_now().await,
                    Err(e) => panic!("{e}"),
                }
            }
        };
        let send = gd.signal(Key(key.clone()), name.clone(), json!({}));
        let ((), new, sent) = tokio::join!(end_old, insert_new, send.into_future());
        let stored: Vec<i64> =
            sqlx::query_scalar("SELECT target_id FROM gd_signals WHERE name = $1")
                .bind(&name)
                .fetch_all(db.pool())
                .await
                .unwrap();
        match sent {
            // Stored on the old holder before it was cancelled (the cancel deleted its
            // inbox with it), or in the new holder's inbox.
            Ok(d) if d.id == old => {
                assert!(stored.is_empty(), "round {round}: {stored:?}");
                to_old += 1;
            }
            Ok(d) => {
                assert_eq!(d.id, new, "round {round}");
                assert_eq!(stored, [new], "round {round}");
                to_new += 1;
            }
            Err(Error::KeyNotFound { .. }) | Err(Error::Finished { .. }) => {
                assert!(stored.is_empty(), "round {round}: {stored:?}");
                refused += 1;
            }
            Err(e) => panic!("round {round}: {e}"),
        }
    }
    assert_eq!(to_old + to_new + refused, 40);
    eprintln!("to the old holder {to_old}, to the new {to_new}, refused {refused}");
}
