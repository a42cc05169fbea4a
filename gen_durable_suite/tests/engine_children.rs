//! Children: fan-out with the parent's park in one transaction, fan-in once
//! per child, the barrier waits for termination, nesting.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::scenario::{is_terminal, q, reg, row, serial, wait_until};
use common::{column, count, eventually, finished, status, Count, Events};
use gen_durable::{Child, Client, Engine, EngineBuilder, Entry, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;
use tokio::sync::Notify;

test_fsm!(Leaf, state = Count, queue = "fan", version = 1, {
    Run => "run" |ctx| {
        if ctx.state.n < 0 { return Ok(Step::stop(format!("leaf {} refused", ctx.state.n))); }
        Ok(Step::done(json!(ctx.state.n * 10)))
    },
});

test_fsm!(Parent, state = Count, queue = "fan", version = 1, {
    Spawn => "spawn" |ctx| {
        let kids: Vec<Child> = (0..ctx.state.n)
            .map(|i| Child::new::<Leaf>(Count { n: if ctx.state.log.contains(&"fail-one".to_string()) && i == 1 { -1 } else { i }, ..Default::default() }))
            .collect();
        Ok(Step::schedule_children(kids, Parent::Sum))
    },
    Sum => "sum" |ctx| {
        let total = ctx.children().len();
        let done = ctx.children().iter().filter(|c| c.status == gen_durable::Status::Done).count();
        let failed = ctx.children().iter().filter(|c| c.status == gen_durable::Status::Failed).count();
        let sum: i64 = ctx.children().iter().filter_map(|c| c.result.as_ref().and_then(|r| r.as_i64())).sum();
        ctx.state.log.push("summed".into());
        Ok(Step::done(json!({ "total": total, "done": done, "failed": failed, "sum": sum })))
    },
});

test_fsm!(Grand, state = Count, queue = "fan", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![
            Child::new::<Parent>(Count { n: 2, ..Default::default() }),
            Child::new::<Parent>(Count { n: 3, ..Default::default() }),
        ], Grand::Sum))
    },
    Sum => "sum" |ctx| {
        let sums: i64 = ctx.children().iter().map(|c| c.result.as_ref().unwrap()["sum"].as_i64().unwrap()).sum();
        Ok(Step::done(json!({ "children": ctx.children().len(), "sum": sums })))
    },
});

test_fsm!(Dedup, state = Count, queue = "fan", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![
            Child::new::<Leaf>(Count::default()).unique_key("same"),
            Child::new::<Leaf>(Count::default()).unique_key("same"),
        ], Dedup::Sum))
    },
    Sum => "sum" |ctx| { Ok(Step::done(json!(ctx.children().len()))) },
});

/// Lets `HeldLeaf` steps end: one permit each.
static GO: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

test_fsm!(HeldLeaf, state = Count, queue = "fan", version = 1, {
    Run => "run" |ctx| {
        GO.acquire().await.unwrap().forget();
        Ok(Step::done(json!(ctx.state.n * 10)))
    },
});

test_fsm!(HeldParent, state = Count, queue = "fan", version = 1, {
    Spawn => "spawn" |ctx| {
        let kids: Vec<Child> = (0..ctx.state.n)
            .map(|i| Child::new::<HeldLeaf>(Count { n: i, ..Default::default() }))
            .collect();
        Ok(Step::schedule_children(kids, HeldParent::Sum))
    },
    Sum => "sum" |ctx| {
        let sum: i64 = ctx.children().iter().filter_map(|c| c.result.as_ref().and_then(|r| r.as_i64())).sum();
        Ok(Step::done(json!(sum)))
    },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<HeldLeaf>();
    r.register::<HeldParent>();
    r.register::<Leaf>();
    r.register::<Parent>();
    r.register::<Grand>();
    r.register::<Dedup>();
    r
}

/// An engine on queue `fan` with `concurrency` slots, polling every 50 ms.
fn builder(db: &TestDb, concurrency: usize) -> EngineBuilder {
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "fan",
            QueueConfig::new(concurrency).with_poll_interval(Duration::from_millis(50)),
        )
}

async fn engine(db: &TestDb, concurrency: usize) -> Engine {
    builder(db, concurrency).start().await.unwrap()
}

#[tokio::test]
async fn four_children_all_done_and_one_failing() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db, 4).await;
    let ok = gd
        .insert::<Parent>(Count {
            n: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    let mixed = gd
        .insert::<Parent>(Count {
            n: 3,
            log: vec!["fail-one".into()],
        })
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), ok, 20).await, "done");
    assert_eq!(
        column(db.pool(), ok, "result").await.as_deref(),
        Some(r#"{"sum": 60, "done": 4, "total": 4, "failed": 0}"#)
    );
    assert_eq!(finished(db.pool(), mixed, 20).await, "done");
    assert_eq!(
        column(db.pool(), mixed, "result").await.as_deref(),
        Some(r#"{"sum": 20, "done": 2, "total": 3, "failed": 1}"#)
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {ok}")
        )
        .await,
        4
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn zero_children_go_on_at_once_and_dropped_duplicates_are_not_waited_for() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db, 2).await;
    let none = gd.insert::<Parent>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), none, 10).await, "done");
    assert_eq!(
        column(db.pool(), none, "result->>'total'").await.as_deref(),
        Some("0")
    );
    let dedup = gd.insert::<Dedup>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), dedup, 10).await, "done");
    assert_eq!(
        column(db.pool(), dedup, "result").await.as_deref(),
        Some("1"),
        "one of two same-key children inserted"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn two_levels_of_nesting() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db, 4).await;
    let id = gd.insert::<Grand>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), id, 20).await, "done");
    // (0 + 10) + (0 + 10 + 20)
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"sum": 40, "children": 2}"#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn ten_thousand_children_wake_the_parent_exactly_once() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db, 50).await;
    let id = gd
        .insert::<Parent>(Count {
            n: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), id, 120).await, "done");
    assert_eq!(
        column(db.pool(), id, "result->>'total'").await.as_deref(),
        Some("10000")
    );
    assert_eq!(
        column(db.pool(), id, "result->>'done'").await.as_deref(),
        Some("10000")
    );
    // The Sum step ran once: one "summed" in the log, attempt 0, counter at zero.
    assert_eq!(
        column(db.pool(), id, "state->'log'").await.as_deref(),
        Some(r#"["summed"]"#)
    );
    assert_eq!(
        column(db.pool(), id, "children_pending").await.as_deref(),
        Some("0")
    );
    assert_eq!(status(db.pool(), id).await, "done");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// Children end while a caller's transaction holds their parent's row: their outcomes are
/// deferred (tried again at once a few times, then backing off), nothing is written while
/// the lock is held, and once it is let go every child commits exactly once and the
/// parent sums them.
#[tokio::test]
async fn outcomes_deferred_by_a_held_parent_commit_once_it_is_let_go() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = builder(&db, 8)
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    let id = gd
        .insert::<HeldParent>(Count {
            n: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    let executing = format!(
        "SELECT count(*) FROM gd_instances i WHERE parent_id = {id} AND gd_status_of(i) = 'executing'"
    );
    eventually(20, "the four children to run", || async {
        count(db.pool(), &executing).await == 4
    })
    .await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM gd_instances WHERE id = $1 FOR NO KEY UPDATE")
        .bind(id)
        .execute(&mut *holder)
        .await
        .unwrap();
    GO.add_permits(4);
    let deferred = || {
        events
            .all()
            .iter()
            .filter(|e| {
                matches!(e, gen_durable::Event::CommitStop { count, committed, .. }
                             if committed < count)
            })
            .count()
    };
    // Past the fast tries: the backing off has begun.
    eventually(
        20,
        "the children's outcomes to be deferred five times",
        || async { deferred() >= 5 },
    )
    .await;
    assert_eq!(
        count(db.pool(), &executing).await,
        4,
        "nothing committed meanwhile"
    );
    holder.commit().await.unwrap();
    assert_eq!(finished(db.pool(), id, 20).await, "done");
    assert_eq!(column(db.pool(), id, "result").await.as_deref(), Some("60"));
    let once = format!(
        "SELECT count(*) FROM gd_instances WHERE parent_id = {id} AND status = 'done' AND attempt = 0"
    );
    assert_eq!(count(db.pool(), &once).await, 4);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
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

/// The parent of `child` is gone, as after the collector deleted it (a cancelled parent
/// collected while its flagged child still ran): `parent_id` names no row.
async fn orphan(db: &TestDb, child: i64) {
    sqlx::query("UPDATE gd_instances SET parent_id = $1 + 1000000 WHERE id = $1")
        .bind(child)
        .execute(db.pool())
        .await
        .unwrap();
}

/// A child whose parent was collected commits its `done`: the commit does not wait for a
/// parent that no longer exists (it deferred the outcome until it failed the row).
#[tokio::test]
async fn a_child_whose_parent_was_collected_commits_its_end() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let child = gd
        .insert::<Leaf>(Count {
            n: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    orphan(&db, child).await;
    let engine = engine(&db, 4).await;
    assert_eq!(finished(db.pool(), child, 20).await, "done");
    assert_eq!(
        column(db.pool(), child, "result").await.as_deref(),
        Some("40")
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// The reapers and the release end a child whose parent was collected: a row's lease that
/// ran out at its limit fails (it stayed `executing` for ever), a batch's row at its limit
/// fails, and a cancelled row given back fails as cancelled.
#[tokio::test]
async fn the_reapers_and_the_release_end_a_child_whose_parent_was_collected() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let exec = |sql: &'static str, id: i64| {
        let pool = db.pool().clone();
        async move { sqlx::query(sql).bind(id).execute(&pool).await.unwrap() }
    };

    // A row claimed by itself (a K = 1 key), its lease run out at its last reap.
    let keyed = gd
        .insert_all::<Leaf>([Entry::new(Count::default()).partition_key("k")])
        .await
        .unwrap()[0];
    orphan(&db, keyed).await;
    exec(
        "UPDATE gd_instances SET status = 'executing', locked_by = 'gone-node', lease_epoch = 1,
                lease_expires_at = now() - interval '1 hour', reaps = max_reaps - 1
          WHERE id = $1",
        keyed,
    )
    .await;
    sqlx::query("SELECT * FROM gd_reap(10, NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(status(db.pool(), keyed).await, "failed");

    // A plain row in an expired batch of the log, at its last reap.
    let plain = gd.insert::<Leaf>(Count::default()).await.unwrap();
    orphan(&db, plain).await;
    exec(
        "UPDATE gd_instances SET reaps = max_reaps - 1 WHERE id = $1",
        plain,
    )
    .await;
    sqlx::query("SELECT * FROM gd_advance('fan', ARRAY['Leaf'], 10, 'gone-node', 1, NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE gd_batches SET expires_at = now() - interval '1 hour'")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query("SELECT * FROM gd_reap_batches(10, NULL, 1)")
        .execute(db.pool())
        .await
        .unwrap();
    assert_eq!(status(db.pool(), plain).await, "failed");

    // A cancelled plain row its node gives back.
    let cancelled = gd.insert::<Leaf>(Count::default()).await.unwrap();
    orphan(&db, cancelled).await;
    sqlx::query("SELECT * FROM gd_advance('fan', ARRAY['Leaf'], 10, 'gone-node', 60000, NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    exec(
        "UPDATE gd_instances SET cancel_requested = true WHERE id = $1",
        cancelled,
    )
    .await;
    sqlx::query(
        "SELECT * FROM gd_release(ARRAY[$1::int8],
                                  ARRAY[(SELECT ready_seq FROM gd_instances WHERE id = $1)],
                                  'gone-node', NULL)",
    )
    .bind(cancelled)
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(status(db.pool(), cancelled).await, "failed");
    assert_eq!(
        column(db.pool(), cancelled, "last_error").await.as_deref(),
        Some("cancelled")
    );
    db.close().await;
}
