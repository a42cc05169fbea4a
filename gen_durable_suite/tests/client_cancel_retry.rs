//! `Client::cancel` and `Client::retry`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{column, count, eventually, finished, status, Count};
use gen_durable::{Child, Client, Engine, Error, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

static SAW_CANCEL: AtomicBool = AtomicBool::new(false);

test_fsm!(Parked, state = Count, queue = "c", version = 1, {
    Wait => "wait" |_ctx| { Ok(Step::await_signal(["never"], Parked::After)) },
    After => "after" |_ctx| { Ok(Step::done(json!(null))) },
});

test_fsm!(Long, state = Count, queue = "c", version = 1, {
    Run => "run" |ctx| {
        tokio::select! {
            _ = ctx.cancelled() => { SAW_CANCEL.store(true, Ordering::SeqCst); }
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        ctx.state.n += 1;
        Ok(Step::next(Long::Next))
    },
    Next => "next" |_ctx| { Ok(Step::done(json!("should not run"))) },
});

test_fsm!(Fans, state = Count, queue = "c", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Parked>(Count::default()), Child::new::<Parked>(Count::default())], Fans::After))
    },
    After => "after" |_ctx| { Ok(Step::done(json!(null))) },
});

test_fsm!(Flaky, state = Count, queue = "c", version = 1, {
    Run => "run" |ctx| {
        if ctx.state.n == 0 { return Ok(Step::stop("first time fails")); }
        Ok(Step::done(json!({ "attempt": ctx.attempt() })))
    },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Parked>();
    r.register::<Long>();
    r.register::<Fans>();
    r.register::<Flaky>();
    r
}

async fn engine(db: &TestDb) -> Engine {
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "c",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(50)),
        )
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn cancel_a_parked_instance_fails_it_at_once_and_deletes_its_inbox() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Parked>(Count::default()).await.unwrap();
    eventually(10, "parked", || async {
        status(db.pool(), id).await == "awaiting_signal"
    })
    .await;
    gd.signal(id, "other", json!({})).await.unwrap();
    let c = gd.cancel(id).await.unwrap();
    assert_eq!((c.failed, c.after_current_step), (1, 0));
    assert_eq!(status(db.pool(), id).await, "failed");
    assert_eq!(
        column(db.pool(), id, "last_error").await.as_deref(),
        Some("cancelled")
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    // A second cancel, and a cancel of an unknown id, are typed errors.
    assert!(matches!(gd.cancel(id).await, Err(Error::Finished { .. })));
    assert!(matches!(
        gd.cancel(123_456).await,
        Err(Error::NotFound { .. })
    ));
    // A runnable one too.
    let r = gd
        .insert::<Parked>(Count::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    gd.cancel(r).await.unwrap();
    assert_eq!(status(db.pool(), r).await, "failed");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn cancel_a_running_instance_after_its_current_step() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Long>(Count::default()).await.unwrap();
    eventually(10, "running", || async {
        status(db.pool(), id).await == "executing"
    })
    .await;
    let c = gd.cancel(id).await.unwrap();
    assert_eq!((c.failed, c.after_current_step), (0, 1));
    assert_eq!(finished(db.pool(), id, 10).await, "failed");
    assert!(
        SAW_CANCEL.load(Ordering::SeqCst),
        "ctx.cancelled() resolved"
    );
    assert_eq!(
        column(db.pool(), id, "last_error").await.as_deref(),
        Some("cancelled")
    );
    assert_eq!(
        column(db.pool(), id, "step").await.as_deref(),
        Some("run"),
        "the next step never ran"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn cancel_a_parent_cancels_its_live_children() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Fans>(Count::default()).await.unwrap();
    eventually(10, "children parked", || async {
        count(db.pool(), &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {id} AND status = 'awaiting_signal'")).await == 2
    })
    .await;
    let c = gd.cancel(id).await.unwrap();
    assert_eq!(c.failed, 3);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'failed'"
        )
        .await,
        3
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn retry_makes_a_failed_instance_runnable_at_its_step_with_attempt_zero() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Flaky>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "failed");
    assert!(matches!(
        gd.retry(123_456).await,
        Err(Error::NotFound { .. })
    ));
    let running = gd.insert::<Parked>(Count::default()).await.unwrap();
    assert!(matches!(
        gd.retry(running).await,
        Err(Error::WrongStatus { .. })
    ));
    // Fix the data, then retry.
    sqlx::query(r#"UPDATE gd_instances SET state = '{"n": 1}' WHERE id = $1"#)
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    gd.retry(id).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"attempt": 0}"#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
