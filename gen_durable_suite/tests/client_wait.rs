//! `Client::wait` on real Postgres: woken by an engine of the same process at its commit,
//! by the client's probe for a commit made elsewhere, and answering `Busy` at its deadline.

mod common;
#[path = "common/process.rs"]
mod process;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Count;
use gen_durable::{Client, Engine, Event, Key, QueueConfig, Registry, Settled, Status, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(Waiter, state = Count, queue = "w", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Waiter::Use)) },
    Use => "use" |ctx| { Ok(Step::done(json!({ "v": ctx.awaited()[0].payload()["v"].clone() }))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Waiter>();
    r
}

async fn engine(db: &TestDb) -> Engine {
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "w",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap()
}

/// With a probe tick of a minute (and so no re-read for 40 minutes), only the engine of
/// the same process can wake the waiter: it answers as soon as the step commits.
#[tokio::test]
async fn an_engine_in_the_process_wakes_a_wait_at_its_commit() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone())
        .with_registry(registry())
        .with_wait_tick(Duration::from_secs(60));
    let id = gd
        .insert::<Waiter>(Count::default())
        .correlation_key("order:1")
        .await
        .unwrap();
    let engine = engine(&db).await;

    let parked = gd.wait(id).timeout(Duration::from_secs(20)).await.unwrap();
    assert!(matches!(parked, Settled::Parked { .. }), "{parked:?}");

    let waiting = tokio::spawn({
        let gd = gd.clone();
        async move {
            gd.wait(Key("order:1"))
                .until_terminal()
                .timeout(Duration::from_secs(20))
                .await
        }
    });
    // Whenever the wait registers, before or after the signal: a parked or running row
    // makes it sleep until the commit of `done` wakes it (without that wake-up it would
    // answer `Busy` at its deadline).
    gd.signal(id, "go", json!({ "v": 5 })).await.unwrap();
    let done = waiting.await.unwrap().unwrap();
    assert_eq!(done, Settled::Done(json!({ "v": 5 })));
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// No engine here: another node's commit (an UPDATE on another connection) is seen by
/// the client's probe within a few ticks, well before the first re-read (40 ticks).
#[tokio::test]
async fn the_probe_sees_a_commit_made_elsewhere() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    let started = Instant::now();
    let waiting = tokio::spawn({
        let gd = gd.clone();
        async move { gd.wait(id).timeout(Duration::from_secs(20)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    sqlx::query("UPDATE gd_instances SET status = 'done', result = '{\"by\": \"another node\"}' WHERE id = $1")
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    let done = waiting.await.unwrap().unwrap();
    assert_eq!(done, Settled::Done(json!({ "by": "another node" })));
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "the probe (25 ms) saw it, not the re-read (1 s): {:?}",
        started.elapsed()
    );
    db.close().await;
}

#[tokio::test]
async fn a_wait_past_its_deadline_is_busy_and_a_missing_row_gone() {
    let db = TestDb::new().await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let gd = Client::new(db.pool().clone())
        .with_registry(registry())
        .on_event(move |e| {
            if let Event::WaitStop { id, outcome, .. } = e {
                seen.lock().unwrap().push((*id, *outcome));
            }
        });
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    let started = Instant::now();
    let busy = gd
        .wait(id)
        .timeout(Duration::from_millis(150))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(
        busy,
        Settled::Busy {
            status: Status::Runnable,
            step: "park".into(),
            attempt: 0
        }
    );
    assert_eq!(gd.wait(id + 1).await.unwrap(), Settled::Gone);
    assert!(gd.wait(Key("nobody")).await.is_err());
    assert_eq!(
        *events.lock().unwrap(),
        [(Some(id), "busy"), (Some(id + 1), "gone"), (None, "error")],
        "one wait.stop per wait"
    );
    db.close().await;
}

/// The engine runs in another process (`gd_worker`): this client waits by key, without an
/// engine of its own, and its probe sees the other process's commit.
#[tokio::test]
async fn a_wait_sees_the_commit_of_an_engine_in_another_process() {
    let db = TestDb::new().await;
    gen_durable_suite::fsms::create_audit_table(db.pool())
        .await
        .unwrap();
    let gd = Client::new(db.pool().clone());
    let id = gd
        .insert::<gen_durable_suite::fsms::Waiter>(())
        .correlation_key("remote:1")
        .await
        .unwrap();
    let worker = process::Worker::start(&process::url_of(&db), "remote", &[], None).await;
    let parked = gd
        .wait(Key("remote:1"))
        .timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(parked, Settled::Parked { .. }), "{parked:?}");
    gd.signal(Key("remote:1"), "go", json!({})).await.unwrap();
    let done = gd
        .wait(id)
        .until_terminal()
        .timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(done, Settled::Done(json!({ "awaited": 1 })));
    drop(worker);
    db.close().await;
}
