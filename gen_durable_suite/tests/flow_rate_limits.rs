//! Rate limits on a running engine: the admitted rate is the declared one (the burst,
//! then one row per token interval) to within 2% over ten seconds, rows that wait for
//! their tokens burn no attempt, and a queue's unlimited rows are not held back by them.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::eventually;
use gen_durable::{Client, Engine, Entry, QueueConfig, RateLimit, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

/// When each step began, by instance.
static STARTS: Mutex<Vec<(i64, Instant)>> = Mutex::new(Vec::new());

test_fsm!(Call, state = common::Count, queue = "rl", version = 1, {
    Go => "go" |ctx| {
        STARTS.lock().unwrap().push((ctx.id(), Instant::now()));
        Ok(Step::done(json!(null)))
    },
});

#[tokio::test]
async fn fifty_a_second_with_a_burst_of_ten_admits_five_hundred_and_ten_in_ten_seconds() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let limit = RateLimit::per(50, Duration::from_secs(1)).burst(10);
    gd.set_rate_limit("api", limit).await.unwrap();
    let rows = (0..1000).map(|_| Entry::<Call>::new(Default::default()).rate_limit("api"));
    let limited = gd.insert_all::<Call>(rows).await.unwrap();
    // Unlimited rows of the same queue, behind the limited ones in the pick's order.
    let free = (0..200).map(|_| Entry::<Call>::new(Default::default()));
    let free = gd.insert_all::<Call>(free).await.unwrap();
    let mut registry = Registry::new();
    registry.register::<Call>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry)
        .queue_with("rl", QueueConfig::new(32).with_prefetch(32))
        .rate_limit("api", limit)
        .start()
        .await
        .unwrap();
    eventually(30, "11 s of admissions", || async {
        STARTS.lock().unwrap().len() >= 200 + 560
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;

    let starts = STARTS.lock().unwrap().clone();
    let is_free = |id: &i64| free.contains(id);
    let first = starts.iter().map(|(_, t)| *t).min().unwrap();
    let limited_starts: Vec<Instant> = starts
        .iter()
        .filter(|(id, _)| !is_free(id))
        .map(|(_, t)| *t)
        .collect();
    let in_ten = limited_starts
        .iter()
        .filter(|t| t.duration_since(first) < Duration::from_secs(10))
        .count() as f64;
    let expected = 50.0 * 10.0 + 10.0;
    eprintln!("limited steps started in the first 10 s: {in_ten} (expected {expected})");
    assert!(
        (in_ten - expected).abs() <= expected * 0.02,
        "{in_ten} limited steps started in the first 10 s, expected {expected} ± 2%"
    );
    // The unlimited rows ran at once, not behind the limited backlog.
    let free_last = starts
        .iter()
        .filter(|(id, _)| is_free(id))
        .map(|(_, t)| t.duration_since(first))
        .max()
        .unwrap();
    assert!(
        free_last < Duration::from_secs(2),
        "the unlimited rows finished {free_last:?} after the first step"
    );
    let attempts: i64 = sqlx::query_scalar(
        "SELECT coalesce(max(attempt), 0)::int8 FROM gd_instances WHERE id = ANY($1)",
    )
    .bind(&limited)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(attempts, 0, "waiting for tokens burns no attempt");
    db.close().await;
}
