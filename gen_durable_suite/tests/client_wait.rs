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

/// Polls `sql` (a boolean) on `conn` every 5 ms until it holds, or panics after 30 s.
async fn until(conn: &mut sqlx::PgConnection, what: &str, sql: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sqlx::query_scalar::<_, bool>(sql)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
    {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The engine runs in another process (`gd_worker`): this client waits by key, without an
/// engine of its own, and its probe sees the other process's commit — promptly.
///
/// The latency bound. In `gen_durable/src/client/wait.rs`, `DEFAULT_WAIT_TICK` is 25 ms (the
/// probe's `SELECT … WHERE id = ANY($1)` runs once a tick while someone waits) and a
/// waiter re-reads its row every `RECHECK_TICKS` = 40 ticks, 1 s, whatever the probe
/// does. So the worker's last step is held at a lock until the wait is in place and its
/// probe is seen running; the clock starts when the lock is let go and stops when `wait`
/// returns `Done`. What lies between: the worker finishing its step and committing `done`
/// (its own wake-up latency is not included: it is already in the step), at most one
/// tick, the probe's statement, and the wait's re-read of the row — about 30 ms idle.
/// 400 ms leaves room for a loaded 2-core machine, and is well short of the re-read:
/// the wait read its row first before the probe was seen, so its re-read is due almost
/// 1 s after the release. A probe that never ran fails the poll for it; one that ran but
/// woke nobody leaves the answer to the re-read, past both bounds asserted here.
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

    // The worker's step after the signal writes to gd_audit: hold that table, so the
    // step stops there, before its commit.
    let mut gate = db.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE gd_audit IN SHARE MODE")
        .execute(&mut *gate)
        .await
        .unwrap();
    gd.signal(Key("remote:1"), "go", json!({})).await.unwrap();
    // A connection of our own (the client's probe never runs on it) to watch the others.
    let mut watch = db.pool().acquire().await.unwrap();
    until(
        &mut watch,
        "the worker's step to wait on gd_audit",
        "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                         WHERE d.datname = current_database() AND NOT l.granted
                           AND l.relation = 'gd_audit'::regclass)",
    )
    .await;

    // A probe statement started after this was run for this wait (see below).
    let before: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&mut *watch)
        .await
        .unwrap();
    let started = Instant::now();
    let waiting = tokio::spawn({
        let gd = gd.clone();
        async move {
            let done = gd
                .wait(id)
                .until_terminal()
                .timeout(Duration::from_secs(30))
                .await;
            (done, Instant::now())
        }
    });
    // The wait registers before its first read, and the probe runs its statement only
    // while someone is registered. The first wait above ended before `before`, so a probe
    // statement started since then ran for this wait: it is in, and its probe is live.
    until(
        &mut watch,
        "the client's probe to run for this wait",
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                             WHERE datname = current_database() AND pid <> pg_backend_pid()
                               AND query_start > '{before}'::timestamptz
                               AND query LIKE '%FROM gd_instances WHERE id = ANY ($1)%')"
        ),
    )
    .await;
    let released = Instant::now();
    gate.commit().await.unwrap();
    let (done, answered) = waiting.await.unwrap();
    assert_eq!(done.unwrap(), Settled::Done(json!({ "awaited": 1 })));
    let latency = answered - released;
    eprintln!(
        "wait answered {latency:?} after the worker's step was let go ({:?} after the wait began)",
        answered - started
    );
    assert!(
        latency <= Duration::from_millis(400),
        "the probe (25 ms) saw the other process's commit, not the re-read (1 s): {latency:?}"
    );
    assert!(
        answered - started < Duration::from_secs(1),
        "answered before the wait's first re-read was due: {:?}",
        answered - started
    );
    drop(watch);
    drop(worker);
    db.close().await;
}

/// R4B-4: the deadline bounds the wait's reads. With every connection of the pool held,
/// `timeout(200 ms)` returns at about 200 ms, not after the pool's acquire timeout (30 s),
/// with `PoolTimedOut` (no read answered, so there is no status to report as `Busy`).
#[tokio::test]
async fn r4b_4_a_wait_returns_at_its_deadline_when_the_pool_is_busy() {
    let db = TestDb::with_pool_size(3).await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(db.pool().acquire().await.unwrap());
    }
    let started = Instant::now();
    let answer = gd.wait(id).timeout(Duration::from_millis(200)).await;
    let took = started.elapsed();
    assert!(
        matches!(
            answer,
            Err(gen_durable::Error::Database(sqlx::Error::PoolTimedOut))
        ),
        "{answer:?}"
    );
    assert!(took < Duration::from_secs(3), "returned after {took:?}");

    drop(held);
    db.close().await;
}

/// R4B-5: `timeout(Duration::MAX)` means no deadline: the wait answers when the instance
/// settles, where it panicked on an overflow.
#[tokio::test]
async fn r4b_5_a_wait_without_a_deadline_waits_until_the_instance_settles() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    let engine = engine(&db).await;
    let parked = gd.wait(id).timeout(Duration::MAX).await.unwrap();
    assert!(matches!(parked, Settled::Parked { .. }), "{parked:?}");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
