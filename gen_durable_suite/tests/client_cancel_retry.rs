//! `Client::cancel` and `Client::retry`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering, Ordering::SeqCst};
use std::sync::OnceLock;
use std::time::Duration;

use common::scenario::{
    dead_node_row, executing_count, int_col, is_terminal, q, reg, row, serial, wait_until,
};
use common::{column, count, eventually, finished, status, Count};
use gen_durable::{Child, Client, Engine, Error, QueueConfig, Registry, Status, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::Notify;

static SAW_CANCEL: AtomicBool = AtomicBool::new(false);

test_fsm!(Parked, state = Count, queue = "c", version = 1, {
    Wait => "wait" |_ctx| { Ok(Step::await_signal(["never"], Parked::After)) },
    After => "after" |_ctx| { Ok(Step::done(json!(null))) },
});

test_fsm!(Long, state = Count, queue = "c", version = 1, {
    Run => "run" |ctx| {
        tokio::select! {
            _ = ctx.cancelled() => { SAW_CANCEL.store(true, Ordering::SeqCst); }
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        ctx.state.n += 1;
        Ok(Step::next(Long::Next))
    },
    Next => "next" |_ctx| { Ok(Step::done(json!("should not run"))) },
});

test_fsm!(Fans, state = Count, queue = "c", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Parked>(Count::default()), Child::new::<Parked>(Count::default())], Fans::After))
    },
    After => "after" |_ctx| { Ok(Step::done(json!(null))) },
});

test_fsm!(Flaky, state = Count, queue = "c", version = 1, {
    Run => "run" |ctx| {
        if ctx.state.n == 0 { return Ok(Step::stop("first time fails")); }
        Ok(Step::done(json!({ "attempt": ctx.attempt() })))
    },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Parked>();
    r.register::<Long>();
    r.register::<Fans>();
    r.register::<Flaky>();
    r
}

async fn engine(db: &TestDb) -> Engine {
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "c",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(50)),
        )
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn cancel_a_parked_instance_fails_it_at_once_and_deletes_its_inbox() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Parked>(Count::default()).await.unwrap();
    eventually(10, "parked", || async {
        status(db.pool(), id).await == "awaiting_signal"
    })
    .await;
    gd.signal(id, "other", json!({})).await.unwrap();
    let c = gd.cancel(id).await.unwrap();
    assert_eq!((c.failed, c.after_current_step), (1, 0));
    assert_eq!(status(db.pool(), id).await, "failed");
    assert_eq!(
        column(db.pool(), id, "last_error").await.as_deref(),
        Some("cancelled")
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    // A second cancel, and a cancel of an unknown id, are typed errors.
    assert!(matches!(gd.cancel(id).await, Err(Error::Finished { .. })));
    assert!(matches!(
        gd.cancel(123_456).await,
        Err(Error::NotFound { .. })
    ));
    // A runnable one too.
    let r = gd
        .insert::<Parked>(Count::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    gd.cancel(r).await.unwrap();
    assert_eq!(status(db.pool(), r).await, "failed");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn cancel_a_running_instance_after_its_current_step() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Long>(Count::default()).await.unwrap();
    eventually(10, "running", || async {
        status(db.pool(), id).await == "executing"
    })
    .await;
    let c = gd.cancel(id).await.unwrap();
    assert_eq!((c.failed, c.after_current_step), (0, 1));
    assert_eq!(finished(db.pool(), id, 10).await, "failed");
    assert!(
        SAW_CANCEL.load(Ordering::SeqCst),
        "ctx.cancelled() resolved"
    );
    assert_eq!(
        column(db.pool(), id, "last_error").await.as_deref(),
        Some("cancelled")
    );
    assert_eq!(
        column(db.pool(), id, "step").await.as_deref(),
        Some("run"),
        "the next step never ran"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn cancel_a_parent_cancels_its_live_children() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Fans>(Count::default()).await.unwrap();
    eventually(10, "children parked", || async {
        count(db.pool(), &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {id} AND status = 'awaiting_signal'")).await == 2
    })
    .await;
    let c = gd.cancel(id).await.unwrap();
    assert_eq!(c.failed, 3);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'failed'"
        )
        .await,
        3
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn retry_makes_a_failed_instance_runnable_at_its_step_with_attempt_zero() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Flaky>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "failed");
    assert!(matches!(
        gd.retry(123_456).await,
        Err(Error::NotFound { .. })
    ));
    let running = gd.insert::<Parked>(Count::default()).await.unwrap();
    assert!(matches!(
        gd.retry(running).await,
        Err(Error::WrongStatus { .. })
    ));
    // Fix the data, then retry.
    sqlx::query(r#"UPDATE gd_instances SET state = '{"n": 1}' WHERE id = $1"#)
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    gd.retry(id).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"attempt": 0}"#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
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
                        &format!("SELECT count(*) FROM gd_instances i WHERE parent_id = {p} AND gd_status_of(i) = 'executing'"),
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
