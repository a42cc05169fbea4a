//! A hand-off of gate slots that fails (the `gd::handoff` failpoint, inside the group
//! commit's transaction) rolls back with the outcomes it followed, and the committer
//! commits those outcomes again without it: every step runs once, and the rows whose
//! slots were not handed on are claimed by the picker. Its own test binary: failpoints
//! are global to a process.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{eventually, Count};
use gen_durable::{Client, Engine, Event, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

static RUNS: AtomicUsize = AtomicUsize::new(0);

test_fsm!(Once, state = Count, queue = "hot", version = 1, {
    Run => "run" |_ctx| {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(Step::done(json!(null)))
    },
});

#[tokio::test]
async fn a_failed_hand_off_commits_its_outcomes_without_it() {
    let db = TestDb::new().await;
    let mut registry = Registry::new();
    registry.register::<Once>();
    let gd = Client::new(db.pool().clone()).with_registry(registry.clone());
    gd.set_gate("api", gen_durable::Gate::new(4)).await.unwrap();
    let k = 100;
    let rows = (0..k).map(|_| gen_durable::Entry::<Once>::new(Count::default()).gate(("api", "k")));
    gd.insert_all::<Once>(rows).await.unwrap();
    fail::cfg("gd::handoff", "return").unwrap();
    let failed_commits = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = failed_commits.clone();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry)
        .on_event(move |e| {
            if let Event::CommitStop {
                count, committed, ..
            } = e
            {
                seen.fetch_add(count - committed, Ordering::SeqCst);
            }
        })
        .queue_with(
            "hot",
            QueueConfig::new(16).with_poll_interval(Duration::from_millis(50)),
        )
        .start()
        .await
        .unwrap();
    eventually(60, "every instance done", || async {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE status = 'done'")
                .fetch_one(db.pool())
                .await
                .unwrap();
        done == k
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    fail::remove("gd::handoff");
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        k as usize,
        "each step ran once"
    );
    assert_eq!(
        failed_commits.load(Ordering::SeqCst),
        0,
        "every outcome committed"
    );
    let (attempts, reaps): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(attempt), 0)::int8, coalesce(sum(reaps), 0)::int8 FROM gd_instances",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!((attempts, reaps), (0, 0));
    db.close().await;
}
