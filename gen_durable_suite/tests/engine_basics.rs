//! The engine runs steps and commits each outcome as the outcome table says.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::scenario::{int_col, q, ran, reg, reset_runs, row, runs, serial, wait_until};
use common::{column, count, eventually, finished, status, Count, Events};
use gen_durable::{Client, Engine, Entry, Event, QueueConfig, Registry, Step, StepError};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(Counter, state = Count, queue = "counting", version = 1, {
    A => "a" |ctx| { ctx.state.n += 1; ctx.state.log.push("a".into()); Ok(Step::next(Counter::B)) },
    B => "b" |ctx| { ctx.state.n += 10; ctx.state.log.push("b".into()); Ok(Step::next(Counter::C)) },
    C => "c" |ctx| { ctx.state.n += 100; ctx.state.log.push("c".into()); Ok(Step::done(json!({ "total": ctx.state.n }))) },
});

test_fsm!(Other, state = Count, queue = "other", version = 1, {
    Only => "only" |ctx| { ctx.state.log.push(format!("other-{}", ctx.id())); Ok(Step::done(json!(null))) },
});

test_fsm!(Replayer, state = Count, queue = "counting", version = 1, {
    Go => "go" |ctx| {
        ctx.state.log.push(format!("attempt {}", ctx.attempt()));
        if ctx.attempt() < 2 { Ok(Step::replay(Duration::from_millis(50))) } else { Ok(Step::next(Replayer::Fin)) }
    },
    Fin => "fin" |ctx| { Ok(Step::done(json!({ "attempt_at_fin": ctx.attempt() }))) },
});

test_fsm!(Failing, state = Count, queue = "counting", version = 1, {
    Err => "err" |_ctx| { Err(StepError::new("boom")) },
    Panic => "panic" |_ctx| { panic!("kaboom") },
    HandleFails => "handle_fails" |_ctx| { Err(StepError::new("first")) },
}, handle |err, ctx| {
    if ctx.step() == "handle_fails" { return Err(StepError::new("handle broke")); }
    Ok(Step::done(json!({ "handled": err.to_string(), "panic": err.is_panic() })))
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Counter>();
    r.register::<Other>();
    r.register::<Replayer>();
    r.register::<Failing>();
    r
}

fn fast(q: usize) -> QueueConfig {
    QueueConfig::new(q).with_poll_interval(Duration::from_millis(50))
}

async fn engine(db: &TestDb, events: &Events) -> Engine {
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("counting", fast(4))
        .queue_with("other", fast(2))
        .on_event(events.handler())
        .start()
        .await
        .expect("engine starts")
}

#[tokio::test]
async fn a_three_step_counter_reaches_done() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let id = gd.insert::<Counter>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "state->>'n'").await.as_deref(),
        Some("111")
    );
    assert_eq!(
        column(db.pool(), id, "state->'log'").await.as_deref(),
        Some(r#"["a", "b", "c"]"#)
    );
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"total": 111}"#)
    );
    assert_eq!(column(db.pool(), id, "locked_by").await, None);
    let kinds: Vec<gen_durable::OutcomeKind> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::StepStop { id: i, kind, .. } if *i == id => Some(*kind),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["next", "next", "done"]);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn two_queues_are_served_by_their_own_pickers() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let a = gd.insert::<Counter>(Count::default()).await.unwrap();
    let b = gd.insert::<Other>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), a, 10).await, "done");
    assert_eq!(finished(db.pool(), b, 10).await, "done");
    let queues: std::collections::HashSet<String> = events
        .all()
        .into_iter()
        .filter_map(|e| match e {
            Event::PickStop { queue, count, .. } if count > 0 => Some(queue),
            _ => None,
        })
        .collect();
    assert!(
        queues.contains("counting") && queues.contains("other"),
        "{queues:?}"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn priority_zero_runs_before_priority_five() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let low = gd
        .insert::<Other>(Count::default())
        .priority(5)
        .await
        .unwrap();
    let high = gd
        .insert::<Other>(Count::default())
        .priority(0)
        .await
        .unwrap();
    let events = Events::default();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("other", fast(1))
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    finished(db.pool(), low, 10).await;
    let order: Vec<i64> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::StepStop { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(order, vec![high, low]);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_scheduled_instance_does_not_run_early() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let later = gd
        .insert::<Other>(Count::default())
        .schedule_in(Duration::from_millis(1500))
        .await
        .unwrap();
    let now = gd.insert::<Other>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), now, 10).await, "done");
    assert_eq!(
        status(db.pool(), later).await,
        "runnable",
        "not eligible yet"
    );
    assert_eq!(finished(db.pool(), later, 10).await, "done");
    let ran_after: bool =
        sqlx::query_scalar("SELECT updated_at >= eligible_at FROM gd_instances WHERE id = $1")
            .bind(later)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(ran_after);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn replay_counts_attempts_and_next_resets_them() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let id = gd.insert::<Replayer>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "state->'log'").await.as_deref(),
        Some(r#"["attempt 0", "attempt 1", "attempt 2"]"#)
    );
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"{"attempt_at_fin": 0}"#)
    );
    // Each replay waited its delay: three runs took at least 2 × 50 ms.
    let secs: f64 = sqlx::query_scalar("SELECT extract(epoch FROM updated_at - inserted_at)::float8 FROM gd_instances WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert!(secs >= 0.1, "took {secs}s");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn handle_receives_errors_and_panics_and_a_failing_handle_fails() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let e = gd
        .insert::<Failing>(Count::default())
        .step("err")
        .await
        .unwrap();
    let p = gd
        .insert::<Failing>(Count::default())
        .step("panic")
        .await
        .unwrap();
    let h = gd
        .insert::<Failing>(Count::default())
        .step("handle_fails")
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), e, 10).await, "done");
    assert_eq!(
        column(db.pool(), e, "result").await.as_deref(),
        Some(r#"{"panic": false, "handled": "boom"}"#)
    );
    assert_eq!(finished(db.pool(), p, 10).await, "done");
    assert_eq!(
        column(db.pool(), p, "result").await.as_deref(),
        Some(r#"{"panic": true, "handled": "step panicked: kaboom"}"#)
    );
    assert_eq!(finished(db.pool(), h, 10).await, "failed");
    let err = column(db.pool(), h, "last_error").await.unwrap();
    assert!(
        err.contains("first") && err.contains("handle broke"),
        "{err}"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn invalid_config_is_an_error_at_start() {
    let db = TestDb::new().await;
    let bad = [
        Engine::builder(db.pool().clone())
            .with_registry(registry())
            .start()
            .await
            .err(),
        Engine::builder(db.pool().clone())
            .with_registry(registry())
            .queue("q", 0)
            .start()
            .await
            .err(),
        Engine::builder(db.pool().clone())
            .with_registry(registry())
            .queue("q", 1)
            .queue("q", 2)
            .start()
            .await
            .err(),
        Engine::builder(db.pool().clone())
            .with_registry(registry())
            .queue("q", 1)
            .with_lease_ttl(Duration::from_millis(10))
            .start()
            .await
            .err(),
        Engine::builder(db.pool().clone())
            .with_registry(registry())
            .queue_with("q", QueueConfig::new(2).with_min_demand(5))
            .start()
            .await
            .err(),
        Engine::builder(db.pool().clone())
            .with_registry(Registry::new())
            .queue("q", 1)
            .start()
            .await
            .err(),
    ];
    for (i, e) in bad.iter().enumerate() {
        assert!(
            matches!(e, Some(gen_durable::Error::InvalidConfig(_))),
            "case {i}: {e:?}"
        );
    }
    eventually(1, "nothing was started", || async { true }).await;
    db.close().await;
}

/// The smallest pool the engine accepts (2: one for LISTEN, one shared by the claims and
/// the commits) runs at full speed: the committer never keeps a connection the pool
/// cannot spare. (Keeping it while idle once cut this to ~30 steps/s: every claim waited
/// out the committer's hold.)
#[tokio::test]
async fn a_pool_of_two_is_not_starved_by_the_committer() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let rows: Vec<gen_durable::Entry<Counter>> = (0..300)
        .map(|_| gen_durable::Entry::new(Count::default()))
        .collect();
    gd.insert_all::<Counter>(rows).await.unwrap();
    let pool = db.new_pool(2).await;
    let engine = Engine::builder(pool.clone())
        .with_registry(registry())
        .queue("counting", 8)
        .start()
        .await
        .unwrap();
    // 900 steps; starved, they would take about half a minute.
    eventually(
        8,
        "300 three-step instances done on a pool of 2",
        || async {
            common::count(
                db.pool(),
                "SELECT count(*) FROM gd_instances WHERE status = 'done'",
            )
            .await
                == 300
        },
    )
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    db.close().await;
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
