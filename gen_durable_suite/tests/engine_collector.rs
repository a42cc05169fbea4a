//! The collector: deletes only terminal rows older than the retention, in
//! bounded batches, sparing children of a live parent; several nodes at once do no harm.

mod common;

use std::time::Duration;

use common::{count, eventually, Count};
use gen_durable::{Client, Engine, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(Idle, state = Count, queue = "elsewhere", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!(null))) },
});

async fn rows(db: &TestDb, n: usize, status: &str, age: &str, parent: Option<i64>) -> Vec<i64> {
    let gd = Client::new(db.pool().clone());
    let mut ids = Vec::new();
    for _ in 0..n {
        let id = gd.insert::<Idle>(Count::default()).await.unwrap();
        sqlx::query(&format!(
            "UPDATE gd_instances SET status = '{status}', updated_at = now() - interval '{age}', parent_id = $2 WHERE id = $1"
        ))
        .bind(id)
        .bind(parent)
        .execute(db.pool())
        .await
        .unwrap();
        ids.push(id);
    }
    ids
}

#[tokio::test]
async fn collects_old_terminal_rows_in_batches_and_spares_children_of_live_parents() {
    let db = TestDb::new().await;
    rows(&db, 25, "done", "2 days", None).await;
    rows(&db, 5, "failed", "2 days", None).await;
    let recent = rows(&db, 3, "done", "1 minute", None).await;
    let old_but_live = rows(&db, 2, "runnable", "2 days", None).await;
    let live_parent = rows(&db, 1, "awaiting_children", "2 days", None).await[0];
    let kept_children = rows(&db, 4, "done", "2 days", Some(live_parent)).await;
    let done_parent = rows(&db, 1, "done", "2 days", None).await[0];
    rows(&db, 2, "done", "2 days", Some(done_parent)).await;

    let mut reg = Registry::new();
    reg.register::<Idle>();
    // Two nodes collecting at once, 7 rows per statement.
    let start = || {
        Engine::builder(db.pool().clone())
            .with_registry(reg.clone())
            .queue("nothing-here", 1)
            .with_retention(Duration::from_secs(24 * 3600))
            .with_collector_schedule(Duration::from_millis(30), 7)
            .start()
    };
    let a = start().await.unwrap();
    let b = start().await.unwrap();
    // 25 + 5 + the done parent and its 2 children = 33 collectable rows.
    eventually(20, "old terminal rows collected", || async {
        count(db.pool(), "SELECT count(*) FROM gd_instances").await == 3 + 2 + 1 + 4
    })
    .await;
    for id in recent
        .iter()
        .chain(&old_but_live)
        .chain(&kept_children)
        .chain(std::iter::once(&live_parent))
    {
        assert_eq!(
            count(
                db.pool(),
                &format!("SELECT count(*) FROM gd_instances WHERE id = {id}")
            )
            .await,
            1,
            "row {id} kept"
        );
    }
    a.shutdown(Duration::from_secs(5)).await;
    b.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// Buckets full again are deleted (a missing bucket is a full one); a bucket with tokens
/// reserved, or not yet refilled, is kept.
#[tokio::test]
async fn the_collector_deletes_rate_limit_buckets_once_they_are_full_again() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let fast = gen_durable::RateLimit::per(1_000, Duration::from_secs(1));
    let slow = gen_durable::RateLimit::per(1, Duration::from_secs(3600));
    gd.set_rate_limit("fast", fast).await.unwrap();
    gd.set_rate_limit("slow", slow).await.unwrap();
    // Two buckets, each minted one token short of full: one refills in a millisecond,
    // the other in an hour.
    sqlx::query(
        "INSERT INTO gd_buckets (name, key, tokens, at) VALUES
             ('fast', 'a', 999, now()), ('slow', 'b', 0, now())",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let mut reg = Registry::new();
    reg.register::<Idle>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue("nothing-here", 1)
        .with_collector_schedule(Duration::from_millis(30), 7)
        .start()
        .await
        .unwrap();
    eventually(20, "the full bucket deleted", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_buckets WHERE name = 'fast'",
        )
        .await
            == 0
    })
    .await;
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_buckets WHERE name = 'slow'"
        )
        .await,
        1,
        "a bucket still refilling is kept"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// The collector rolls finished instances up per minute (`gd_minutes`), for the
/// dashboard's charts over hours and days: the minute they finished in, for their queue
/// and for all queues.
#[tokio::test]
async fn the_collector_rolls_up_the_minutes_rows_finished_in() {
    let db = TestDb::new().await;
    // Three done and one failed five minutes ago, in one minute.
    let ids = rows(&db, 4, "done", "5 minutes", None).await;
    sqlx::query(
        "UPDATE gd_instances SET updated_at = date_trunc('minute', now()) - interval '5 minutes',
                                 status = CASE WHEN id = $1 THEN 'failed'::gd_status ELSE status END
          WHERE id = ANY ($2)",
    )
    .bind(ids[0])
    .bind(&ids)
    .execute(db.pool())
    .await
    .unwrap();
    let mut reg = Registry::new();
    reg.register::<Idle>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue("nothing-here", 1)
        .with_collector_schedule(Duration::from_millis(30), 100)
        .start()
        .await
        .unwrap();
    let rolled = || async {
        sqlx::query_as::<_, (String, i64, i64)>(
            "SELECT queue, done, failed FROM gd_minutes WHERE done + failed > 0 ORDER BY queue",
        )
        .fetch_all(db.pool())
        .await
        .unwrap()
    };
    eventually(10, "the collector rolls the minute up", || async {
        !rolled().await.is_empty()
    })
    .await;
    assert_eq!(
        rolled().await,
        [("*".to_string(), 3, 1), ("elsewhere".to_string(), 3, 1)]
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
