//! What the scenario tests that came from the audits use: a lock that runs timing tests
//! of one file one at a time, run counts kept outside any transaction, polls with a
//! deadline, row summaries for messages, and inputs the server refuses.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use gen_durable::{Error, QueueConfig, Registry};
use sqlx::PgPool;

use super::count;

/// Timing tests take this lock first and run one at a time within their file, so a test
/// with a 1 s lease is not slowed by another one's load on a two-core machine.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Runs of each instance, counted outside any transaction: `(fsm tag, id) -> runs`.
fn runs_table() -> &'static Mutex<HashMap<(&'static str, i64), u32>> {
    static RUNS: OnceLock<Mutex<HashMap<(&'static str, i64), u32>>> = OnceLock::new();
    RUNS.get_or_init(Default::default)
}
pub fn ran(tag: &'static str, id: i64) {
    *runs_table().lock().unwrap().entry((tag, id)).or_default() += 1;
}
pub fn runs(tag: &'static str, id: i64) -> u32 {
    runs_table()
        .lock()
        .unwrap()
        .get(&(tag, id))
        .copied()
        .unwrap_or(0)
}
pub fn reset_runs(tag: &'static str) {
    runs_table().lock().unwrap().retain(|(t, _), _| *t != tag);
}

/// Polls `cond` every 10 ms for at most `secs`; true if it held.
pub async fn wait_until<F, Fut>(secs: f64, mut cond: F) -> bool
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
pub async fn row(pool: &PgPool, id: i64) -> String {
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

pub async fn int_col(pool: &PgPool, id: i64, col: &str) -> i64 {
    super::column(pool, id, col)
        .await
        .and_then(|v| v.parse().ok())
        .unwrap_or(i64::MIN)
}

pub async fn is_terminal(pool: &PgPool, id: i64) -> bool {
    matches!(super::status(pool, id).await.as_str(), "done" | "failed")
}

pub async fn executing_count(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM gd_instances i WHERE gd_status_of(i) = 'executing'",
    )
    .await
}

/// The result must be an error, and a typed one: not the raw database error the
/// unfixed code returns.
#[track_caller]
pub fn assert_typed_err<T: std::fmt::Debug>(res: &gen_durable::Result<T>, what: &str) {
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
pub fn incompressible(len: usize) -> String {
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

pub fn q(n: usize) -> QueueConfig {
    QueueConfig::new(n).with_poll_interval(Duration::from_millis(50))
}

pub fn reg<F: gen_durable::Fsm>(r: &mut Registry) {
    r.register::<F>();
}

/// A row of a node that died: `executing`, locked by `dead`, its lease expired `ago`.
pub async fn dead_node_row(pool: &PgPool, reaps: i32, max_reaps: i32) -> i64 {
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
