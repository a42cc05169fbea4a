//! Regression tests for the audit of the engine's SQL under operators, odd inputs and
//! contention (RELIABILITY.md, "Contention, operators and odd inputs", E1–E20).
//!
//! One test per finding, named after it. Each test states the behaviour the engine must
//! have. Tests that start an engine, or that depend on timing, run one at a time: they
//! take [`serial`] first, so a test with a 1 s lease is not slowed by another test's load
//! on a two-core machine.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{count, Count, Order};
use gen_durable::{Child, Client, Engine, Entry, Error, QueueConfig, Registry, Status, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::Notify;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Engine and timing tests of this file run one at a time.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Runs of each instance, counted outside any transaction: `(fsm tag, id) -> runs`.
fn runs_table() -> &'static Mutex<HashMap<(&'static str, i64), u32>> {
    static RUNS: OnceLock<Mutex<HashMap<(&'static str, i64), u32>>> = OnceLock::new();
    RUNS.get_or_init(Default::default)
}
fn ran(tag: &'static str, id: i64) {
    *runs_table().lock().unwrap().entry((tag, id)).or_default() += 1;
}
fn runs(tag: &'static str, id: i64) -> u32 {
    runs_table()
        .lock()
        .unwrap()
        .get(&(tag, id))
        .copied()
        .unwrap_or(0)
}
fn reset_runs(tag: &'static str) {
    runs_table().lock().unwrap().retain(|(t, _), _| *t != tag);
}

/// Polls `cond` every 10 ms for at most `secs`; true if it held.
async fn wait_until<F, Fut>(secs: f64, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One instance's status, attempt, reaps, children_pending and last_error, for messages.
async fn row(pool: &PgPool, id: i64) -> String {
    let r: Option<(String, i32, i32, i32, Option<String>)> = sqlx::query_as(
        "SELECT status::text, attempt, reaps, children_pending, last_error FROM gd_instances WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .unwrap();
    match r {
        None => format!("#{id}: no row"),
        Some((s, a, r, c, e)) => {
            format!("#{id}: status={s} attempt={a} reaps={r} children_pending={c} last_error={e:?}")
        }
    }
}

async fn status(pool: &PgPool, id: i64) -> String {
    common::status(pool, id).await
}

async fn int_col(pool: &PgPool, id: i64, col: &str) -> i64 {
    common::column(pool, id, col)
        .await
        .and_then(|v| v.parse().ok())
        .unwrap_or(i64::MIN)
}

async fn is_terminal(pool: &PgPool, id: i64) -> bool {
    matches!(status(pool, id).await.as_str(), "done" | "failed")
}

async fn executing_count(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM gd_instances WHERE status = 'executing'",
    )
    .await
}

/// The result must be an error, and a typed one: not the raw database error the
/// unfixed code returns.
#[track_caller]
fn assert_typed_err<T: std::fmt::Debug>(res: &gen_durable::Result<T>, what: &str) {
    match res {
        Ok(v) => panic!("{what}: expected a typed error, got Ok({v:?})"),
        Err(Error::Database(e)) => {
            panic!("{what}: expected a typed error, got a raw database error: {e}")
        }
        Err(_) => {}
    }
}

/// `len` bytes of hex digits from a fixed pseudo-random sequence: a key pglz cannot
/// compress, so it reaches the btree at its full size.
fn incompressible(len: usize) -> String {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        s.push_str(&format!("{z:016x}"));
    }
    s.truncate(len);
    s
}

fn q(n: usize) -> QueueConfig {
    QueueConfig::new(n).with_poll_interval(Duration::from_millis(50))
}

fn reg<F: gen_durable::Fsm>(r: &mut Registry) {
    r.register::<F>();
}

/// A row of a node that died: `executing`, locked by `dead`, its lease expired `ago`.
async fn dead_node_row(pool: &PgPool, reaps: i32, max_reaps: i32) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO gd_instances (fsm, fsm_version, step, status, state, queue, locked_by,
                                   lease_epoch, lease_expires_at, reaps, max_reaps)
         VALUES ('Ghost', 1, 'run', 'executing', '{}', 'ghost', 'dead', 1,
                 now() - interval '1 second', $1, $2)
         RETURNING id",
    )
    .bind(reaps)
    .bind(max_reaps)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Steps that should finish at one moment, so that their outcomes share a group commit.
struct Gather {
    started: AtomicUsize,
    want: AtomicUsize,
    release: Mutex<Option<tokio::time::Instant>>,
}

impl Gather {
    const fn new() -> Self {
        Gather {
            started: AtomicUsize::new(0),
            want: AtomicUsize::new(0),
            release: Mutex::new(None),
        }
    }

    fn reset(&self, want: usize) {
        self.started.store(0, SeqCst);
        self.want.store(want, SeqCst);
        *self.release.lock().unwrap() = None;
    }

    /// Counts this run in, waits (at most `max`) until `want` runs have started, then
    /// sleeps until one shared instant 20 ms later: every waiting step wakes on the same
    /// timer tick and sends its outcome before the committer runs again.
    async fn arrive(&self, max: Duration) {
        self.started.fetch_add(1, SeqCst);
        let deadline = Instant::now() + max;
        while self.started.load(SeqCst) < self.want.load(SeqCst) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let at = *self
            .release
            .lock()
            .unwrap()
            .get_or_insert_with(|| tokio::time::Instant::now() + Duration::from_millis(20));
        tokio::time::sleep_until(at).await;
    }
}

// ---------------------------------------------------------------------------------------
// E3: one outcome the server rejects must not fail its whole group commit
// ---------------------------------------------------------------------------------------

static POISON_GATHER: Gather = Gather::new();

test_fsm!(Poison, state = Count, queue = "poison", version = 1, {
    Run => "run" |ctx| {
        ran("Poison", ctx.id());
        POISON_GATHER.arrive(Duration::from_secs(5)).await;
        match ctx.state.n {
            1 => Ok(Step::replay(Duration::MAX)),
            2 => Ok(Step::await_signal(["x"], Poison::After).timeout(Duration::MAX)),
            3 => Ok(Step::done(json!({ "t": "a\u{0}b" }))),
            4 => {
                ctx.state.log.push("a\u{0}b".into());
                Ok(Step::done(json!("nul in state")))
            }
            _ => Ok(Step::done(json!({ "innocent": true }))),
        }
    },
    After => "after" |_ctx| { Ok(Step::done(json!("woke"))) },
});

/// `innocent` one-step instances and one poison of kind `poison`, all runnable at once
/// (inserted before the engine starts, concurrency 64, lease 1 s): every innocent one
/// is `done` after exactly one run with attempt 0; the poison is `failed` with a
/// `last_error` containing `expect`.
async fn poison_batch(poison: i64, innocent: usize, expect: &str, check_reaps: bool) {
    let _serial = serial().await;
    reset_runs("Poison");
    POISON_GATHER.reset(innocent + 1);
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut entries: Vec<Entry<Poison>> = (0..innocent)
        .map(|_| Entry::new(Count::default()))
        .collect();
    entries.push(Entry::new(Count {
        n: poison,
        ..Default::default()
    }));
    let ids = gd.insert_all::<Poison>(entries).await.unwrap();
    assert_eq!(ids.len(), innocent + 1);
    let (innocents, poison_id) = (ids[..innocent].to_vec(), ids[innocent]);
    let mut r = Registry::new();
    reg::<Poison>(&mut r);
    let events = common::Events::default();
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .on_event(events.handler())
        .queue_with("poison", q(64))
        .with_lease_ttl(Duration::from_secs(1))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    // Until every instance ended, or an innocent one ran twice (the old failure).
    let settled = wait_until(15.0, || {
        let (pool, ids, innocents) = (pool.clone(), ids.clone(), innocents.clone());
        async move {
            let open = count(
                &pool,
                &format!(
                    "SELECT count(*) FROM gd_instances WHERE status NOT IN ('done', 'failed') AND id = ANY('{{{}}}')",
                    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
                ),
            )
            .await;
            open == 0 || innocents.iter().any(|&i| runs("Poison", i) > 1)
        }
    })
    .await;
    let mut bad = Vec::new();
    for &id in &innocents {
        let (st, attempt) = (status(&pool, id).await, int_col(&pool, id, "attempt").await);
        let n = runs("Poison", id);
        if st != "done" || attempt != 0 || n != 1 {
            bad.push(format!("{} runs={n}", row(&pool, id).await));
        }
    }
    let poison_row = row(&pool, poison_id).await;
    let poison_status = status(&pool, poison_id).await;
    let poison_reaps = int_col(&pool, poison_id, "reaps").await;
    let poison_err = common::column(&pool, poison_id, "last_error")
        .await
        .unwrap_or_default();
    let poison_runs = runs("Poison", poison_id);
    let batches: Vec<usize> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            gen_durable::Event::CommitStop { count, .. } => Some(*count),
            _ => None,
        })
        .collect();
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
    assert!(
        bad.is_empty(),
        "{} of {innocent} innocent instances were not done after exactly one run with attempt 0 \
         (settled: {settled}); e.g. {:?}; poison {poison_row} runs={poison_runs}; \
         sizes of the group commits that succeeded: {batches:?}",
        bad.len(),
        &bad[..bad.len().min(3)]
    );
    assert_eq!(
        poison_status, "failed",
        "the poison must be failed: {poison_row}"
    );
    if check_reaps {
        assert_eq!(
            poison_reaps, 0,
            "the poison was failed by its commit, not reaped: {poison_row}"
        );
    }
    assert!(
        poison_err.contains(expect),
        "the poison's last_error must name the cause ({expect:?}): {poison_row}"
    );
}

/// E3: 50 innocent steps and one `Step::replay(Duration::MAX)` land in one group commit.
/// The poison must fail alone (`failed`, reaps 0, "out of range"); the 50 others are
/// `done` after exactly one run, attempt 0.
#[tokio::test]
async fn e3_one_poison_outcome_does_not_fail_its_batch() {
    poison_batch(1, 50, "out of range", true).await;
}

/// E3: as above with `await_signal(..).timeout(Duration::MAX)` as the poison (10 innocent).
#[tokio::test]
async fn e3_poison_await_timeout_does_not_fail_its_batch() {
    poison_batch(2, 10, "out of range", false).await;
}

/// E3: as above with a `done` result holding a NUL character (jsonb rejects `\u0000`).
#[tokio::test]
async fn e3_poison_nul_in_result_does_not_fail_its_batch() {
    poison_batch(3, 10, "NUL", false).await;
}

/// E3: as above with a state holding a NUL character.
#[tokio::test]
async fn e3_poison_nul_in_state_does_not_fail_its_batch() {
    poison_batch(4, 10, "NUL", false).await;
}

// ---------------------------------------------------------------------------------------
// E8 and other bad input: refused at the call, with a typed error, nothing written
// ---------------------------------------------------------------------------------------

/// E8: a 3,000-byte (incompressible) partition_key is refused at insert with a typed
/// error — awaited, `.execute(..)` and `insert_all` — and no row is written (it would
/// otherwise fail every claim of its queue on the btree size limit).
#[tokio::test]
async fn e8_overlong_partition_key_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let key = incompressible(3000);
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .partition_key(key.clone())
        .await;
    assert_typed_err(&res, "awaited insert with a 3,000-byte partition_key");
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .partition_key(key.clone())
        .execute(db.pool())
        .await;
    assert_typed_err(&res, "insert(..).execute with a 3,000-byte partition_key");
    let res = gd
        .insert_all::<common::Checkout>([Entry::new(Order::default()).partition_key(key)])
        .await;
    assert_typed_err(&res, "insert_all with a 3,000-byte partition_key");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0,
        "no row written"
    );
    db.close().await;
}

/// E8: a 3,000-byte (incompressible) unique_key is refused with a typed error, not the
/// raw "index row size" error; no row is written.
#[tokio::test]
async fn e8_overlong_unique_key_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key(incompressible(3000))
        .await;
    assert_typed_err(&res, "insert with a 3,000-byte unique_key");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

/// E8/E3 input side: a state holding a NUL character is refused with a typed error
/// (jsonb cannot store it); nothing is written.
#[tokio::test]
async fn e8_state_with_nul_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<Poison>(Count {
            n: 0,
            log: vec!["a\u{0}b".into()],
        })
        .await;
    assert_typed_err(&res, "insert of a state holding NUL");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

/// E8/E3 input side: `.schedule_in(Duration::MAX)` is refused with a typed error (the
/// interval is out of range); nothing is written.
#[tokio::test]
async fn e8_schedule_in_duration_max_is_refused_at_insert() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .schedule_in(Duration::MAX)
        .await;
    assert_typed_err(&res, "insert with schedule_in(Duration::MAX)");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

/// E8: a signal with a 3,000-byte (incompressible) dedup_key is refused with a typed
/// error; nothing is stored in gd_signals.
#[tokio::test]
async fn e8_overlong_signal_dedup_key_is_refused() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd
        .insert::<common::Checkout>(Order::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    let res = gd
        .signal(id, "note", json!({}))
        .dedup_key(incompressible(3000))
        .await;
    assert_typed_err(&res, "signal with a 3,000-byte dedup_key");
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    db.close().await;
}

/// E8/E3 input side: a signal payload holding a NUL character is refused with a typed
/// error; nothing is stored.
#[tokio::test]
async fn e8_signal_payload_with_nul_is_refused() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd
        .insert::<common::Checkout>(Order::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    let res = gd.signal(id, "note", json!({ "t": "a\u{0}b" })).await;
    assert_typed_err(&res, "signal whose payload holds NUL");
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    db.close().await;
}

// ---------------------------------------------------------------------------------------
// E2: a unique_scope that misses a live status is refused
// ---------------------------------------------------------------------------------------

/// E2: `.unique_key("k").unique_scope([Runnable])` is refused with a typed error and
/// writes nothing (an instance coming back into such a scope violates unique_guard in
/// the engine's statements). A scope of every non-terminal status, and one of every
/// status, are accepted.
#[tokio::test]
async fn e2_unique_scope_missing_a_live_status_is_refused() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key("k")
        .unique_scope([Status::Runnable])
        .await;
    assert_typed_err(&res, "insert with unique_scope [runnable]");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0,
        "nothing written"
    );
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key("k2")
        .unique_scope(Status::NON_TERMINAL)
        .await;
    assert!(res.is_ok(), "every non-terminal status: {res:?}");
    let res = gd
        .insert::<common::Checkout>(Order::default())
        .unique_key("k3")
        .unique_scope([
            Status::Runnable,
            Status::Executing,
            Status::AwaitingSignal,
            Status::AwaitingChildren,
            Status::Done,
            Status::Failed,
        ])
        .await;
    assert!(res.is_ok(), "every status: {res:?}");
    db.close().await;
}

// ---------------------------------------------------------------------------------------
// E1: retrying a failed child re-arms its parent's barrier
// ---------------------------------------------------------------------------------------

static E1_C1_RUNS: AtomicUsize = AtomicUsize::new(0);
static E1_AFTER_RUNS: AtomicUsize = AtomicUsize::new(0);
fn e1_gate() -> &'static Notify {
    static G: OnceLock<Notify> = OnceLock::new();
    G.get_or_init(Notify::new)
}

test_fsm!(E1Kid, state = Count, queue = "e1", version = 1, {
    Run => "run" |ctx| {
        if ctx.state.n == 1 {
            if E1_C1_RUNS.fetch_add(1, SeqCst) == 0 {
                return Ok(Step::stop("c1 fails its first run"));
            }
            // The retried run is held until the test has looked at the parent.
            e1_gate().notified().await;
        }
        Ok(Step::done(json!(ctx.state.n)))
    },
});

test_fsm!(E1Parent, state = Count, queue = "e1", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![
            Child::new::<E1Kid>(Count { n: 1, ..Default::default() }),
            // C2 is held back: not eligible until the test says so.
            Child::new::<E1Kid>(Count { n: 2, ..Default::default() })
                .schedule_in(Duration::from_secs(3600)),
        ], E1Parent::After))
    },
    After => "after" |ctx| {
        E1_AFTER_RUNS.fetch_add(1, SeqCst);
        let seen: Vec<_> = ctx.children().iter()
            .map(|c| json!({ "n": c.state["n"].clone(), "status": c.status.as_str() }))
            .collect();
        Ok(Step::done(json!(seen)))
    },
});

/// E1: parent P waits on C1 and C2; C1 fails; `Client::retry(C1)` must re-count C1 in P
/// (children_pending back to 2, P still awaiting_children), so that P's after-step runs
/// only once both C1 (now succeeding) and C2 have ended; everything ends done and no
/// commit fails on the children_pending check (nothing left executing).
#[tokio::test]
async fn e1_retrying_a_failed_child_rearms_the_parents_barrier() {
    let _serial = serial().await;
    E1_C1_RUNS.store(0, SeqCst);
    E1_AFTER_RUNS.store(0, SeqCst);
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E1Kid>(&mut r);
    reg::<E1Parent>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e1", q(4))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let p = gd.insert::<E1Parent>(Count::default()).await.unwrap();
    let kid = |n: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT id FROM gd_instances WHERE parent_id = $1 AND (state->>'n')::int8 = $2",
            )
            .bind(p)
            .bind(n)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    assert!(
        wait_until(10.0, || async {
            match kid(1).await {
                Some(c1) => {
                    status(&pool, c1).await == "failed"
                        && int_col(&pool, p, "children_pending").await == 1
                }
                None => false,
            }
        })
        .await,
        "C1 failed and P counted it: {}",
        row(&pool, p).await
    );
    let (c1, c2) = (kid(1).await.unwrap(), kid(2).await.unwrap());
    assert_eq!(status(&pool, p).await, "awaiting_children");

    let res = gd.retry(c1).await;
    assert!(res.is_ok(), "retry of the failed child: {res:?}");
    // Right after the retry, C1 counts again in its parent's barrier.
    let (p_status, p_pending) = (
        status(&pool, p).await,
        int_col(&pool, p, "children_pending").await,
    );
    let after_retry = format!("P {} | C1 {}", row(&pool, p).await, row(&pool, c1).await);
    if p_status != "awaiting_children" || p_pending != 2 {
        e1_gate().notify_one();
        drop(engine);
        db.close().await;
        panic!("after retry(C1) the parent must be awaiting_children with children_pending 2: {after_retry}");
    }

    // C1 succeeds on its second run; P still waits for C2.
    e1_gate().notify_one();
    let c1_done = wait_until(10.0, || async { status(&pool, c1).await == "done" }).await;
    let mid = format!("P {} | C1 {}", row(&pool, p).await, row(&pool, c1).await);
    assert!(c1_done, "C1 ends done on its second run: {mid}");
    assert_eq!(
        (
            status(&pool, p).await,
            int_col(&pool, p, "children_pending").await,
            E1_AFTER_RUNS.load(SeqCst)
        ),
        ("awaiting_children".to_string(), 1, 0),
        "P must not run its after-step while C2 has not ended: {mid}"
    );

    // Release C2; then P's after-step runs once and sees both children done.
    sqlx::query("UPDATE gd_instances SET eligible_at = now() WHERE id = $1")
        .bind(c2)
        .execute(&pool)
        .await
        .unwrap();
    let p_end = wait_until(10.0, || async { is_terminal(&pool, p).await }).await;
    let end = format!(
        "P {} | C1 {} | C2 {}",
        row(&pool, p).await,
        row(&pool, c1).await,
        row(&pool, c2).await
    );
    assert!(p_end, "P ends: {end}");
    assert_eq!(status(&pool, p).await, "done", "{end}");
    assert_eq!(status(&pool, c2).await, "done", "{end}");
    assert_eq!(E1_AFTER_RUNS.load(SeqCst), 1, "after-step ran once: {end}");
    let result = common::column(&pool, p, "result").await.unwrap_or_default();
    assert_eq!(
        result, r#"[{"n": 1, "status": "done"}, {"n": 2, "status": "done"}]"#,
        "{end}"
    );
    assert_eq!(executing_count(&pool).await, 0, "nothing left executing");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

// ---------------------------------------------------------------------------------------
// E19: a failed child of a finished parent cannot be retried
// ---------------------------------------------------------------------------------------

test_fsm!(E19Kid, state = Count, queue = "e19", version = 1, {
    Run => "run" |_ctx| { Ok(Step::stop("the child fails")) },
});

test_fsm!(E19Parent, state = Count, queue = "e19", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<E19Kid>(Count::default())], E19Parent::After))
    },
    After => "after" |ctx| {
        let failed = ctx.children().iter().filter(|c| c.status == Status::Failed).count();
        Ok(Step::done(json!({ "failed": failed })))
    },
});

test_fsm!(E19Other, state = Count, queue = "e19", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!("other"))) },
});

/// E19: a child fails, its parent sees it and finishes `done`; `Client::retry(child)` must
/// then be refused with a typed error (the parent's barrier is gone) and the child stays
/// `failed`. The engine keeps working: an unrelated instance runs, and a dead node's
/// expired row is reaped.
#[tokio::test]
async fn e19_retrying_a_child_of_a_finished_parent_is_refused() {
    let _serial = serial().await;
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E19Kid>(&mut r);
    reg::<E19Parent>(&mut r);
    reg::<E19Other>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e19", q(4))
        .with_lease_ttl(Duration::from_secs(1))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let p = gd.insert::<E19Parent>(Count::default()).await.unwrap();
    assert_eq!(common::finished(&pool, p, 10).await, "done");
    assert_eq!(
        common::column(&pool, p, "result").await.as_deref(),
        Some(r#"{"failed": 1}"#)
    );
    let child: i64 = sqlx::query_scalar("SELECT id FROM gd_instances WHERE parent_id = $1")
        .bind(p)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status(&pool, child).await, "failed");

    let res = gd.retry(child).await;
    let child_after = row(&pool, child).await;
    let typed = !matches!(res, Ok(_) | Err(Error::Database(_)));

    // The engine goes on: an unrelated instance runs, the reaper still reaps.
    let other = gd.insert::<E19Other>(Count::default()).await.unwrap();
    let other_done = wait_until(10.0, || async { status(&pool, other).await == "done" }).await;
    let dead = dead_node_row(&pool, 0, 10).await;
    let reaped = wait_until(10.0, || async { status(&pool, dead).await != "executing" }).await;
    let end = format!(
        "child {} | parent {} | other {} | dead-node row {}",
        row(&pool, child).await,
        row(&pool, p).await,
        row(&pool, other).await,
        row(&pool, dead).await
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
    assert!(
        typed,
        "retry of a failed child whose parent is done must be refused with a typed error, got {res:?}; \
         right after: child {child_after}; at the end: {end}"
    );
    assert!(
        child_after.contains("status=failed"),
        "the child stays failed: {child_after}"
    );
    assert!(other_done, "an unrelated instance still runs: {end}");
    assert!(reaped, "the reaper still reaps a dead node's row: {end}");
}

// ---------------------------------------------------------------------------------------
// E1b: cancel + retry of a parent whose child is still executing
// ---------------------------------------------------------------------------------------

static E1B_KID_STARTED: AtomicBool = AtomicBool::new(false);
static E1B_AFTER_RUNS: AtomicUsize = AtomicUsize::new(0);

test_fsm!(E1bKid, state = Count, queue = "e1b", version = 1, {
    Run => "run" |ctx| {
        E1B_KID_STARTED.store(true, SeqCst);
        tokio::select! {
            _ = ctx.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        // Winding down after the cancel takes a while: the child stays live meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(Step::done(json!("kid")))
    },
});

test_fsm!(E1bParent, state = Count, queue = "e1b", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<E1bKid>(Count::default())], E1bParent::After))
    },
    After => "after" |ctx| {
        E1B_AFTER_RUNS.fetch_add(1, SeqCst);
        Ok(Step::done(json!({ "children": ctx.children().len() })))
    },
});

/// E1b: cancel a parent whose child is executing, then retry the parent while the child
/// is still live. The retry is either refused (typed error) or leaves the parent
/// `awaiting_children` with children_pending 1 — never `runnable` at its after-step. The
/// child's end then commits (no children_pending error; nothing left executing), and in
/// the second case the parent runs its after-step exactly once.
#[tokio::test]
async fn e1b_retry_of_a_cancelled_parent_waits_for_its_live_child() {
    let _serial = serial().await;
    E1B_KID_STARTED.store(false, SeqCst);
    E1B_AFTER_RUNS.store(0, SeqCst);
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E1bKid>(&mut r);
    reg::<E1bParent>(&mut r);
    // Default 30 s lease: a child whose commit fails stays `executing`, visibly.
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e1b", q(4))
        .start()
        .await
        .unwrap();
    let p = gd.insert::<E1bParent>(Count::default()).await.unwrap();
    assert!(
        wait_until(10.0, || async {
            E1B_KID_STARTED.load(SeqCst) && status(&pool, p).await == "awaiting_children"
        })
        .await,
        "the child runs: {}",
        row(&pool, p).await
    );
    let kid: i64 = sqlx::query_scalar("SELECT id FROM gd_instances WHERE parent_id = $1")
        .bind(p)
        .fetch_one(&pool)
        .await
        .unwrap();
    let c = gd.cancel(p).await.expect("cancel the parent");
    assert_eq!((c.failed, c.after_current_step), (1, 1), "{c:?}");

    let res = gd.retry(p).await;
    let (p_status, p_pending) = (
        status(&pool, p).await,
        int_col(&pool, p, "children_pending").await,
    );
    let kid_status = status(&pool, kid).await;
    let after_retry = format!(
        "parent {} | child {}",
        row(&pool, p).await,
        row(&pool, kid).await
    );
    let retried = match &res {
        Ok(()) => true,
        Err(Error::Database(e)) => {
            drop(engine);
            db.close().await;
            panic!("retry of the cancelled parent: raw database error {e}; {after_retry}");
        }
        Err(_) => false,
    };
    if retried {
        let live = !matches!(kid_status.as_str(), "done" | "failed");
        if !(live && p_status == "awaiting_children" && p_pending == 1) {
            drop(engine);
            db.close().await;
            panic!(
                "retry(parent) was accepted while its child is live ({kid_status}): the parent must \
                 stay awaiting_children with children_pending 1, not runnable at its after-step: {after_retry}"
            );
        }
    } else {
        assert_eq!(
            p_status, "failed",
            "a refused retry changes nothing: {after_retry}"
        );
    }

    // The child's end commits (a failing commit would leave it executing for 30 s).
    let kid_end = wait_until(8.0, || async { is_terminal(&pool, kid).await }).await;
    if retried {
        let p_end = wait_until(8.0, || async { is_terminal(&pool, p).await }).await;
        assert!(
            p_end,
            "the parent ends after its child: {}",
            row(&pool, p).await
        );
    }
    let end = format!(
        "parent {} | child {}",
        row(&pool, p).await,
        row(&pool, kid).await
    );
    let p_final = status(&pool, p).await;
    let negative = count(
        &pool,
        "SELECT count(*) FROM gd_instances WHERE children_pending < 0",
    )
    .await;
    let executing = executing_count(&pool).await;
    let after_runs = E1B_AFTER_RUNS.load(SeqCst);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
    assert!(kid_end, "the child's outcome commits: {end}");
    assert_eq!(negative, 0, "children_pending never negative: {end}");
    assert_eq!(executing, 0, "nothing left executing: {end}");
    if retried {
        assert_eq!(
            after_runs, 1,
            "the after-step ran once, after the child: {end}"
        );
        assert_eq!(p_final, "done", "{end}");
    } else {
        assert_eq!(after_runs, 0, "{end}");
    }
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
// E15: a caller's lock on a parent does not stall the group commit
// ---------------------------------------------------------------------------------------

static E15_KID_STARTED: AtomicBool = AtomicBool::new(false);
fn e15_gate() -> &'static Notify {
    static G: OnceLock<Notify> = OnceLock::new();
    G.get_or_init(Notify::new)
}

test_fsm!(E15Kid, state = Count, queue = "e15", version = 1, {
    Run => "run" |_ctx| {
        E15_KID_STARTED.store(true, SeqCst);
        e15_gate().notified().await;
        Ok(Step::done(json!("kid")))
    },
});

test_fsm!(E15Parent, state = Count, queue = "e15", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<E15Kid>(Count::default())], E15Parent::After))
    },
    After => "after" |ctx| { Ok(Step::done(json!({ "children": ctx.children().len() }))) },
});

test_fsm!(E15Quick, state = Count, queue = "e15", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!("quick"))) },
});

/// E15: parent P awaits one child. A caller signals P in a transaction it keeps open 3 s
/// (P's row is locked). Meanwhile the child finishes, and 3 unrelated instances become
/// runnable: they must be `done` within 1 s, while the caller still holds its lock (the
/// child's fan-in must not stall the node's group commit). After the caller commits, P
/// ends `done`.
#[tokio::test]
async fn e15_a_caller_lock_on_a_parent_does_not_stall_the_group_commit() {
    let _serial = serial().await;
    E15_KID_STARTED.store(false, SeqCst);
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E15Kid>(&mut r);
    reg::<E15Parent>(&mut r);
    reg::<E15Quick>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e15", q(8))
        .start()
        .await
        .unwrap();
    let p = gd.insert::<E15Parent>(Count::default()).await.unwrap();
    assert!(
        wait_until(10.0, || async {
            E15_KID_STARTED.load(SeqCst) && status(&pool, p).await == "awaiting_children"
        })
        .await,
        "the child runs"
    );
    let mut tx = pool.begin().await.unwrap();
    gd.signal(p, "x", json!({}))
        .execute(&mut *tx)
        .await
        .unwrap();
    let locked_at = Instant::now();
    // The child finishes; its commit has P to decrement.
    e15_gate().notify_one();
    // (Old code: that commit now waits on P's lock. Give it the moment to get there.)
    wait_until(0.5, || async {
        count(
            &pool,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
               AND wait_event_type = 'Lock' AND query LIKE '%gd_commit_outcomes%'",
        )
        .await
            > 0
    })
    .await;
    let quick = gd
        .insert_all::<E15Quick>((0..3).map(|_| Entry::new(Count::default())))
        .await
        .unwrap();
    let runnable_at = Instant::now();
    let in_time = wait_until(1.0, || async {
        let mut all = true;
        for &i in &quick {
            all &= status(&pool, i).await == "done";
        }
        all
    })
    .await;
    let took = runnable_at.elapsed();
    let mut quick_rows = Vec::new();
    for &i in &quick {
        quick_rows.push(row(&pool, i).await);
    }
    let still_locked = locked_at.elapsed() < Duration::from_secs(3);
    // The caller's transaction stays open 3 s in all.
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(locked_at.elapsed())).await;
    tx.commit().await.unwrap();
    let p_done = wait_until(10.0, || async { is_terminal(&pool, p).await }).await;
    let p_row = row(&pool, p).await;
    let p_status = status(&pool, p).await;
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
    assert!(
        in_time && still_locked,
        "3 unrelated instances must be done within 1 s while a caller holds the parent's lock; \
         after {took:?} (lock still held: {still_locked}): {quick_rows:?}"
    );
    assert!(
        p_done && p_status == "done",
        "the parent ends done after the caller commits: {p_row}"
    );
}

// ---------------------------------------------------------------------------------------
// E11: an await timeout committed in ctx.transaction() counts from the commit
// ---------------------------------------------------------------------------------------

/// When the step began, and when (and on which run) it committed.
type E11Times = (Option<Instant>, Option<(Instant, usize)>);

fn e11_times() -> &'static Mutex<E11Times> {
    static T: OnceLock<Mutex<E11Times>> = OnceLock::new();
    T.get_or_init(Default::default)
}

test_fsm!(E11Txn, state = Count, queue = "e11", version = 1, {
    Park => "park" |ctx| {
        let tx = ctx.transaction().await?;
        sqlx::query("SELECT 1").execute(&mut **tx).await?;
        tokio::time::sleep(Duration::from_millis(2500)).await; // work in the transaction
        e11_times().lock().unwrap().0 = Some(Instant::now());
        Ok(Step::await_signal(["x"], E11Txn::After).timeout(Duration::from_secs(2)))
    },
    After => "after" |ctx| {
        e11_times().lock().unwrap().1 = Some((Instant::now(), ctx.awaited().len()));
        Ok(Step::done(json!(ctx.awaited().len())))
    },
});

/// E11: a step opens `ctx.transaction()`, works 2.5 s in it, then returns
/// `await_signal(..).timeout(2 s)`. The deadline counts from the commit, not from the
/// transaction's start: right after the commit the instance is `awaiting_signal` with
/// `await_deadline` at least 1.5 s ahead of the database's now(), and the timeout does
/// not wake it before ~2 s after the commit.
#[tokio::test]
async fn e11_an_await_timeout_in_a_step_transaction_counts_from_the_commit() {
    let _serial = serial().await;
    *e11_times().lock().unwrap() = (None, None);
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E11Txn>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e11", q(2))
        .with_timeout_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let id = gd.insert::<E11Txn>(Count::default()).await.unwrap();
    // The first look after the commit (the step is no longer `park`).
    let mut first: Option<(String, Option<f64>)> = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while first.is_none() && Instant::now() < deadline {
        let (step, st, left): (String, String, Option<f64>) = sqlx::query_as(
            "SELECT step, status::text,
                    extract(epoch FROM await_deadline - now())::float8
               FROM gd_instances WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        if step != "park" {
            first = Some((st, left));
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let committed = first.is_some();
    assert!(committed, "the await committed: {}", row(&pool, id).await);
    let done = wait_until(8.0, || async { is_terminal(&pool, id).await }).await;
    let end = row(&pool, id).await;
    let (returned, woke) = *e11_times().lock().unwrap();
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
    let (st, left) = first.unwrap();
    assert!(
        st == "awaiting_signal" && left.is_some_and(|l| l >= 1.5),
        "right after the await's commit the instance must be awaiting_signal with its deadline >= 1.5 s \
         ahead; first seen: status {st} (already woken unless awaiting_signal), await_deadline - now() = \
         {left:?} s; end: {end}"
    );
    assert!(done, "the timeout fires eventually: {end}");
    let (woke_at, awaited) = woke.expect("the next step ran");
    let gap = woke_at.duration_since(returned.expect("the await step returned"));
    assert_eq!(awaited, 0, "woken by the timeout");
    assert!(
        gap >= Duration::from_millis(1800),
        "the 2 s timeout fired {gap:?} after the await was committed"
    );
}

// ---------------------------------------------------------------------------------------
// E17: a REPEATABLE READ step transaction and the heartbeat
// ---------------------------------------------------------------------------------------

test_fsm!(E17Rr, state = Count, queue = "e17", version = 1, {
    Run => "run" |ctx| {
        let id = ctx.id();
        ran("E17Rr", id);
        let tx = ctx.transaction().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut **tx).await?;
        let _seen: i64 = sqlx::query_scalar("SELECT count(*) FROM rr_audit").fetch_one(&mut **tx).await?;
        // Longer than one heartbeat: the heartbeat updates this instance's row meanwhile.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        sqlx::query("INSERT INTO rr_audit (instance) VALUES ($1)").bind(id).execute(&mut **tx).await?;
        Ok(Step::done(json!("rr")))
    },
});

/// E17: a step sets `REPEATABLE READ` on its `ctx.transaction()`, reads, works longer
/// than a heartbeat (lease 1.5 s, heartbeat 0.5 s, work 1.2 s), writes a row and returns
/// done. It runs exactly once: either it is `done` with its row written, or it is
/// `failed` after that one run with an error naming the isolation level (the engine
/// refusing a transaction it cannot commit into) and no row written. Never lost and rerun.
#[tokio::test]
async fn e17_a_repeatable_read_step_transaction_runs_once() {
    let _serial = serial().await;
    reset_runs("E17Rr");
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    sqlx::query("CREATE TABLE rr_audit (instance bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E17Rr>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with("e17", q(2))
        .with_lease_ttl(Duration::from_millis(1500))
        .with_heartbeat_interval(Duration::from_millis(500))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let id = gd.insert::<E17Rr>(Count::default()).await.unwrap();
    let settled = wait_until(10.0, || async {
        is_terminal(&pool, id).await || runs("E17Rr", id) > 1
    })
    .await;
    let desc = row(&pool, id).await;
    let st = status(&pool, id).await;
    let err = common::column(&pool, id, "last_error")
        .await
        .unwrap_or_default();
    let rows = count(&pool, "SELECT count(*) FROM rr_audit").await;
    let n = runs("E17Rr", id);
    drop(engine);
    db.close().await;
    assert!(settled, "the step ends: {desc} runs={n}");
    assert_eq!(n, 1, "exactly one run: {desc} rr_audit rows={rows}");
    match st.as_str() {
        "done" => assert_eq!(rows, 1, "done with its write committed: {desc}"),
        "failed" => {
            let e = err.to_lowercase();
            assert!(
                e.contains("isolation") || e.contains("before any query"),
                "failed with an error naming the isolation level: {desc}"
            );
            assert_eq!(rows, 0, "failed: nothing written: {desc}");
        }
        _ => panic!("not ended: {desc}"),
    }
}

// ---------------------------------------------------------------------------------------
// E6: database default REPEATABLE READ must not lose wake-ups
// ---------------------------------------------------------------------------------------

test_fsm!(E6Parker, state = Count, queue = "e6", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], E6Parker::Go)) },
    Go => "go" |ctx| { Ok(Step::done(json!(ctx.awaited().len()))) },
});

/// A serialization failure or deadlock of the caller's own REPEATABLE READ transaction.
fn is_serialization_failure(e: &Error) -> bool {
    let coded = matches!(e, Error::Database(sqlx::Error::Database(db))
        if matches!(db.code().as_deref(), Some("40001" | "40P01")));
    let text = e.to_string();
    coded || text.contains("could not serialize") || text.contains("deadlock detected")
}

/// E6: the database's default isolation is REPEATABLE READ. Instances park on `go` while
/// senders deliver their `go` concurrently, each in a short transaction of its own, so
/// that deliveries race the group commits that park. Every instance must be woken and
/// end `done`; none may stay `awaiting_signal` with its signal in the inbox. (A delivery
/// refused with a serialization failure is sent again: that is the caller's to handle.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e6_repeatable_read_default_loses_no_wake_up() {
    let _serial = serial().await;
    let db = TestDb::new().await;
    sqlx::query(&format!(
        "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'",
        db.name()
    ))
    .execute(db.pool())
    .await
    .unwrap();
    let pool = db.new_pool(10).await;
    let iso: String = sqlx::query_scalar("SHOW default_transaction_isolation")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(iso, "repeatable read");
    let gd = Client::new(pool.clone());
    let mut r = Registry::new();
    reg::<E6Parker>(&mut r);
    let engine = Engine::builder(pool.clone())
        .with_registry(r)
        .queue_with(
            "e6",
            QueueConfig::new(64).with_poll_interval(Duration::from_millis(20)),
        )
        .with_timeout_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let rounds = 5;
    let n = 200;
    let mut stranded_total = 0;
    let mut report = Vec::new();
    let retries = Arc::new(AtomicI64::new(0));
    for round in 0..rounds {
        let ids = gd
            .insert_all::<E6Parker>((0..n).map(|_| Entry::new(Count::default())))
            .await
            .unwrap();
        let mut senders = Vec::new();
        for k in 0..4usize {
            let (gd, ids, pool, retries) = (gd.clone(), ids.clone(), pool.clone(), retries.clone());
            senders.push(tokio::spawn(async move {
                for &id in ids.iter().skip(k).step_by(4) {
                    let mut tries = 0;
                    loop {
                        let mut tx = pool.begin().await.unwrap();
                        let res = gd.signal(id, "go", json!({})).execute(&mut *tx).await;
                        match res {
                            Ok(_) => {
                                // Hold the row a moment: a commit that parks it waits on us.
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                match tx.commit().await {
                                    Ok(()) => break,
                                    Err(e) => panic!("commit of the delivery to {id}: {e}"),
                                }
                            }
                            Err(e) if is_serialization_failure(&e) && tries < 50 => {
                                tries += 1;
                                retries.fetch_add(1, SeqCst);
                                drop(tx);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Err(e) => panic!("delivery to {id}: {e}"),
                        }
                    }
                }
            }));
        }
        for s in senders {
            s.await.unwrap();
        }
        let ids_txt = ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let quiet = wait_until(20.0, || {
            let (pool, ids_txt) = (pool.clone(), ids_txt.clone());
            async move {
                count(
                    &pool,
                    &format!("SELECT count(*) FROM gd_instances WHERE status IN ('runnable', 'executing') AND id = ANY('{{{ids_txt}}}')"),
                )
                .await
                    == 0
            }
        })
        .await;
        let stranded = count(
            &pool,
            &format!(
                "SELECT count(*) FROM gd_instances i WHERE i.status = 'awaiting_signal'
                   AND i.id = ANY('{{{ids_txt}}}')
                   AND EXISTS (SELECT 1 FROM gd_signals s WHERE s.target_id = i.id AND s.name = ANY (i.awaits))"
            ),
        )
        .await;
        let done = count(
            &pool,
            &format!("SELECT count(*) FROM gd_instances WHERE status = 'done' AND id = ANY('{{{ids_txt}}}')"),
        )
        .await;
        stranded_total += stranded;
        report.push(format!(
            "round {round}: done {done}/{n}, stranded {stranded}, quiet {quiet}"
        ));
    }
    engine.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    db.close().await;
    assert_eq!(
        stranded_total,
        0,
        "instances parked with their signal in the inbox: {report:?} (deliveries retried: {})",
        retries.load(SeqCst)
    );
    assert!(
        report.iter().all(|r| r.contains(&format!("done {n}/{n}"))),
        "every instance done: {report:?}"
    );
}

// ---------------------------------------------------------------------------------------
// E4: cancel of a parent vs its children's commits
// ---------------------------------------------------------------------------------------

static E4_OPEN_ROUND: AtomicI64 = AtomicI64::new(0);

test_fsm!(E4Kid, state = Count, queue = "e4", version = 1, {
    Run => "run" |ctx| {
        // Every child of round n finishes at once, when the test opens round n.
        while E4_OPEN_ROUND.load(SeqCst) < ctx.state.n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Step::done(json!("kid")))
    },
});

test_fsm!(E4Parent, state = Count, queue = "e4", version = 1, {
    Spawn => "spawn" |ctx| {
        let round = ctx.state.n;
        Ok(Step::schedule_children(
            (0..5).map(|_| Child::new::<E4Kid>(Count { n: round, ..Default::default() })).collect(),
            E4Parent::After,
        ))
    },
    After => "after" |_ctx| { Ok(Step::done(json!("after"))) },
});

/// Sessions of `application_name` waiting on a lock.
async fn lock_waiters(pool: &PgPool, application_name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
           AND wait_event_type = 'Lock' AND application_name = $1",
    )
    .bind(application_name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// E4: `Client::cancel(parent)` while the parent's children commit their terminal
/// outcomes must never fail (deadlock detected). Each of 3 rounds lines the two up: a
/// third session holds the parent's row, the cancel queues on it first, then the 5
/// children finish and their group commit (which decrements the parent) queues behind;
/// the third session then lets go. The cancel's session runs the deadlock check first
/// (deadlock_timeout 50 ms, the engine's 10 s), so a lock-order cycle fails the cancel.
#[tokio::test]
async fn e4_cancel_of_a_parent_never_deadlocks_with_its_childrens_commits() {
    let _serial = serial().await;
    E4_OPEN_ROUND.store(0, SeqCst);
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    let engine_pool = PgPoolOptions::new()
        .max_connections(10)
        .connect_with(
            db.options()
                .application_name("e4_engine")
                .options([("deadlock_timeout", "10s")]),
        )
        .await
        .unwrap();
    let cancel_pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(
            db.options()
                .application_name("e4_cancel")
                .options([("deadlock_timeout", "50ms")]),
        )
        .await
        .unwrap();
    let gd = Client::new(pool.clone());
    let canceller = Client::new(cancel_pool.clone());
    let mut r = Registry::new();
    reg::<E4Kid>(&mut r);
    reg::<E4Parent>(&mut r);
    let engine = Engine::builder(engine_pool.clone())
        .with_registry(r)
        .queue_with("e4", q(16))
        .start()
        .await
        .unwrap();
    let mut failures = Vec::new();
    for round in 1..=3i64 {
        let p = gd
            .insert::<E4Parent>(Count {
                n: round,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(
            wait_until(10.0, || async {
                status(&pool, p).await == "awaiting_children"
                    && count(
                        &pool,
                        &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {p} AND status = 'executing'"),
                    )
                    .await
                        == 5
            })
            .await,
            "round {round}: 5 children running: {}",
            row(&pool, p).await
        );
        let mut holder = pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM gd_instances WHERE id = $1 FOR NO KEY UPDATE")
            .bind(p)
            .execute(&mut *holder)
            .await
            .unwrap();
        let c = canceller.clone();
        let cancel = tokio::spawn(async move { c.cancel(p).await });
        wait_until(5.0, || async {
            lock_waiters(&pool, "e4_cancel").await > 0 || cancel.is_finished()
        })
        .await;
        E4_OPEN_ROUND.store(round, SeqCst);
        wait_until(3.0, || async {
            lock_waiters(&pool, "e4_engine").await > 0
                || count(
                    &pool,
                    &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {p} AND status IN ('done', 'failed')"),
                )
                .await
                    == 5
        })
        .await;
        holder.commit().await.unwrap();
        let res = cancel.await.unwrap();
        if let Err(e) = &res {
            failures.push(format!("round {round}: cancel failed: {e}"));
        }
        let settled = wait_until(10.0, || async {
            is_terminal(&pool, p).await
                && count(
                    &pool,
                    &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {p} AND status NOT IN ('done', 'failed')"),
                )
                .await
                    == 0
        })
        .await;
        if !settled {
            failures.push(format!(
                "round {round}: not settled: {}",
                row(&pool, p).await
            ));
        }
    }
    let executing = executing_count(&pool).await;
    engine.shutdown(Duration::from_secs(5)).await;
    engine_pool.close().await;
    cancel_pool.close().await;
    db.close().await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(executing, 0, "nothing left executing");
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
