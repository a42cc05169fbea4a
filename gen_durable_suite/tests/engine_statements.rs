//! The statement-count test: counts the statements the engine sends to
//! Postgres and asserts the cost model of gen_durable_bench/results/PERFORMANCE-log.md.
//!
//! - a pick is one statement whatever its size (1 vs 50 rows, each with a signal in
//!   its inbox): inboxes and children come back with the claim, never row by row;
//! - a flush of many `next` outcomes is a constant number of statements (10 vs 200
//!   outcomes committed together): one, the call of `gd_commit_outcomes`;
//! - a signal delivery is one statement, by id or by correlation key;
//! - an explain is one statement by id, two by key (the key's lookup, then the row);
//! - a drain of one-step instances sends no wake-up (nothing it commits becomes runnable);
//! - a hot gate key's slots are handed on by the commits that free them, not claimed again.
//!
//! How: `gen_durable_testkit::statements::StatementLog` records every statement sqlx
//! logs. TestDb's pool turns logging off, so the engine here runs on a second pool
//! built from the same URL with sqlx's default logging on; the log is installed for the
//! test's thread only (`set_default`, with a current-thread runtime so every task of the
//! engine runs on that thread). The pool's ping before an acquire is not logged: it is
//! a round trip, counted in gen_durable_bench/results/PERFORMANCE-log.md, not here. Outcomes per flush come from the
//! engine's `commit.stop` events.

mod common;

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, Count};
use gen_durable::{Client, Engine, Event, QueueConfig, Registry, Step, Target};
use gen_durable_testkit::statements::{Statement, StatementLog};
use gen_durable_testkit::TestDb;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Barrier;

test_fsm!(Noop, state = Count, queue = "perf", version = 1, {
    Run => "run" |ctx| { Ok(Step::done(json!(ctx.inbox().len()))) },
});

/// The barrier every `A` step waits on, so that all of them finish together and their
/// outcomes reach the group committer at once.
static GATE: Mutex<Option<Arc<Barrier>>> = Mutex::new(None);

test_fsm!(Gated, state = Count, queue = "perf", version = 1, {
    A => "a" |ctx| {
        let gate = GATE.lock().unwrap().clone().expect("gate set");
        gate.wait().await;
        ctx.state.n += 1;
        Ok(Step::next(Gated::B))
    },
    B => "b" |ctx| { Ok(Step::done(json!(ctx.state.n))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Noop>();
    r.register::<Gated>();
    r
}

/// Runs `test` on a current-thread runtime with a statement log installed for this
/// thread only, so every task of the engine it starts is counted.
fn counted<F, Fut>(test: F)
where
    F: FnOnce(StatementLog) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let rec = StatementLog::new();
    let _guard = tracing::subscriber::set_default(rec.clone());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test(rec));
}

/// A pool on the test's database whose statements sqlx logs (its default).
async fn logged_pool(db: &TestDb, size: u32) -> PgPool {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| gen_durable_testkit::pg::DEFAULT_DATABASE_URL.to_string());
    let opts = PgConnectOptions::from_str(&url)
        .expect("DATABASE_URL")
        .database(db.name());
    PgPoolOptions::new()
        .max_connections(size)
        .connect_with(opts)
        .await
        .expect("logged pool")
}

/// The sizes of the group commits, from `commit.stop` events: (outcomes, committed).
type Commits = Arc<Mutex<Vec<(usize, usize)>>>;

async fn engine(pool: &PgPool, concurrency: usize, commits: &Commits) -> Engine {
    let commits = commits.clone();
    Engine::builder(pool.clone())
        .on_event(move |e| {
            if let Event::CommitStop {
                count, committed, ..
            } = e
            {
                commits.lock().unwrap().push((*count, *committed));
            }
        })
        .with_registry(registry())
        .with_reaper(false)
        .with_await_timeouts(false)
        .with_lease_ttl(Duration::from_secs(120))
        .queue_with(
            "perf",
            QueueConfig::new(concurrency).with_poll_interval(Duration::from_secs(30)),
        )
        .start()
        .await
        .unwrap()
}

async fn done_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE status = 'done'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Runs `k` one-step instances, each with one signal in its inbox, through an engine
/// that picks them all at once; returns the statements it sent.
async fn pick_of(k: usize, rec: &StatementLog) -> Vec<Statement> {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let mut ids = Vec::new();
    for i in 0..k {
        let id = gd
            .insert::<Noop>(Count {
                n: i as i64,
                ..Default::default()
            })
            .await
            .unwrap();
        gd.signal(id, "hello", json!({ "i": i })).await.unwrap();
        ids.push(id);
    }
    let pool = logged_pool(&db, 8).await;
    rec.take();
    let engine = engine(&pool, 64, &Commits::default()).await;
    eventually(30, "every instance done", || async {
        done_count(db.pool()).await == k as i64
    })
    .await;
    let seen = rec.take();
    engine.shutdown(Duration::from_secs(5)).await;
    // Each instance saw its one signal, loaded with the claim.
    let ok: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE result = '1'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(ok, k as i64, "every step saw its inbox");
    pool.close().await;
    db.close().await;
    seen
}

#[test]
fn a_pick_is_two_statements_whatever_its_size() {
    counted(|rec| async move {
        let mut picks = Vec::new();
        for k in [1usize, 50] {
            let seen = pick_of(k, &rec).await;
            let claims: Vec<(&str, u64)> = seen
                .iter()
                .filter(|s| s.kind == "claim" && s.rows_returned > 0)
                .map(|s| (s.kind, s.rows_returned))
                .collect();
            assert_eq!(
                claims,
                [("claim", k as u64)],
                "{k} rows: one claim statement returns them all: {seen:?}"
            );
            let advances: Vec<u64> = seen
                .iter()
                .filter(|s| s.kind == "advance" && s.rows_returned > 0)
                .map(|s| s.rows_returned)
                .collect();
            assert_eq!(
                advances,
                [1],
                "{k} rows: before it, one statement takes their range of the log: {seen:?}"
            );
            // Nothing reads an inbox, a child or a row apart from the claim; the rest
            // is the outcomes' commit, the listener and the node's background services
            // (the start keeps the history's partitions, as the collector does).
            let others: Vec<&Statement> = seen
                .iter()
                .filter(|s| {
                    !matches!(
                        s.kind,
                        "advance"
                            | "claim"
                            | "apply"
                            | "listen"
                            | "announce"
                            | "setup"
                            | "heartbeat"
                            | "collect"
                    )
                })
                .collect();
            assert!(
                others.is_empty(),
                "{k} rows: unexpected statements {others:?}"
            );
            picks.push(claims.len());
        }
        assert_eq!(picks[0], picks[1], "statements per pick, 1 vs 50 rows");
    });
}

/// Runs `k` two-step instances whose first steps finish together; returns the
/// statements the engine sent and the sizes of its group commits.
async fn flush_of(k: usize, rec: &StatementLog) -> (Vec<Statement>, Vec<(usize, usize)>) {
    *GATE.lock().unwrap() = Some(Arc::new(Barrier::new(k)));
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let rows: Vec<gen_durable::Entry<Gated>> = (0..k)
        .map(|_| gen_durable::Entry::new(Count::default()))
        .collect();
    gd.insert_all::<Gated>(rows).await.unwrap();
    let pool = logged_pool(&db, 8).await;
    rec.take();
    let commits = Commits::default();
    let engine = engine(&pool, k + 8, &commits).await;
    eventually(60, "every instance done", || async {
        done_count(db.pool()).await == k as i64
    })
    .await;
    // After the shutdown: a statement is logged once it returns, which may be after
    // another connection already sees what it committed.
    engine.shutdown(Duration::from_secs(5)).await;
    let seen = rec.take();
    let ok: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gd_instances WHERE status = 'done' AND result = '1' AND step = 'b'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(ok, k as i64);
    pool.close().await;
    db.close().await;
    let commits = std::mem::take(&mut *commits.lock().unwrap());
    (seen, commits)
}

#[test]
fn a_flush_of_many_next_outcomes_is_a_constant_number_of_statements() {
    counted(|rec| async move {
        for k in [10usize, 200] {
            let (seen, commits) = flush_of(k, &rec).await;
            // Every flush, whatever its size, is one statement: no fence of its own, no
            // BEGIN or COMMIT (it commits by itself).
            let flush: Vec<&str> = seen
                .iter()
                .map(|s| s.kind)
                .filter(|k| matches!(*k, "apply" | "fence" | "begin" | "commit" | "rollback"))
                .collect();
            assert!(
                flush.iter().all(|k| *k == "apply"),
                "{k}: only the apply: {flush:?}"
            );
            assert_eq!(flush.len(), commits.len(), "{k}: one statement per commit");
            // The `next` outcomes of the gated steps were committed together, in one
            // flush of k rows, and every outcome was committed.
            let sizes: Vec<usize> = commits.iter().map(|c| c.0).collect();
            assert!(
                sizes.contains(&k),
                "{k} gated `next` outcomes in one flush; flush sizes {sizes:?}"
            );
            assert_eq!(sizes.iter().sum::<usize>(), 2 * k, "two outcomes each");
            assert!(
                commits.iter().all(|(n, c)| n == c),
                "all fenced in: {commits:?}"
            );
        }
    });
}

#[test]
fn a_signal_delivery_is_one_statement() {
    counted(|rec| async move {
        let db = TestDb::new().await;
        // One connection, so the warm-up below warms the one that is counted.
        let pool = logged_pool(&db, 1).await;
        let gd = Client::new(pool.clone()).with_registry(registry());
        let id = gd
            .insert::<Noop>(Count::default())
            .correlation_key("order:1")
            .await
            .unwrap();
        // The first use of a connection looks up the `gd_status` enum (sqlx caches it
        // per connection); warm it, then count.
        gd.signal(id, "warm", json!(0)).await.unwrap();
        // By id and by key alike: resolving the key is part of the one statement.
        let by_key = || Target::Key("order:1".into());
        for (to, name, dedup) in [
            (Target::Id(id), "a", None),
            (Target::Id(id), "b", Some("k")),
            (Target::Id(id), "b", Some("k")),
            (by_key(), "c", None),
            (by_key(), "d", Some("k2")),
            (by_key(), "d", Some("k2")),
        ] {
            rec.take();
            let mut s = gd.signal(to, name, json!({ "x": 1 }));
            if let Some(k) = dedup {
                s = s.dedup_key(k);
            }
            s.await.unwrap();
            let seen = rec.take();
            assert_eq!(
                seen.iter().map(|s| s.kind).collect::<Vec<_>>(),
                ["signal"],
                "one statement per delivery (dedup {dedup:?}): {seen:?}"
            );
        }
        pool.close().await;
        db.close().await;
    });
}

#[test]
fn an_explain_is_one_statement_by_id_and_two_by_key() {
    counted(|rec| async move {
        let db = TestDb::new().await;
        let pool = logged_pool(&db, 1).await;
        let gd = Client::new(pool.clone()).with_registry(registry());
        let id = gd
            .insert::<Noop>(Count::default())
            .correlation_key("order:1")
            .await
            .unwrap();
        // Warm the connection (sqlx's type lookups), then count.
        gd.explain(id).await.unwrap();
        for (to, want) in [
            (Target::Id(id), &["explain"][..]),
            (Target::Key("order:1".into()), &["wait", "explain"][..]),
        ] {
            rec.take();
            gd.explain(to.clone()).await.unwrap();
            let seen = rec.take();
            assert_eq!(
                seen.iter().map(|s| s.kind).collect::<Vec<_>>(),
                want,
                "{to}: {seen:?}"
            );
        }
        pool.close().await;
        db.close().await;
    });
}

/// Runs `k` one-step instances through an engine of `concurrency`, the rows inserted by
/// `insert`; returns the statements the engine sent from its start to its shutdown.
async fn drain_of<F, Fut>(
    k: usize,
    concurrency: usize,
    rec: &StatementLog,
    insert: F,
) -> Vec<Statement>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let db = TestDb::new().await;
    insert(Client::new(db.pool().clone()).with_registry(registry())).await;
    let pool = logged_pool(&db, 8).await;
    rec.take();
    let engine = engine(&pool, concurrency, &Commits::default()).await;
    eventually(60, "every instance done", || async {
        done_count(db.pool()).await == k as i64
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    let seen = rec.take();
    pool.close().await;
    db.close().await;
    seen
}

/// A `done` makes nothing runnable, so the commits of a drain wake no queue: no NOTIFY
/// of their own and none sent after them. (Before, every commit within 20 ms of another
/// left a wake-up for the end of the window, and each woke this node's picker for a
/// claim: 30–40 per second of a drain, and with a hot gate key each claim read past the
/// key's whole backlog.)
#[test]
fn a_drain_of_one_step_instances_sends_no_wake_up() {
    counted(|rec| async move {
        let k = 300;
        let seen = drain_of(k, 8, &rec, |gd| async move {
            let rows = (0..k).map(|_| gen_durable::Entry::<Noop>::new(Count::default()));
            gd.insert_all::<Noop>(rows).await.unwrap();
        })
        .await;
        let applies = seen.iter().filter(|s| s.kind == "apply").count();
        assert!(applies > 10, "many commits: {applies}");
        let notifies: Vec<&Statement> = seen.iter().filter(|s| s.kind == "notify").collect();
        assert!(notifies.is_empty(), "{applies} commits sent {notifies:?}");
    });
}

/// Every slot of a hot gate key is handed on inside the commit that frees it: the key's
/// next row is claimed by the group commit's one statement (an `apply` whose rows after
/// its first are the rows handed on; `handoff` in a step's own transaction), so the
/// picker claims the first K rows and, but for the last turns, never again.
#[test]
fn a_hot_gate_keys_slots_are_handed_on_by_the_commits_that_free_them() {
    counted(|rec| async move {
        let k = 200;
        let seen = drain_of(k, 16, &rec, |gd| async move {
            gd.set_gate("hot", gen_durable::Gate::new(4)).await.unwrap();
            let rows = (0..k)
                .map(|_| gen_durable::Entry::<Noop>::new(Count::default()).gate(("hot", "k")));
            gd.insert_all::<Noop>(rows).await.unwrap();
        })
        .await;
        let rows_of = |kind: &str| -> u64 {
            seen.iter()
                .filter(|s| s.kind == kind)
                .map(|s| s.rows_returned)
                .sum()
        };
        let applies = seen.iter().filter(|s| s.kind == "apply").count() as u64;
        let (claimed, handed) = (
            rows_of("claim"),
            rows_of("handoff") + rows_of("apply") - applies,
        );
        assert_eq!(claimed + handed, k as u64, "each row claimed once");
        assert!(
            handed >= k as u64 - 8,
            "{handed} rows handed on, {claimed} claimed"
        );
        let claims = seen
            .iter()
            .filter(|s| s.kind == "claim" && s.rows_returned > 0)
            .count();
        assert!(claims <= 3, "{claims} claims returned rows");
    });
}
