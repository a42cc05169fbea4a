//! The statement-count test (issue 8): counts the statements the engine sends to
//! Postgres and asserts the cost model of PERFORMANCE.md.
//!
//! - a pick is one statement whatever its size (1 vs 50 rows, each with a signal in
//!   its inbox): inboxes and children come back with the claim, never row by row;
//! - a flush of many `next` outcomes is a constant number of statements (10 vs 200
//!   outcomes committed together): fence, apply, COMMIT;
//! - a signal delivery is one statement.
//!
//! How: sqlx 0.8 emits one `tracing` event (target `sqlx::query`) per statement it
//! executes on a connection whose options log statements. TestDb's pool turns that off,
//! so the engine here runs on a second pool built from the same URL with sqlx's default
//! logging on. A minimal subscriber, installed for the test's thread only
//! (`set_default`, with a current-thread runtime so every task of the engine runs on that
//! thread), records each statement's kind and row count. sqlx does not log the `BEGIN`
//! it sends when a transaction starts (it is queued, then awaited), nor its pool's ping
//! before an acquire; both are round trips, counted in PERFORMANCE.md, not here.

mod common;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, Count};
use gen_durable::{Client, Engine, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Barrier;
use tracing::field::{Field, Visit};
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// One statement seen: its kind (from markers in its text) and the rows it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stmt {
    kind: &'static str,
    rows: u64,
    /// The start of its text, for failure messages.
    text: String,
}

fn classify(sql: &str) -> &'static str {
    let s = sql.trim_start();
    if s.contains("WITH picked AS MATERIALIZED") {
        "claim"
    } else if s.contains("FOR NO KEY UPDATE OF i") && s.contains("AS f(id, epoch)") {
        "fence"
    } else if s.starts_with("WITH o AS") {
        "apply"
    } else if s.contains("INSERT INTO gd_signals") {
        "signal"
    } else if s.contains("INSERT INTO gd_instances") {
        "insert"
    } else if s.contains("gd_nodes") {
        // The node announcement of the heartbeat service (once at start, then per tick).
        "announce"
    } else if s.contains("SET lease_expires_at = coalesce($4") {
        "heartbeat"
    } else if s.starts_with("COMMIT") {
        "commit"
    } else if s.starts_with("BEGIN") {
        "begin"
    } else if s.starts_with("ROLLBACK") {
        "rollback"
    } else if s.starts_with("LISTEN") {
        "listen"
    } else {
        "other"
    }
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Stmt>>>);

impl Recorder {
    fn take(&self) -> Vec<Stmt> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[derive(Default)]
struct Fields {
    summary: String,
    statement: String,
    rows: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_string(),
            "db.statement" => self.statement = value.to_string(),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "rows_returned" {
            self.rows = value;
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if matches!(field.name(), "summary" | "db.statement") {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

impl Subscriber for Recorder {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.target() == "sqlx::query" {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.target() == "sqlx::query"
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let text = if f.statement.trim().is_empty() {
            &f.summary
        } else {
            &f.statement
        };
        self.0.lock().unwrap().push(Stmt {
            kind: classify(text),
            rows: f.rows,
            text: text.trim().chars().take(80).collect(),
        });
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

test_fsm!(Noop, state = Count, queue = "perf", version = 1, {
    Run => "run" |ctx| { Ok(Step::done(json!(ctx.all().len()))) },
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

async fn engine(pool: &PgPool, concurrency: usize) -> Engine {
    Engine::builder(pool.clone())
        .registry(registry())
        .reaper(false)
        .await_timeouts(false)
        .lease_ttl(Duration::from_secs(120))
        .queue_with(
            "perf",
            QueueConfig::new(concurrency).poll_interval(Duration::from_secs(30)),
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
async fn pick_of(k: usize, rec: &Recorder) -> Vec<Stmt> {
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
    let engine = engine(&pool, 64).await;
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
fn a_pick_is_one_statement_whatever_its_size() {
    let rec = Recorder::default();
    let _guard = tracing::subscriber::set_default(rec.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut picks = Vec::new();
        for k in [1usize, 50] {
            let seen = pick_of(k, &rec).await;
            let claims: Vec<(&str, u64)> = seen
                .iter()
                .filter(|s| s.kind == "claim" && s.rows > 0)
                .map(|s| (s.kind, s.rows))
                .collect();
            assert_eq!(
                claims,
                [("claim", k as u64)],
                "{k} rows: one claim statement returns them all: {seen:?}"
            );
            // Nothing reads an inbox, a child or a row apart from the claim; the rest
            // is the outcomes' commit, the listener and the node's background services.
            let others: Vec<&Stmt> = seen
                .iter()
                .filter(|s| {
                    !matches!(
                        s.kind,
                        "claim"
                            | "fence"
                            | "apply"
                            | "commit"
                            | "listen"
                            | "announce"
                            | "heartbeat"
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
/// statements of the flushes (fence, apply, COMMIT) and the outcomes in each.
async fn flush_of(k: usize, rec: &Recorder) -> Vec<Vec<Stmt>> {
    *GATE.lock().unwrap() = Some(Arc::new(Barrier::new(k)));
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let rows: Vec<gen_durable::Entry<Gated>> = (0..k)
        .map(|_| gen_durable::Entry::new(Count::default()))
        .collect();
    gd.insert_all::<Gated>(rows).await.unwrap();
    let pool = logged_pool(&db, 8).await;
    rec.take();
    let engine = engine(&pool, k + 8).await;
    eventually(60, "every instance done", || async {
        done_count(db.pool()).await == k as i64
    })
    .await;
    let seen = rec.take();
    engine.shutdown(Duration::from_secs(5)).await;
    let ok: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gd_instances WHERE status = 'done' AND result = '1' AND step = 'b'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(ok, k as i64);
    pool.close().await;
    db.close().await;
    // Split into flushes: each starts at a fence and runs to its COMMIT.
    let mut flushes: Vec<Vec<Stmt>> = Vec::new();
    let mut open: Option<Vec<Stmt>> = None;
    for s in seen {
        match s.kind {
            "fence" => {
                assert!(open.is_none(), "a fence inside another flush");
                open = Some(vec![s]);
            }
            "apply" => open.as_mut().expect("apply outside a flush").push(s),
            "commit" => {
                let mut f = open.take().expect("commit outside a flush");
                f.push(s);
                flushes.push(f);
            }
            _ => {}
        }
    }
    assert!(open.is_none(), "an unfinished flush");
    flushes
}

#[test]
fn a_flush_of_many_next_outcomes_is_a_constant_number_of_statements() {
    let rec = Recorder::default();
    let _guard = tracing::subscriber::set_default(rec.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut shapes = Vec::new();
        for k in [10usize, 200] {
            let flushes = flush_of(k, &rec).await;
            // Every flush, whatever its size, is fence + apply + COMMIT.
            for f in &flushes {
                let kinds: Vec<&str> = f.iter().map(|s| s.kind).collect();
                assert_eq!(kinds, ["fence", "apply", "commit"], "{k}: {f:?}");
            }
            // The `next` outcomes of the gated steps were committed together, in one
            // flush of k rows (the fence returns one row per outcome it lets through).
            let sizes: Vec<u64> = flushes.iter().map(|f| f[0].rows).collect();
            assert!(
                sizes.contains(&(k as u64)),
                "{k} gated `next` outcomes in one flush; flush sizes {sizes:?}"
            );
            assert_eq!(sizes.iter().sum::<u64>(), 2 * k as u64, "two outcomes each");
            shapes.push(flushes[0].len());
        }
        assert_eq!(shapes[0], shapes[1], "statements per flush, 10 vs 200");
    });
}

#[test]
fn a_signal_delivery_is_one_statement() {
    let rec = Recorder::default();
    let _guard = tracing::subscriber::set_default(rec.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = TestDb::new().await;
        // One connection, so the warm-up below warms the one that is counted.
        let pool = logged_pool(&db, 1).await;
        let gd = Client::new(pool.clone()).with_registry(registry());
        let id = gd.insert::<Noop>(Count::default()).await.unwrap();
        // The first use of a connection looks up the `gd_status` enum (sqlx caches it
        // per connection); warm it, then count.
        gd.signal(id, "warm", json!(0)).await.unwrap();
        for (name, dedup) in [("a", None), ("b", Some("k")), ("b", Some("k"))] {
            rec.take();
            let mut s = gd.signal(id, name, json!({ "x": 1 }));
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
