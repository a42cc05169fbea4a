//! Partitions: instances sharing a `partition_key` never run steps at the same
//! time across engines and nodes; other keys are not held back; no session lock.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::scenario::{reg, serial, wait_until};
use common::{count, eventually, finished, status, Count, Events};
use gen_durable::{Client, Engine, Entry, Event, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

/// Every step's (key, start, end), across engines.
static SPANS: Mutex<Vec<(String, Instant, Instant)>> = Mutex::new(Vec::new());

test_fsm!(Keyed, state = Count, queue = "p", version = 1, {
    One => "one" |ctx| {
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(ctx.state.n as u64)).await;
        SPANS.lock().unwrap().push((ctx.state.log[0].clone(), start, Instant::now()));
        Ok(Step::next(Keyed::Two))
    },
    Two => "two" |ctx| {
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(ctx.state.n as u64)).await;
        SPANS.lock().unwrap().push((ctx.state.log[0].clone(), start, Instant::now()));
        Ok(Step::done(json!(null)))
    },
});

test_fsm!(Counter, state = Count, queue = "rmw", version = 1, {
    Bump => "bump" |_ctx| {
        // A read-modify-write with a gap: lost updates if two ran at once.
        let pool = POOL.lock().unwrap().clone().expect("pool set by the test");
        let v: i64 = sqlx::query_scalar("SELECT v FROM counter").fetch_one(&pool).await?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        sqlx::query("UPDATE counter SET v = $1").bind(v + 1).execute(&pool).await?;
        Ok(Step::done(json!(v + 1)))
    },
});

/// The counter's pool, for the read-modify-write step (outside any transaction, on purpose).
static POOL: Mutex<Option<sqlx::PgPool>> = Mutex::new(None);

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Keyed>();
    r.register::<Counter>();
    r
}

fn keyed(key: &str, ms: i64) -> Count {
    Count {
        n: ms,
        log: vec![key.to_string()],
    }
}

fn overlaps(key_filter: Option<&str>) -> Vec<(String, Duration)> {
    let spans = SPANS.lock().unwrap();
    let mut bad = Vec::new();
    for (i, a) in spans.iter().enumerate() {
        for b in spans.iter().skip(i + 1) {
            if a.0 == b.0 && key_filter.is_none_or(|k| k == a.0) && a.1 < b.2 && b.1 < a.2 {
                bad.push((a.0.clone(), a.2.min(b.2) - a.1.max(b.1)));
            }
        }
    }
    bad
}

#[tokio::test]
async fn partitions_serialize_one_key_and_let_other_keys_run() {
    let db = TestDb::new().await;
    *POOL.lock().unwrap() = Some(db.pool().clone());
    sqlx::query("CREATE TABLE counter (v bigint NOT NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("INSERT INTO counter VALUES (0)")
        .execute(db.pool())
        .await
        .unwrap();
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "rmw",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(20)),
        )
        .queue_with(
            "p",
            QueueConfig::new(8).with_poll_interval(Duration::from_millis(20)),
        )
        .on_event(events.handler())
        .start()
        .await
        .unwrap();

    // 4 read-modify-writes of one counter under one key: no lost update.
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(
            gd.insert::<Counter>(Count::default())
                .partition_key("acct:1")
                .await
                .unwrap(),
        );
    }
    for id in &ids {
        assert_eq!(finished(db.pool(), *id, 20).await, "done");
    }
    assert_eq!(count(db.pool(), "SELECT v FROM counter").await, 4);
    assert!(
        events
            .all()
            .iter()
            .any(|e| matches!(e, Event::PartitionContended { .. })),
        "contention was reported"
    );

    // Two different keys run at the same time.
    let a = gd
        .insert::<Keyed>(keyed("k-a", 300))
        .partition_key("k-a")
        .await
        .unwrap();
    let b = gd
        .insert::<Keyed>(keyed("k-b", 300))
        .partition_key("k-b")
        .await
        .unwrap();
    finished(db.pool(), a, 20).await;
    finished(db.pool(), b, 20).await;
    let spans = SPANS.lock().unwrap().clone();
    let sa: Vec<_> = spans.iter().filter(|s| s.0 == "k-a").collect();
    let sb: Vec<_> = spans.iter().filter(|s| s.0 == "k-b").collect();
    assert!(
        sa.iter().any(|x| sb.iter().any(|y| x.1 < y.2 && y.1 < x.2)),
        "the two keys' steps overlapped in time"
    );
    // No attempts burned by handed-back rows.
    assert_eq!(
        count(
            db.pool(),
            "SELECT coalesce(max(attempt), 0)::int8 FROM gd_instances"
        )
        .await,
        0
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn two_engines_on_separate_pools_never_overlap_a_key() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let mut ids = Vec::new();
    for i in 0..200 {
        let key = format!("two-{}", i % 5);
        ids.push(
            gd.insert::<Keyed>(keyed(&key, 2))
                .partition_key(key)
                .await
                .unwrap(),
        );
    }
    let start = |pool: sqlx::PgPool| {
        Engine::builder(pool)
            .with_registry(registry())
            .queue_with(
                "p",
                QueueConfig::new(8)
                    .with_prefetch(4)
                    .with_poll_interval(Duration::from_millis(20)),
            )
            .start()
    };
    let e1 = start(db.new_pool(6).await).await.unwrap();
    let e2 = start(db.new_pool(6).await).await.unwrap();
    for id in &ids {
        assert_eq!(finished(db.pool(), *id, 60).await, "done");
    }
    let bad: Vec<_> = overlaps(None)
        .into_iter()
        .filter(|(k, _)| k.starts_with("two-"))
        .collect();
    assert!(bad.is_empty(), "steps of one key overlapped: {bad:?}");
    assert_eq!(
        count(
            db.pool(),
            "SELECT coalesce(max(attempt), 0)::int8 FROM gd_instances"
        )
        .await,
        0
    );
    e1.shutdown(Duration::from_secs(5)).await;
    e2.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_dead_workers_partition_frees_when_its_lease_is_reaped() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let stuck = gd
        .insert::<Keyed>(keyed("dead-key", 60_000))
        .partition_key("dead-key")
        .await
        .unwrap();
    let cfg = || QueueConfig::new(2).with_poll_interval(Duration::from_millis(20));
    let holder = Engine::builder(db.new_pool(4).await)
        .with_registry(registry())
        .queue_with("p", cfg())
        .with_lease_ttl(Duration::from_millis(500))
        .start()
        .await
        .unwrap();
    eventually(10, "claimed", || async {
        status(db.pool(), stuck).await == "executing"
    })
    .await;
    let next = gd
        .insert::<Keyed>(keyed("dead-key", 1))
        .partition_key("dead-key")
        .await
        .unwrap();
    drop(holder); // dies holding the key
    sqlx::query(r#"UPDATE gd_instances SET state = '{"n": 1, "log": ["dead-key"]}' WHERE id = $1"#)
        .bind(stuck)
        .execute(db.pool())
        .await
        .unwrap();
    let other = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("p", cfg())
        .with_lease_ttl(Duration::from_millis(500))
        .with_reaper_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), next, 20).await, "done");
    assert_eq!(finished(db.pool(), stuck, 20).await, "done");
    let advisory: i64 = count(
        db.pool(),
        // This database's only: a test beside it that migrates its own database holds
        // sqlx's migration lock there (CI failed so).
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .await;
    assert_eq!(advisory, 0, "no advisory lock is ever taken");
    other.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

// ---------------------------------------------------------------------------------------
// E16: a hot partition at the head of a queue runs back to back, not once per poll
// ---------------------------------------------------------------------------------------

test_fsm!(E16Work, state = Count, queue = "e16", version = 1, {
    Run => "run" |_ctx| {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(Step::done(json!(null)))
    },
});

/// E16: 200 rows of one partition key (10 ms steps) ahead of 50 unpartitioned ones,
/// concurrency 10 and a 1 s poll interval. A claim takes one row of the key and hands
/// the rest back; the key's next row must be claimed when its step ends, not at the next
/// poll: at least 100 of the key's rows are done within 6 s (once per poll would be ~6).
#[tokio::test]
async fn e16_a_hot_partition_runs_back_to_back() {
    let _serial = serial().await;
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    gd.insert_all::<E16Work>(
        (0..200).map(|_| Entry::new(Count::default()).partition_key("acct:hot")),
    )
    .await
    .unwrap();
    gd.insert_all::<E16Work>((0..50).map(|_| Entry::new(Count::default())))
        .await
        .unwrap();
    let mut r = Registry::new();
    reg::<E16Work>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with(
            "e16",
            QueueConfig::new(10)
                .with_poll_interval(Duration::from_secs(1))
                .with_max_poll_interval(Duration::from_secs(1)),
        )
        .start()
        .await
        .unwrap();
    let hot_done = || async {
        count(
            &pool,
            "SELECT count(*) FROM gd_instances WHERE partition_key = 'acct:hot' AND status = 'done'",
        )
        .await
    };
    let ok = wait_until(6.0, || async { hot_done().await >= 100 }).await;
    let n = hot_done().await;
    let plain = count(
        &pool,
        "SELECT count(*) FROM gd_instances WHERE partition_key IS NULL AND status = 'done'",
    )
    .await;
    drop(engine);
    db.close().await;
    assert!(ok, "only {n} of the hot key's 200 rows done in 6 s");
    assert_eq!(plain, 50, "the unpartitioned rows are not held back");
}
