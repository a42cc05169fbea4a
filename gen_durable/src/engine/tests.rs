//! Each background service's `run_once`, on a real database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gen_durable_testkit::TestDb;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::engine::collector::Collector;
use crate::engine::config::EngineConfig;
use crate::engine::heartbeat::Heartbeat;
use crate::engine::listener::{Heard, Listener};
use crate::engine::reaper::Reaper;
use crate::engine::service::Service;
use crate::engine::shared::{Claims, Db};
use crate::engine::timeouts::Timeouts;
use crate::model::clock::Clock;
use crate::telemetry::{Event, Telemetry};

/// A telemetry that keeps every event.
fn recording() -> (Telemetry, Arc<Mutex<Vec<Event>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut t = Telemetry::default();
    let s = seen.clone();
    t.add(Arc::new(move |e: &Event| s.lock().unwrap().push(e.clone())));
    (t, seen)
}

/// Inserts one row with `set` (a SET list for the UPDATE after the insert); its id.
async fn row(pool: &PgPool, set: &str) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
         VALUES ('F', 1, 's', '{}', 'q') RETURNING id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(&format!("UPDATE gd_instances SET {set} WHERE id = $1"))
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    id
}

async fn status(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT status::text FROM gd_instances WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn each_service_does_one_pass_and_emits_its_event() {
    let tdb = TestDb::new().await;
    let pool = tdb.pool().clone();
    let db = Db::new(pool.clone(), Clock::database(), crate::Pooler::None)
        .await
        .unwrap();
    let cfg = EngineConfig::default();
    let (telemetry, seen) = recording();

    // The reaper: an executing row whose lease expired goes back to runnable.
    let expired = row(
        &pool,
        "status = 'executing', locked_by = 'gone', lease_epoch = 1,
         lease_expires_at = now() - interval '1 second'",
    )
    .await;
    let reaper = Reaper {
        cfg: cfg.reaper.clone(),
        lease_ttl: cfg.heartbeat.lease_ttl,
        db: db.clone(),
        telemetry: telemetry.clone(),
    };
    let reaped = reaper.run_once().await.unwrap();
    assert_eq!(reaped.rows, [(expired, false)]);
    assert_eq!(status(&pool, expired).await, "runnable");
    assert_eq!(reaper.after(reaped), cfg.reaper.interval);

    // The await-timeout sweep: a parked row past its deadline becomes runnable; another,
    // a minute ahead, is the next deadline.
    let late = row(
        &pool,
        "status = 'awaiting_signal', awaits = '{paid}', await_deadline = now() - interval '1 second'",
    )
    .await;
    row(
        &pool,
        "status = 'awaiting_signal', awaits = '{paid}', await_deadline = now() + interval '1 minute'",
    )
    .await;
    let timeouts = Timeouts {
        cfg: cfg.timeouts.clone(),
        db: db.clone(),
        telemetry: telemetry.clone(),
        wake: Arc::new(Notify::new()),
    };
    let swept = timeouts.run_once().await.unwrap();
    assert_eq!(swept.fired, 1);
    assert!(swept.next_in.is_some_and(|d| d > Duration::from_secs(50)));
    assert_eq!(status(&pool, late).await, "runnable");
    assert_eq!(timeouts.after(swept), cfg.timeouts.interval);

    // The collector: a row done for longer than the retention is deleted.
    let old = row(
        &pool,
        "status = 'done', updated_at = now() - interval '8 days'",
    )
    .await;
    let collector = Collector {
        cfg: cfg.collector.clone(),
        db: db.clone(),
        telemetry: telemetry.clone(),
    };
    let collected = collector.run_once().await.unwrap();
    assert_eq!(collected.deleted, 1);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE id = $1")
        .bind(old)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    collector.after(collected);

    // The heartbeat: the lease this node holds is extended, and its cancellation seen.
    let held = row(
        &pool,
        "status = 'executing', locked_by = 'n1', lease_epoch = 3,
         lease_expires_at = now() + interval '1 second', cancel_requested = true",
    )
    .await;
    let claims = Arc::new(Claims::default());
    claims.hold(held, 3, None);
    let token = tokio_util::sync::CancellationToken::new();
    claims.run(held, 3, token.clone());
    let heartbeat = Heartbeat {
        cfg: cfg.heartbeat.clone(),
        db: db.clone(),
        telemetry: telemetry.clone(),
        node_id: "n1".into(),
        claims: claims.clone(),
        queues: vec!["q".into()],
        fsms: vec![("F".into(), 1)],
        steps: serde_json::json!({ "F@1": ["s"] }),
    };
    let beat = heartbeat.run_once().await.unwrap();
    assert_eq!((beat.held, beat.extended), (1, 1));
    assert_eq!(beat.cancelled, [held]);
    assert!(token.is_cancelled());
    let ttl_left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM gd_instances WHERE id = $1",
    )
    .bind(held)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        ttl_left > 20.0,
        "extended to the 30 s lease, {ttl_left} s left"
    );
    heartbeat.after(beat);

    let events = seen.lock().unwrap().clone();
    assert!(events.contains(&Event::ReaperReaped {
        count: 1,
        ids: vec![expired]
    }));
    assert!(events.contains(&Event::AwaitTimedOut { count: 1 }));
    assert!(events.contains(&Event::CollectorDeleted {
        count: 1,
        buckets: 0
    }));
    assert!(events.contains(&Event::LeasesExtended {
        held: 1,
        extended: 1,
        cancelled: vec![held]
    }));
    tdb.close().await;
}

/// A lease that ran out while the database was down (claimed before the server's start and
/// expired before the start plus the TTL: last extended before the outage) goes back to
/// `runnable` without counting toward `max_reaps`; one that expired after the start plus
/// the TTL counts as always, and so does one claimed after the start (a node of a shorter
/// TTL), however early it expired. Every row has `max_reaps = 1`, so a counted reap fails
/// the row.
#[tokio::test]
async fn a_lease_a_restart_of_the_database_took_is_not_counted() {
    let tdb = TestDb::new().await;
    let pool = tdb.pool().clone();
    let db = Db::new(pool.clone(), Clock::database(), crate::Pooler::None)
        .await
        .unwrap();
    let (telemetry, _) = recording();
    let ttl = Duration::from_secs(2);
    // The server started more than 3 s ago (before the test's database was created).
    let up: f64 =
        sqlx::query_scalar("SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(up > 3.0, "PostgreSQL started {up} s ago");
    let outage = row(
        &pool,
        "status = 'executing', locked_by = 'gone', lease_epoch = 1, max_reaps = 1,
         lease_expires_at = pg_postmaster_start_time() + interval '1 second',
         updated_at = pg_postmaster_start_time() - interval '1 second'",
    )
    .await;
    let crash = row(
        &pool,
        "status = 'executing', locked_by = 'gone', lease_epoch = 1, max_reaps = 1,
         lease_expires_at = now() - interval '1 millisecond'",
    )
    .await;
    let short = row(
        &pool,
        "status = 'executing', locked_by = 'gone', lease_epoch = 1, max_reaps = 1,
         lease_expires_at = pg_postmaster_start_time() + interval '1 second',
         updated_at = pg_postmaster_start_time() + interval '500 milliseconds'",
    )
    .await;
    let reaper = Reaper {
        cfg: EngineConfig::default().reaper,
        lease_ttl: ttl,
        db,
        telemetry,
    };
    let reaped = reaper.run_once().await.unwrap();
    let mut rows = reaped.rows;
    rows.sort_unstable();
    assert_eq!(rows, [(outage, false), (crash, true), (short, true)]);
    let (st, reaps, attempt, error): (String, i32, i32, String) = sqlx::query_as(
        "SELECT status::text, reaps, attempt, last_error FROM gd_instances WHERE id = $1",
    )
    .bind(outage)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((st.as_str(), reaps, attempt), ("runnable", 0, 1));
    assert!(error.contains("while the database was down"), "{error}");
    assert_eq!(status(&pool, crash).await, "failed");
    assert_eq!(status(&pool, short).await, "failed");
}

#[tokio::test]
async fn the_listener_wakes_the_queue_a_notification_names() {
    let tdb = TestDb::new().await;
    let pool = tdb.pool().clone();
    let wake = Arc::new(Notify::new());
    let listener = Listener {
        cfg: EngineConfig::default().listener,
        pool: pool.clone(),
        telemetry: Telemetry::default(),
        claims: Arc::new(Claims::default()),
        queues: HashMap::from([("q".to_string(), wake.clone())]),
    };
    let mut conn = listener.connect().await.unwrap();
    sqlx::query("SELECT pg_notify('gd_wake', 'q')")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        listener.run_once(&mut conn).await.unwrap(),
        Heard::Queue("q".into())
    );
    // The picker's wake-up is stored: it resolves at once.
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .expect("the queue was woken");
    sqlx::query("SELECT pg_notify('gd_cancel', '42')")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        listener.run_once(&mut conn).await.unwrap(),
        Heard::Cancel(42)
    );
    drop(conn);
    tdb.close().await;
}

/// The scheduler: a first pass declares the schedule (its first fire time after now, no
/// catch-up on its past); once the clock passes that time, a pass inserts its instance,
/// keyed by schedule and fire time, and moves the row on; a pass while another
/// transaction holds the row skips it.
#[tokio::test]
async fn the_scheduler_declares_then_fires_once_per_fire_time() {
    use chrono::{TimeZone, Utc};

    use crate::engine::scheduler::Scheduler;
    use crate::flow::schedule::{fire_key, CatchUp, Schedule};

    let tdb = TestDb::new().await;
    let pool = tdb.pool().clone();
    let at = |m: u32, s: u32| Utc.with_ymd_and_hms(2026, 1, 1, 0, m, s).unwrap();
    let clock = Clock::manual(at(0, 30));
    let db = Db::new(pool.clone(), clock.clone(), crate::Pooler::None)
        .await
        .unwrap();
    let (telemetry, seen) = recording();
    let scheduler = Scheduler::new(
        vec![Schedule::for_tests(
            "tick",
            "* * * * *",
            CatchUp::RunOnce,
            None,
        )],
        EngineConfig::default().scheduler,
        db,
        telemetry,
    );
    let next = || async {
        sqlx::query_scalar::<_, Option<chrono::DateTime<Utc>>>(
            "SELECT next_fire FROM gd_schedules WHERE name = 'tick'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    let first = scheduler.run_once().await.unwrap();
    assert!(first.fired.is_empty());
    assert_eq!(next().await, Some(at(1, 0)));

    clock.set(at(1, 0));
    let fired = scheduler.run_once().await.unwrap();
    assert_eq!(fired.fired.len(), 1);
    let (name, fire, id) = fired.fired[0].clone();
    assert_eq!((name.as_str(), fire), ("tick", at(1, 0)));
    let key: String = sqlx::query_scalar("SELECT unique_key FROM gd_instances WHERE id = $1")
        .bind(id.expect("inserted"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(key, fire_key("tick", at(1, 0)));
    assert_eq!(next().await, Some(at(2, 0)));
    assert_eq!(scheduler.after(fired), scheduler.cfg.max_wait);
    assert!(seen.lock().unwrap().iter().any(|e| matches!(
        e,
        Event::ScheduleFired { schedule, id: Some(_), .. } if schedule == "tick"
    )));

    // Another transaction holds the row: the pass skips it, inserting nothing.
    clock.set(at(2, 0));
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM gd_schedules WHERE name = 'tick' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    assert!(scheduler.run_once().await.unwrap().fired.is_empty());
    holder.rollback().await.unwrap();
    assert_eq!(scheduler.run_once().await.unwrap().fired.len(), 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_instances")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 2, "one row per fire time");
    tdb.close().await;
}

/// A claimed row's migration is fenced like an outcome: a node whose lease was taken
/// back (reaped, then claimed by another node: a new epoch) writes nothing, so a
/// migration racing a claim elsewhere is committed once, by the lease holder.
#[tokio::test]
async fn a_claimed_rows_migration_is_fenced_by_its_lease() {
    let tdb = TestDb::new().await;
    let pool = tdb.pool().clone();
    let id = row(
        &pool,
        "status = 'executing', locked_by = 'a', lease_epoch = 1, \
         lease_expires_at = now() + interval '1 minute'",
    )
    .await;
    let state = serde_json::json!({"migrated": true});
    let write = |node: &'static str, epoch: i64| {
        let (pool, state) = (pool.clone(), state.clone());
        async move {
            crate::store::pg::migration::migrate_claimed(
                &pool, id, epoch, node, 2, &state, "t", None,
            )
            .await
            .unwrap()
        }
    };
    // Node a's lease was reaped and node b claimed the row (epoch 2).
    sqlx::query("UPDATE gd_instances SET locked_by = 'b', lease_epoch = 2 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!write("a", 1).await, "a stale lease writes nothing");
    let version: i32 = sqlx::query_scalar("SELECT fsm_version FROM gd_instances WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, 1);
    assert!(write("b", 2).await, "the holder's migration is written");
    let (version, step): (i32, String) =
        sqlx::query_as("SELECT fsm_version, step FROM gd_instances WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((version, step.as_str()), (2, "t"));
    // Once the step has ended (the row is no longer executing), a late write is refused too.
    sqlx::query("UPDATE gd_instances SET status = 'runnable', locked_by = NULL WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!write("b", 2).await);
    tdb.close().await;
}
