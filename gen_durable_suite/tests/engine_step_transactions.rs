//! A step's own transaction (`ctx.transaction()`): what it commits counts from its
//! commit, and a stricter isolation level runs the step once.

mod common;

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::scenario::{is_terminal, q, ran, reg, reset_runs, row, runs, serial, wait_until};
use common::{count, status, Count};
use gen_durable::{Client, Engine, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

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
