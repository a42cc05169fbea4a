//! Await and signals through the engine: wake on a match, no lost wake-up,
//! consumption by id, timeouts.

mod common;

use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::scenario::{reg, serial, wait_until};
use common::{column, count, eventually, finished, status, Count};
use gen_durable::{Client, Engine, Entry, Error, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(Waiter, state = Count, queue = "w", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Waiter::Use)) },
    Use => "use" |ctx| {
        let v = ctx.awaited().first().map(|s| s.payload()["v"].clone());
        Ok(Step::done(json!({ "v": v, "attempt": ctx.attempt() })))
    },
});

test_fsm!(Branch, state = Count, queue = "w", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["approve", "reject"], Branch::Decide)) },
    Decide => "decide" |ctx| { Ok(Step::done(json!(ctx.awaited()[0].name.clone()))) },
});

test_fsm!(Acc, state = Count, queue = "w", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["a", "b", "c"], Acc::Add)) },
    Add => "add" |ctx| {
        // Re-awaiting consumes nothing: each wake sees every signal so far.
        ctx.state.log.push(format!("woke with {}", ctx.awaited().len()));
        let got = ctx.awaited();
        if got.len() < 3 { return Ok(Step::await_signal(["a", "b", "c"], Acc::Add)); }
        let sum: i64 = got.iter().map(|s| s.payload()["x"].as_i64().unwrap()).sum();
        Ok(Step::done(json!({ "sum": sum, "count": got.len() })))
    },
});

test_fsm!(Timed, state = Count, queue = "w", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["late"], Timed::After).timeout(Duration::from_millis(300))) },
    After => "after" |ctx| { Ok(Step::done(json!({ "awaited": ctx.awaited().len(), "attempt": ctx.attempt() }))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Waiter>();
    r.register::<Branch>();
    r.register::<Acc>();
    r.register::<Timed>();
    r
}

async fn engine(db: &TestDb) -> Engine {
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "w",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(50)),
        )
        .with_timeout_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap()
}

async fn parked(db: &TestDb, id: i64) {
    eventually(10, "parked", || async {
        status(db.pool(), id).await == "awaiting_signal"
    })
    .await;
}

#[tokio::test]
async fn a_signal_wakes_a_parked_instance_and_is_consumed() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    parked(&db, id).await;
    gd.signal(id, "go", json!({ "v": 7 })).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"v": 7, "attempt": 0}"#)
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_signal_sent_before_the_instance_parks_still_wakes_it() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<Waiter>(Count::default()).await.unwrap();
    gd.signal(id, "go", json!({ "v": 3 })).await.unwrap();
    let engine = engine(&db).await;
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result->>'v'").await.as_deref(),
        Some("3")
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn an_any_of_await_takes_the_branch_of_the_signal_sent() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Branch>(Count::default()).await.unwrap();
    parked(&db, id).await;
    gd.signal(id, "stray", json!({})).await.unwrap();
    assert_eq!(
        status(db.pool(), id).await,
        "awaiting_signal",
        "a stray name does not wake"
    );
    gd.signal(id, "reject", json!({})).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#""reject""#)
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_signals").await,
        0,
        "the stray signal went with the instance"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn an_accumulator_sums_three_signals_by_re_awaiting() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let id = gd.insert::<Acc>(Count::default()).await.unwrap();
    parked(&db, id).await;
    for (name, x) in [("b", 2), ("a", 1), ("c", 4)] {
        gd.signal(id, name, json!({ "x": x })).await.unwrap();
        // No busy loop: between signals the instance parks again.
        if name != "c" {
            parked(&db, id).await;
        }
    }
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"sum": 7, "count": 3}"#)
    );
    let wakes: i64 = sqlx::query_scalar(
        "SELECT jsonb_array_length(state->'log')::int8 FROM gd_instances WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(wakes <= 3, "woke {wakes} times for 3 signals");
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn an_await_timeout_runs_the_next_step_with_nothing_awaited() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let started = std::time::Instant::now();
    let id = gd.insert::<Timed>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"attempt": 0, "awaited": 0}"#)
    );

    // A signal that arrives first beats the timeout.
    let id = gd.insert::<Timed>(Count::default()).await.unwrap();
    parked(&db, id).await;
    gd.signal(id, "late", json!({})).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"attempt": 0, "awaited": 1}"#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn no_wake_up_is_lost_when_delivery_races_parking() {
    // Many instances park while their signal is delivered at the same moment; every one
    // must finish, whatever the interleaving of the delivery and the await commit.
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = engine(&db).await;
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids.push(gd.insert::<Waiter>(Count::default()).await.unwrap());
    }
    for &id in &ids {
        gd.signal(id, "go", json!({ "v": id })).await.unwrap();
    }
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 20).await, "done", "instance {id}");
    }
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

test_fsm!(Replays, state = Count, queue = "w", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Replays::Use)) },
    Use => "use" |ctx| {
        ctx.state.log.push(format!("saw {}", ctx.awaited().len()));
        if ctx.attempt() == 0 { return Ok(Step::replay(Duration::from_millis(10))); }
        Ok(Step::done(json!(ctx.awaited()[0].payload()["v"].clone())))
    },
});

static GATE: std::sync::OnceLock<std::sync::Arc<tokio::sync::Notify>> = std::sync::OnceLock::new();
static IN_STEP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

test_fsm!(Twice, state = Count, queue = "w2", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Twice::First)) },
    First => "first" |ctx| {
        IN_STEP.store(true, std::sync::atomic::Ordering::SeqCst);
        GATE.get_or_init(Default::default).notified().await;
        ctx.state.log.push(ctx.awaited()[0].payload()["v"].to_string());
        // Progress: consumes exactly what it received (v=1), by id.
        Ok(Step::next(Twice::Again))
    },
    Again => "again" |_ctx| { Ok(Step::await_signal(["go"], Twice::Second)) },
    Second => "second" |ctx| {
        let vs: Vec<String> = ctx.awaited().iter().map(|s| s.payload()["v"].to_string()).collect();
        Ok(Step::done(json!({ "first": ctx.state.log[0].clone(), "second": vs })))
    },
});

#[tokio::test]
async fn a_replay_re_sees_the_awaited_signal() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let engine = Engine::builder(db.pool().clone())
        .with_registry({
            let mut r = registry();
            r.register::<Replays>();
            r
        })
        .queue_with(
            "w",
            QueueConfig::new(2).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();
    let id = gd.insert::<Replays>(Count::default()).await.unwrap();
    parked(&db, id).await;
    gd.signal(id, "go", json!({ "v": 5 })).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(column(db.pool(), id, "result").await.as_deref(), Some("5"));
    assert_eq!(
        column(db.pool(), id, "state->'log'").await.as_deref(),
        Some(r#"["saw 1", "saw 1"]"#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_same_name_signal_arriving_during_the_step_survives_its_consumption() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let mut reg = Registry::new();
    reg.register::<Twice>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue_with(
            "w2",
            QueueConfig::new(1).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();
    let id = gd.insert::<Twice>(Count::default()).await.unwrap();
    parked(&db, id).await;
    gd.signal(id, "go", json!({ "v": 1 })).await.unwrap();
    eventually(10, "first step running", || async {
        IN_STEP.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    // Arrives while `first` runs with only v=1 in its inbox.
    gd.signal(id, "go", json!({ "v": 2 })).await.unwrap();
    GATE.get_or_init(Default::default).notify_one();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    // `first` consumed v=1 only; v=2 survived and woke the next await at once.
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"first": "1", "second": ["2"]}"#)
    );
    assert_eq!(
        common::count(db.pool(), "SELECT count(*) FROM gd_signals").await,
        0
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// `n` instances of `F` and an engine on its queue `queue` (64 at once, polling every
/// 20 ms), for the tests where deliveries race the group commits.
async fn racing<F: gen_durable::Fsm<State = Count>>(
    db: &TestDb,
    n: usize,
    queue: &str,
) -> (Client, Vec<i64>, Engine) {
    let gd = Client::new(db.pool().clone());
    let rows: Vec<gen_durable::Entry<F>> = (0..n)
        .map(|_| gen_durable::Entry::new(Count::default()))
        .collect();
    let ids = gd.insert_all::<F>(rows).await.unwrap();
    let mut registry = Registry::new();
    registry.register::<F>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry)
        .queue_with(
            queue,
            QueueConfig::new(64).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();
    (gd, ids, engine)
}

test_fsm!(Quick, state = Count, queue = "q", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!(1))) },
});

/// `done` deletes the whole inbox, including a signal whose delivery committed while the
/// group commit that finishes its instance was already running (the commit deletes the
/// inbox in a statement of its own, with a fresh snapshot, under the row locks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_delivered_while_instances_finish_leave_no_inbox_behind() {
    let db = TestDb::new().await;
    let n = 600;
    let (gd, ids, engine) = racing::<Quick>(&db, n, "q").await;
    // Four senders sweep the ids over and over while the engine finishes them: many
    // deliveries land on rows that are executing or being committed.
    let mut senders = Vec::new();
    for k in 0..4usize {
        let (gd, ids) = (gd.clone(), ids.clone());
        senders.push(tokio::spawn(async move {
            let (mut stored, mut late) = (0, 0);
            for round in 0..3 {
                for (j, &id) in ids.iter().enumerate().skip((k + round) % 4).step_by(4) {
                    match gd.signal(id, "poke", json!({ "j": j })).await {
                        Ok(_) => stored += 1,
                        Err(gen_durable::Error::Finished { .. }) => late += 1,
                        Err(e) => panic!("delivery to {id}: {e}"),
                    }
                }
            }
            (stored, late)
        }));
    }
    let mut stored = 0;
    for s in senders {
        stored += s.await.unwrap().0;
    }
    eventually(30, "every instance done", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            == n as i64
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    assert!(stored > 0, "some deliveries reached live instances");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_signals").await,
        0,
        "no signal outlives its finished instance ({stored} were stored while they ran)"
    );
    db.close().await;
}

test_fsm!(Parker, state = Count, queue = "p", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Parker::Go)) },
    Go => "go" |ctx| { Ok(Step::done(json!(ctx.awaited().len()))) },
});

/// No lost wake-up under load: each of 600 instances gets one `go` from concurrent
/// senders while the engine parks them, so many deliveries commit while the group
/// commit that parks their instance runs. None may stay parked with its signal in the
/// inbox (the commit re-checks the inbox in a statement of its own, with a fresh
/// snapshot, under the row locks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_racing_the_commits_that_park_wake_every_instance() {
    let db = TestDb::new().await;
    let n = 600;
    let (gd, ids, engine) = racing::<Parker>(&db, n, "p").await;
    let mut senders = Vec::new();
    for k in 0..4usize {
        let (gd, ids) = (gd.clone(), ids.clone());
        senders.push(tokio::spawn(async move {
            for &id in ids.iter().skip(k).step_by(4) {
                gd.signal(id, "go", json!({})).await.unwrap();
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    eventually(30, "nothing runnable or executing", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status IN ('runnable', 'executing')",
        )
        .await
            == 0
    })
    .await;
    let stranded = count(
        db.pool(),
        "SELECT count(*) FROM gd_instances i WHERE i.status = 'awaiting_signal'
            AND EXISTS (SELECT 1 FROM gd_signals s WHERE s.target_id = i.id AND s.name = ANY (i.awaits))",
    )
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        stranded, 0,
        "instances parked with their signal in the inbox"
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done' AND result = '1'"
        )
        .await,
        n as i64
    );
    db.close().await;
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
