//! Registry and versions: a node claims only what it can run.

mod common;

use std::time::Duration;

use common::{column, eventually, finished, status, Count};
use gen_durable::{Client, Engine, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

mod v1 {
    use super::*;
    test_fsm!(Checkout, state = Count, queue = "co", version = 1, {
        Go => "go" |_ctx| { Ok(Step::done(json!("ran on v1"))) },
    });
}
mod v2 {
    use super::*;
    test_fsm!(Checkout, state = Count, queue = "co", version = 2, {
        Go => "go" |_ctx| { Ok(Step::done(json!("ran on v2"))) },
    });
}

fn q() -> QueueConfig {
    QueueConfig::new(2).with_poll_interval(Duration::from_millis(50))
}

#[tokio::test]
async fn old_rows_run_on_the_old_version_and_unknown_versions_are_left_alone() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let old = gd.insert::<v1::Checkout>(Count::default()).await.unwrap();
    let new = gd.insert::<v2::Checkout>(Count::default()).await.unwrap();

    // A node that only knows v2 runs the new row and never touches the old one.
    let mut only_v2 = Registry::new();
    only_v2.register::<v2::Checkout>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(only_v2)
        .queue_with("co", q())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), new, 10).await, "done");
    assert_eq!(
        column(db.pool(), new, "result").await.as_deref(),
        Some(r#""ran on v2""#)
    );
    let untouched: (String, i64, i32) =
        sqlx::query_as("SELECT status::text, lease_epoch, attempt FROM gd_instances WHERE id = $1")
            .bind(old)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(untouched, ("runnable".to_string(), 0, 0));
    engine.shutdown(Duration::from_secs(5)).await;

    // A node with both keeps the old row running on v1.
    let engine = Engine::builder(db.pool().clone())
        .with_registry(Registry::new())
        .register::<v1::Checkout>()
        .register::<v2::Checkout>()
        .queue_with("co", q())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), old, 10).await, "done");
    assert_eq!(
        column(db.pool(), old, "result").await.as_deref(),
        Some(r#""ran on v1""#)
    );
    let again = gd.insert::<v2::Checkout>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), again, 10).await, "done");
    assert_eq!(
        column(db.pool(), again, "result").await.as_deref(),
        Some(r#""ran on v2""#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_stored_state_that_no_longer_casts_fails_with_a_clear_error() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<v2::Checkout>(Count::default()).await.unwrap();
    sqlx::query(r#"UPDATE gd_instances SET state = '{"n": "not a number"}' WHERE id = $1"#)
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(Registry::new())
        .register::<v2::Checkout>()
        .queue_with("co", q())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "failed");
    let err = column(db.pool(), id, "last_error").await.unwrap();
    assert!(
        err.contains("no longer casts") && err.contains("state.n"),
        "{err}"
    );
    // The row is kept, with its state, for an operator to fix and retry.
    assert_eq!(
        column(db.pool(), id, "state->>'n'").await.as_deref(),
        Some("not a number")
    );
    eventually(1, "engine idle", || async {
        status(db.pool(), id).await == "failed"
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
