//! Leases, heartbeat, reaper and fencing, and the graceful drain.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{column, count, eventually, finished, status, Count, Events};
use gen_durable::{Client, Engine, Event, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;
use tokio::sync::Notify;

/// Gates that tests open to let a step finish.
static RELEASE: std::sync::OnceLock<Arc<Notify>> = std::sync::OnceLock::new();
static STARTED: AtomicUsize = AtomicUsize::new(0);
fn gate() -> Arc<Notify> {
    RELEASE.get_or_init(|| Arc::new(Notify::new())).clone()
}

/// The `log` tags of the `Slow` steps that have started (ids repeat across test databases).
static SLOW_STARTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

test_fsm!(Slow, state = Count, queue = "slow", version = 1, {
    Run => "run" |ctx| {
        SLOW_STARTED.lock().unwrap().extend(ctx.state.log.first().cloned());
        let ms = ctx.state.n as u64;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Step::done(json!({ "attempt": ctx.attempt() })))
    },
});

test_fsm!(Gated, state = Count, queue = "gated", version = 1, {
    Run => "run" |ctx| {
        STARTED.fetch_add(1, Ordering::SeqCst);
        // Write through the step's own transaction: must commit only with the outcome.
        let id = ctx.id();
        let tx = ctx.transaction().await?;
        sqlx::query("INSERT INTO audit(instance) VALUES ($1)").bind(id).execute(&mut **tx).await?;
        gate().notified().await;
        ctx.state.n += 1;
        Ok(Step::done(json!({ "by": ctx.state.n })))
    },
});

test_fsm!(Crasher, state = Count, queue = "crash", version = 1, {
    Run => "run" |_ctx| {
        // Never finishes: the test drops the engine, as a crash would.
        std::future::pending::<()>().await;
        Ok(Step::done(json!(null)))
    },
}, max_reaps = 3);

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Slow>();
    r.register::<Gated>();
    r.register::<Crasher>();
    r
}

fn q(n: usize) -> QueueConfig {
    QueueConfig::new(n).with_poll_interval(Duration::from_millis(50))
}

#[tokio::test]
async fn a_step_three_times_longer_than_the_lease_completes_on_its_first_attempt() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("slow", q(1).with_prefetch(2))
        .with_lease_ttl(Duration::from_millis(300))
        .with_reaper_interval(Duration::from_millis(50))
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    // One 900 ms step (3 × the lease) and two prefetched rows held behind it.
    let long = gd
        .insert::<Slow>(Count {
            n: 900,
            ..Default::default()
        })
        .await
        .unwrap();
    let held: Vec<i64> = {
        let mut v = Vec::new();
        for _ in 0..2 {
            v.push(
                gd.insert::<Slow>(Count {
                    n: 1,
                    ..Default::default()
                })
                .await
                .unwrap(),
            );
        }
        v
    };
    assert_eq!(finished(db.pool(), long, 10).await, "done");
    assert_eq!(
        column(db.pool(), long, "result").await.as_deref(),
        Some(r#"{"attempt": 0}"#)
    );
    for id in held {
        assert_eq!(finished(db.pool(), id, 10).await, "done");
        assert_eq!(
            column(db.pool(), id, "result").await.as_deref(),
            Some(r#"{"attempt": 0}"#),
            "buffered row {id} was reaped"
        );
    }
    assert!(!events
        .all()
        .iter()
        .any(|e| matches!(e, Event::ReaperReaped { .. })));
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_crashed_worker_is_recovered_and_a_crash_loop_ends_failed() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let start = || {
        Engine::builder(db.pool().clone())
            .with_registry(registry())
            .queue_with("crash", q(1))
            .queue_with("slow", q(1))
            .with_lease_ttl(Duration::from_millis(300))
            .with_reaper_interval(Duration::from_millis(50))
            .start()
    };
    // A row claimed by an engine that dies comes back with attempt + 1 and finishes
    // on another engine.
    let slow = gd
        .insert::<Slow>(Count {
            n: 60_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let crashed = start().await.unwrap();
    eventually(10, "claimed", || async {
        status(db.pool(), slow).await == "executing"
    })
    .await;
    drop(crashed);
    sqlx::query("UPDATE gd_instances SET state = '{\"n\": 1}' WHERE id = $1")
        .bind(slow)
        .execute(db.pool())
        .await
        .unwrap();
    let events = Events::default();
    let survivor = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("slow", q(1))
        .with_lease_ttl(Duration::from_millis(300))
        .with_reaper_interval(Duration::from_millis(50))
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), slow, 10).await, "done");
    assert_eq!(
        column(db.pool(), slow, "result").await.as_deref(),
        Some(r#"{"attempt": 1}"#)
    );
    assert!(events
        .all()
        .iter()
        .any(|e| matches!(e, Event::ReaperReaped { ids, .. } if ids.contains(&slow))));
    survivor.shutdown(Duration::from_secs(5)).await;

    // A step that always kills its worker fails after max_reaps (3 here). A separate
    // engine that does not serve the queue runs the reaper.
    let reaper = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("slow", q(1))
        .with_reaper_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let id = gd.insert::<Crasher>(Count::default()).await.unwrap();
    for round in 1..=3 {
        let worker = Engine::builder(db.pool().clone())
            .with_registry(registry())
            .queue_with("crash", q(1))
            .with_reaper(false)
            .start()
            .await
            .unwrap();
        eventually(10, "claimed", || async {
            status(db.pool(), id).await == "executing"
        })
        .await;
        drop(worker);
        // The dead worker's lease runs out (without waiting 30 s for it).
        sqlx::query(
            "UPDATE gd_instances SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
        )
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
        let want = if round < 3 { "runnable" } else { "failed" };
        eventually(10, "reaped", || async {
            status(db.pool(), id).await == want
        })
        .await;
        assert_eq!(
            column(db.pool(), id, "reaps").await.as_deref(),
            Some(round.to_string().as_str())
        );
    }
    let err = column(db.pool(), id, "last_error").await.unwrap();
    assert!(err.contains("lease lost 3 times"), "{err}");
    reaper.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_worker_whose_lease_was_taken_commits_nothing() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE audit (instance bigint NOT NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<Gated>(Count::default()).await.unwrap();
    // A signal in the inbox that the stale worker must not consume.
    gd.signal(id, "note", json!({})).await.unwrap();
    let stale_events = Events::default();
    let stale = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("gated", q(1))
        .with_lease_ttl(Duration::from_secs(30))
        .with_reaper(false)
        .on_event(stale_events.handler())
        .start()
        .await
        .unwrap();
    eventually(10, "stale worker started the step", || async {
        STARTED.load(Ordering::SeqCst) >= 1
    })
    .await;
    let stale_epoch = column(db.pool(), id, "lease_epoch").await.unwrap();

    // The lease is taken away (as a reaper would after a pause), and another worker
    // claims the row under a new epoch and holds it.
    sqlx::query("UPDATE gd_instances SET status = 'runnable', locked_by = NULL, attempt = attempt + 1 WHERE id = $1")
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    let fresh = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("gated", q(1))
        .with_reaper(false)
        .start()
        .await
        .unwrap();
    eventually(10, "fresh worker started the step", || async {
        STARTED.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_ne!(
        column(db.pool(), id, "lease_epoch").await.unwrap(),
        stale_epoch
    );

    // Release only the stale worker: its outcome, state, transaction and consumption
    // must all be refused.
    gate().notify_one();
    eventually(10, "the stale worker reported its lost lease", || async {
        stale_events
            .all()
            .iter()
            .any(|e| matches!(e, Event::LeaseLost { id: i, .. } if *i == id))
    })
    .await;
    assert_eq!(status(db.pool(), id).await, "executing");
    assert_eq!(
        column(db.pool(), id, "state->>'n'").await.as_deref(),
        Some("0")
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM audit").await,
        0,
        "the stale ctx.transaction() rolled back"
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 1);

    // The fresh worker commits: exactly one audit row, state n = 1.
    gate().notify_one();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(count(db.pool(), "SELECT count(*) FROM audit").await, 1);
    assert_eq!(
        column(db.pool(), id, "state->>'n'").await.as_deref(),
        Some("1")
    );
    stale.shutdown(Duration::from_secs(5)).await;
    fresh.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn drain_releases_the_buffer_and_finishes_the_running_step() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let ids = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(
                gd.insert::<Slow>(Count {
                    n: 400,
                    ..Default::default()
                })
                .await
                .unwrap(),
            );
        }
        v
    };
    let events = Events::default();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("slow", q(1).with_prefetch(5))
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    eventually(10, "all four claimed", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'executing'",
        )
        .await
            == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let report = engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        (report.released(), report.in_flight(), report.cancelled()),
        (3, 1, 0)
    );
    let by_status = |s: &'static str| {
        let pool = db.pool().clone();
        let ids = ids.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM gd_instances WHERE status = $1::gd_status AND id = ANY($2)",
            )
            .bind(s)
            .bind(ids)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(by_status("done").await, 1);
    assert_eq!(by_status("runnable").await, 3);
    assert_eq!(by_status("executing").await, 0);
    assert_eq!(
        count(db.pool(), "SELECT max(attempt)::int8 FROM gd_instances").await,
        0,
        "no attempt counted"
    );
    assert!(events.all().iter().any(|e| matches!(
        e,
        Event::SchedulerDrain {
            released: 3,
            in_flight: 1,
            ..
        }
    )));
    db.close().await;
}

#[tokio::test]
async fn drain_past_its_deadline_cancels_and_releases_without_an_attempt() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd
        .insert::<Slow>(Count {
            n: 60_000,
            log: vec!["past-deadline".into()],
        })
        .await
        .unwrap();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("slow", q(1))
        .start()
        .await
        .unwrap();
    // Running, not only claimed: a claim still on its way to the worker is released from
    // the buffer instead.
    eventually(10, "running", || async {
        SLOW_STARTED
            .lock()
            .unwrap()
            .iter()
            .any(|t| t == "past-deadline")
    })
    .await;
    let report = engine.shutdown(Duration::from_millis(100)).await;
    assert_eq!((report.in_flight(), report.cancelled()), (1, 1));
    assert_eq!(status(db.pool(), id).await, "runnable");
    assert_eq!(column(db.pool(), id, "attempt").await.as_deref(), Some("0"));
    db.close().await;
}
