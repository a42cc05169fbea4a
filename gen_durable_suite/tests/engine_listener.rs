//! Where an engine listens for wake-ups: a direct connection of its own options, or none
//! (polling only). Either way every instance runs; only the LISTEN connection differs.

mod common;

use std::time::Duration;

use common::{eventually, finished, status, Count};
use gen_durable::{Client, Engine, QueueConfig, Registry, Step, WakeListener};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(Waiter, state = Count, queue = "l", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Waiter::Use)) },
    Use => "use" |_ctx| { Ok(Step::done(json!("woken"))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Waiter>();
    r
}

/// Sessions of this database sitting on LISTEN.
async fn listening(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap()
}

async fn run_one(db: &TestDb, listener: WakeListener) -> Engine {
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .with_listener(listener)
        .queue_with(
            "l",
            QueueConfig::new(2)
                .with_poll_interval(Duration::from_millis(20))
                .with_max_poll_interval(Duration::from_millis(100)),
        )
        .start()
        .await
        .unwrap();
    eventually(20, "parked", || async {
        status(db.pool(), id).await == "awaiting_signal"
    })
    .await;
    gd.signal(id, "go", json!({})).await.unwrap();
    assert_eq!(finished(db.pool(), id, 20).await, "done");
    engine
}

#[tokio::test]
async fn with_the_listener_off_the_engine_polls_and_never_listens() {
    let db = TestDb::new().await;
    let engine = run_one(&db, WakeListener::Off).await;
    assert_eq!(listening(&db).await, 0, "no LISTEN session");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_direct_listener_listens_on_its_own_options() {
    let db = TestDb::new().await;
    // The listener's options carry an application name of their own, to find it.
    let options = db.options().application_name("gd-direct-listener");
    let engine = run_one(&db, WakeListener::direct(options)).await;
    let direct: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'gd-direct-listener'
            AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(direct, 1, "the LISTEN session is the direct one");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
