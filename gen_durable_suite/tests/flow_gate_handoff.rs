//! A hand-off of gate slots that fails rolls back with the outcomes it followed, and the
//! committer commits those outcomes again without it: every step runs once, and the rows
//! whose slots were not handed on are claimed by the picker. Two ways to fail: the
//! `gd::handoff` failpoint (in the group commit, in place of its statement of apply and
//! hand-off), and the database refusing the hand-off itself. Its own test binary:
//! failpoints are global to a process, and the two tests here take turns.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{eventually, Count};
use gen_durable::{Client, Engine, Event, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

static RUNS: AtomicUsize = AtomicUsize::new(0);

/// The tests of this binary one at a time: the failpoint and `RUNS` are the process's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

test_fsm!(Once, state = Count, queue = "hot", version = 1, {
    Run => "run" |_ctx| {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(Step::done(json!(null)))
    },
});

/// Runs `k` instances of one key of a gate of K = 4 to their end on an engine of 16
/// workers, and checks that each step ran once, every outcome committed, and no attempt
/// or lease was spent.
async fn drain_one_gate_key(db: &TestDb, k: i64) {
    RUNS.store(0, Ordering::SeqCst);
    let mut registry = Registry::new();
    registry.register::<Once>();
    let gd = Client::new(db.pool().clone()).with_registry(registry.clone());
    gd.set_gate("api", gen_durable::Gate::new(4)).await.unwrap();
    let rows = (0..k).map(|_| gen_durable::Entry::<Once>::new(Count::default()).gate(("api", "k")));
    gd.insert_all::<Once>(rows).await.unwrap();
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
}

#[tokio::test]
async fn a_failed_hand_off_commits_its_outcomes_without_it() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new().await;
    /// Removes the failpoint however the test ends, for the next test of the binary.
    struct Removed;
    impl Drop for Removed {
        fn drop(&mut self) {
            fail::remove("gd::handoff");
        }
    }
    fail::cfg("gd::handoff", "return").unwrap();
    let _removed = Removed;
    drain_one_gate_key(&db, 100).await;
    db.close().await;
}

/// `gd_handoff` replaced, in this test's database, by one that counts its call and raises:
/// the group commit's statement fails whole, its outcomes with it.
const REFUSING_HANDOFF: &str = "
CREATE SEQUENCE handoff_refusals;
CREATE OR REPLACE FUNCTION gd_handoff(p_names text[], p_versions int4[], p_node text,
    p_lease_ms int8, p_now timestamptz, p_ids int8[], p_queues text[], p_gates text[],
    p_keys text[], p_slots int2[])
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb,
    attempt integer, awaits text[], lease_epoch bigint, partition_key text, gate text,
    inbox json, children json, now timestamptz, queue text, gate_slot int2)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('handoff_refusals');
    RAISE EXCEPTION 'the hand-off is refused';
END
$$;";

/// The database refuses every hand-off: each group commit that ended gated rows fails
/// whole (apply and hand-off are one statement) and commits again without the hand-off.
#[tokio::test]
async fn a_hand_off_the_database_refuses_commits_its_outcomes_without_it() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new().await;
    sqlx::raw_sql(REFUSING_HANDOFF)
        .execute(db.pool())
        .await
        .unwrap();
    drain_one_gate_key(&db, 60).await;
    let refusals: i64 = sqlx::query_scalar(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM handoff_refusals",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(refusals >= 1, "the database refused {refusals} hand-offs");
    db.close().await;
}
