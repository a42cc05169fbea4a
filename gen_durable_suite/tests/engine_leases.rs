//! Leases, heartbeat, reaper and fencing, and the graceful drain.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::scenario::{int_col, is_terminal, ran, reg, reset_runs, row, runs, serial, wait_until};
use common::{column, count, eventually, finished, status, Count, Events};
use gen_durable::{Client, Engine, Entry, Error, Event, QueueConfig, Registry, Step};
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
        // The dead worker's lease (its batch of the log) runs out (without waiting 30 s).
        sqlx::query(
            "UPDATE gd_batches b SET expires_at = now() - interval '1 s'
               FROM gd_instances i
              WHERE i.id = $1 AND gd_on_batch(i.queue, i.fsm, i.priority, i.ready_seq)
                AND b.lo <= i.ready_seq AND b.hi > i.ready_seq",
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
    // A plain row's fence is its entry in the log.
    let stale_epoch = column(db.pool(), id, "ready_seq").await.unwrap();

    // The lease is taken away (as a reaper would after a pause), and another worker
    // claims the row under a new epoch and holds it.
    // Off its entry: it gets a new one at the end of the log (as a reaper gives it).
    sqlx::query("UPDATE gd_instances SET ready_seq = NULL, attempt = attempt + 1 WHERE id = $1")
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
        column(db.pool(), id, "ready_seq").await.unwrap(),
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
            "SELECT count(*) FROM gd_instances i WHERE gd_status_of(i) = 'executing'",
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

// ---------------------------------------------------------------------------------------
// E20 and E5: leases of a healthy node under a caller's row lock
// ---------------------------------------------------------------------------------------

test_fsm!(E20Work, state = Count, queue = "e20", version = 1, {
    Run => "run" |ctx| {
        ran("E20Work", ctx.id());
        tokio::time::sleep(Duration::from_millis(ctx.state.n as u64)).await;
        Ok(Step::done(json!({ "attempt": ctx.attempt() })))
    },
});

/// E20: lease 1 s, reaper 100 ms, default heartbeat (ttl/3). Row A runs a 6 s step and
/// row B a 2.5 s step on one node; a caller signals A in a transaction it keeps open
/// 1.5 s. One lease loss may cost one rerun, but a stale run that ends must not drop the
/// newer claim's lease: A and B both end `done` with at most 2 runs each.
#[tokio::test]
async fn e20_a_stale_run_does_not_unregister_the_newer_claim() {
    let _serial = serial().await;
    reset_runs("E20Work");
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E20Work>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e20", q(8))
        .with_lease_ttl(Duration::from_secs(1))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let a = gd
        .insert::<E20Work>(Count {
            n: 6000,
            ..Default::default()
        })
        .await
        .unwrap();
    let b = gd
        .insert::<E20Work>(Count {
            n: 2500,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        wait_until(10.0, || async {
            runs("E20Work", a) >= 1 && runs("E20Work", b) >= 1
        })
        .await,
        "both running"
    );
    let mut tx = pool.begin().await.unwrap();
    gd.signal(a, "x", json!({}))
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // the caller's other work
    tx.commit().await.unwrap();
    let settled = wait_until(18.0, || async {
        (is_terminal(&pool, a).await && is_terminal(&pool, b).await)
            || runs("E20Work", a) > 2
            || runs("E20Work", b) > 2
    })
    .await;
    let msg = format!(
        "A {} runs={} | B {} runs={} (settled: {settled})",
        row(&pool, a).await,
        runs("E20Work", a),
        row(&pool, b).await,
        runs("E20Work", b)
    );
    let (sa, sb) = (status(&pool, a).await, status(&pool, b).await);
    drop(engine);
    db.close().await;
    assert!(
        runs("E20Work", a) <= 2 && runs("E20Work", b) <= 2,
        "at most 2 runs each: {msg}"
    );
    assert!(sa == "done" && sb == "done", "A and B end done: {msg}");
}

test_fsm!(E5Work, state = Count, queue = "e5", version = 1, {
    Run => "run" |ctx| {
        ran("E5Work", ctx.id());
        tokio::time::sleep(Duration::from_secs(4)).await;
        Ok(Step::done(json!({ "attempt": ctx.attempt() })))
    },
});

/// E5: a node runs 5 rows with 4 s steps, lease 2 s. A caller holds, for 3 s, a
/// transaction that signalled one of them (locking its row). The node's other 4 leases
/// must keep being extended: those rows are never reaped (reaps 0) and run once.
#[tokio::test]
async fn e5_a_caller_lock_on_one_row_does_not_expire_the_nodes_other_leases() {
    let _serial = serial().await;
    reset_runs("E5Work");
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let ids = gd
        .insert_all::<E5Work>((0..5).map(|_| Entry::new(Count::default())))
        .await
        .unwrap();
    let mut r = Registry::new();
    reg::<E5Work>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e5", q(8))
        .with_lease_ttl(Duration::from_secs(2))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    assert!(
        wait_until(10.0, || async {
            ids.iter().all(|&i| runs("E5Work", i) >= 1)
        })
        .await,
        "all 5 running"
    );
    // The lowest id: the heartbeat reaches it first.
    let locked = ids[0];
    let mut tx = pool.begin().await.unwrap();
    gd.signal(locked, "note", json!({}))
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await; // the caller's other work
    tx.commit().await.unwrap();
    let others = ids[1..].to_vec();
    let settled = wait_until(15.0, || async {
        let mut all = true;
        for &i in &ids {
            all &= is_terminal(&pool, i).await;
        }
        all || others.iter().any(|&i| runs("E5Work", i) > 1)
    })
    .await;
    let mut bad = Vec::new();
    let mut all = Vec::new();
    for &i in &others {
        let d = format!("{} runs={}", row(&pool, i).await, runs("E5Work", i));
        if int_col(&pool, i, "reaps").await != 0
            || runs("E5Work", i) != 1
            || status(&pool, i).await != "done"
        {
            bad.push(d.clone());
        }
        all.push(d);
    }
    let locked_row = row(&pool, locked).await;
    drop(engine);
    db.close().await;
    assert!(
        bad.is_empty(),
        "rows other than the locked one must never be reaped and run once (settled: {settled}): \
         {bad:?}; locked row {locked_row}"
    );
}

// ---------------------------------------------------------------------------------------
// E7: rows the reaper fails keep no signals
// ---------------------------------------------------------------------------------------

test_fsm!(E7Idle, state = Count, queue = "e7", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!(null))) },
});

/// E7: rows of a dead node (executing, locked_by 'dead', at their last reap) expire while
/// senders keep delivering signals to them; the reaper fails them. Afterwards no signal
/// may remain whose target is `done` or `failed`. Ten rounds of 500 rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e7_rows_failed_by_the_reaper_keep_no_signals() {
    let _serial = serial().await;
    let db = TestDb::with_pool_size(16).await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E7Idle>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e7", q(1))
        .with_reaper_interval(Duration::from_millis(10))
        .start()
        .await
        .unwrap();
    let mut report = Vec::new();
    let mut orphans_total = 0;
    for round in 0..10 {
        let ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO gd_instances (fsm, fsm_version, step, status, state, queue, locked_by,
                                       lease_epoch, lease_expires_at, reaps, max_reaps)
             SELECT 'Ghost', 1, 'run', 'executing', '{}', 'ghost', 'dead', 1,
                    now() + interval '300 milliseconds', 0, 1
               FROM generate_series(1, 500)
             RETURNING id",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let mut senders = Vec::new();
        for k in 0..6usize {
            let (gd, ids) = (gd.clone(), ids.clone());
            senders.push(tokio::spawn(async move {
                let mut live: Vec<i64> = ids.iter().copied().skip(k).step_by(6).collect();
                let deadline = Instant::now() + Duration::from_secs(15);
                let mut stored = 0usize;
                while !live.is_empty() && Instant::now() < deadline {
                    let mut still = Vec::with_capacity(live.len());
                    for id in live {
                        match gd.signal(id, "poke", json!({})).await {
                            Ok(_) => {
                                stored += 1;
                                still.push(id);
                            }
                            Err(Error::Finished { .. }) => {}
                            Err(e) => panic!("delivery to {id}: {e}"),
                        }
                    }
                    live = still;
                }
                (stored, live.len())
            }));
        }
        let mut stored = 0;
        let mut left = 0;
        for s in senders {
            let (a, b) = s.await.unwrap();
            stored += a;
            left += b;
        }
        let ids_txt = ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let failed = count(
            &pool,
            &format!("SELECT count(*) FROM gd_instances WHERE status = 'failed' AND id = ANY('{{{ids_txt}}}')"),
        )
        .await;
        let orphans = count(
            &pool,
            &format!(
                "SELECT count(*) FROM gd_signals s JOIN gd_instances i ON i.id = s.target_id
                  WHERE i.status IN ('done', 'failed') AND i.id = ANY('{{{ids_txt}}}')"
            ),
        )
        .await;
        orphans_total += orphans;
        report.push(format!(
            "round {round}: failed {failed}/500, signals stored {stored}, rows never finished {left}, orphans {orphans}"
        ));
    }
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
    assert!(
        report.iter().all(|r| r.contains("failed 500/500")),
        "every dead-node row was failed by the reaper: {report:?}"
    );
    assert_eq!(
        orphans_total, 0,
        "signals left on instances the reaper failed: {report:?}"
    );
}
