//! Run-ahead: a `next` commits durably and the same worker runs the next step
//! under the claim it holds, without a re-pick.

mod common;

use std::time::Duration;

use common::{column, finished, Count, Events};
use gen_durable::prelude::*;
use gen_durable::{DurableState, Entry, Event, QueueConfig, RateLimit, Registry};
use gen_durable_testkit::TestDb;

#[durable_fsm(state = Count, queue = "ahead", run_ahead = true)]
enum Five {
    #[initial]
    A,
    B,
    C,
    D,
    E,
}

#[durable_steps]
impl Five {
    async fn a(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push(format!("a@{}", ctx.attempt()));
        Ok(Step::next(Five::B))
    }
    async fn b(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push("b".into());
        Ok(Step::next(Five::C))
    }
    async fn c(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push("c".into());
        Ok(Step::next(Five::D))
    }
    async fn d(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push("d".into());
        Ok(Step::next(Five::E))
    }
    async fn e(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push("e".into());
        Ok(Step::done(json!(ctx.state.log)))
    }
}

#[durable_fsm(state = Count, queue = "ahead")]
enum PerOutcome {
    #[initial]
    First,
    Second,
    Third,
}

#[durable_steps]
impl PerOutcome {
    async fn first(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(PerOutcome::Second).run_ahead())
    }
    async fn second(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        // Not run ahead: handed back and picked again.
        Ok(Step::next(PerOutcome::Third))
    }
    async fn third(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!("ok")))
    }
}

fn picks_for(events: &Events) -> usize {
    events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::PickStop { count, .. } => Some(*count),
            _ => None,
        })
        .sum()
}

#[tokio::test]
async fn five_steps_run_on_one_claim_and_each_commits() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<Five>(Count::default()).await.unwrap();
    let events = Events::default();
    let mut reg = Registry::new();
    reg.register::<Five>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue_with(
            "ahead",
            QueueConfig::new(2).with_poll_interval(Duration::from_millis(50)),
        )
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        column(db.pool(), id, "result").await.as_deref(),
        Some(r#"["a@0", "b", "c", "d", "e"]"#)
    );
    // One claim for five steps, and every step's outcome was committed (a step.stop each).
    assert_eq!(picks_for(&events), 1);
    let kinds: Vec<gen_durable::OutcomeKind> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::StepStop { kind, .. } => Some(*kind),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["next", "next", "next", "next", "done"]);
    assert_eq!(column(db.pool(), id, "locked_by").await, None);
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn run_ahead_per_outcome() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<PerOutcome>(Count::default()).await.unwrap();
    let events = Events::default();
    let mut reg = Registry::new();
    reg.register::<PerOutcome>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue_with(
            "ahead",
            QueueConfig::new(2).with_poll_interval(Duration::from_millis(50)),
        )
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");
    assert_eq!(
        picks_for(&events),
        2,
        "first+second on one claim, third on another"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// The state of `Routed`: which transition `a` takes, and the tenant its keys name.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Routing {
    mode: String,
    tenant: String,
}

impl DurableState for Routing {
    const TYPE_NAME: &'static str = "Routing";
}

#[durable_fsm(state = Routing, queue = "ahead", run_ahead = true)]
enum Routed {
    #[initial]
    A,
    B,
    Charge,
    C,
}

#[durable_steps]
impl Routed {
    async fn a(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(match ctx.state.mode.as_str() {
            "key" => Step::next(Routed::B).partition_key(format!("k-{}", ctx.state.tenant)),
            "off" => Step::next(Routed::B).no_run_ahead(),
            "rate" => Step::next(Routed::Charge),
            _ => Step::next(Routed::B),
        })
    }
    async fn b(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Routed::C))
    }
    #[step(rate_limit = "ra-stripe", key = tenant)]
    async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Routed::C))
    }
    async fn c(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

/// What run-ahead did after each step of instance `id`: `continue a->b` or
/// `yield a->b (reason)`, in order.
fn chain_of(events: &Events, id: i64) -> Vec<String> {
    events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::RunAheadContinue {
                id: i, from, to, ..
            } if *i == id => Some(format!("continue {from}->{to}")),
            Event::RunAheadYield {
                id: i,
                step,
                to,
                reason,
                ..
            } if *i == id => Some(format!("yield {step}->{to} ({})", reason.as_str())),
            _ => None,
        })
        .collect()
}

/// Run-ahead never runs inline a step that needs what the claim does not hold — a new
/// K = 1 key (`contended`), tokens of the step's declared rate limit (`throttled`) — nor
/// after `.no_run_ahead()` (`off`): the row goes back to the picker, and the chain goes on
/// from the next claim. A transition that keeps the key runs ahead.
#[tokio::test]
async fn run_ahead_yields_to_the_picker_for_a_new_key_tokens_or_no_run_ahead() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let mut reg = Registry::new();
    reg.register::<Routed>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .rate_limit("ra-stripe", RateLimit::per(100, Duration::from_secs(1)))
        .queue_with(
            "ahead",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(50)),
        )
        .on_event(events.handler())
        .start()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for mode in ["same", "key", "off", "rate"] {
        let state = Routing {
            mode: mode.into(),
            tenant: "acme".into(),
        };
        ids.push(gd.insert::<Routed>(state).await.unwrap());
    }
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 10).await, "done");
    }
    let chains: Vec<Vec<String>> = ids.iter().map(|&id| chain_of(&events, id)).collect();
    assert_eq!(
        chains,
        [
            vec!["continue a->b", "continue b->c"],
            vec!["yield a->b (contended)", "continue b->c"],
            vec!["yield a->b (off)", "continue b->c"],
            vec!["yield a->charge (throttled)", "continue charge->c"],
        ]
    );
    // The key taken in the transition is the row's; `charge` paid its declared limit's
    // key, `tenant` from the state.
    assert_eq!(
        column(db.pool(), ids[1], "partition_key").await.as_deref(),
        Some("k-acme")
    );
    let buckets = gd.rate_limits().await.unwrap();
    assert!(
        buckets
            .iter()
            .any(|b| b.name == "ra-stripe" && b.key.as_deref() == Some("acme")),
        "{buckets:?}"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// A run-ahead `next` changes no column an index reads (its row stays `executing`, keeps
/// its eligibility, and `updated_at` is in no index since migration 0014), so PostgreSQL
/// updates the row in place (HOT) whenever its page has room: no new entry in any index.
/// Before migration 0014 none of these updates was HOT.
#[tokio::test]
async fn run_ahead_steps_update_their_row_in_place() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let n = 200;
    let ids = gd
        .insert_all::<Five>((0..n).map(|_| Entry::new(Count::default())))
        .await
        .unwrap();
    let mut reg = Registry::new();
    reg.register::<Five>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue("ahead", 16)
        .start()
        .await
        .unwrap();
    for id in ids {
        assert_eq!(finished(db.pool(), id, 20).await, "done");
    }
    engine.shutdown(Duration::from_secs(5)).await;
    // Each instance: a claim, four run-ahead `next`s, a `done`. The statistics reach
    // pg_stat_user_tables within a second or so of each backend's last transaction.
    let continues = 4 * n as i64;
    let hot = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'gd_instances'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while hot().await < continues / 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hot = hot().await;
    assert!(
        hot >= continues / 2,
        "{hot} HOT updates for {continues} run-ahead steps"
    );
    db.close().await;
}

/// Step `a` of [`Paused`] has started; the test lets it finish with [`RELEASE`].
static STARTED: tokio::sync::Notify = tokio::sync::Notify::const_new();
static RELEASE: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[durable_fsm(state = Count, queue = "ahead-paused", run_ahead = true)]
enum Paused {
    #[initial]
    A,
    B,
    C,
}

#[durable_steps]
impl Paused {
    async fn a(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        STARTED.notify_one();
        RELEASE.notified().await;
        Ok(Step::next(Paused::B))
    }
    async fn b(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push("b".into());
        Ok(Step::next(Paused::C))
    }
    async fn c(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.log.push("c".into());
        Ok(Step::done(json!(ctx.state.log)))
    }
}

/// R4-3: a queue paused while a run-ahead instance runs stops it at its next step: the
/// `next` commits, and the row goes back to its queue, runnable at `b`, instead of
/// running every further step to `done` while the queue is paused. Resuming runs the
/// rest.
#[tokio::test]
async fn r4_3_a_pause_stops_a_run_ahead_instance_at_its_next_step() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<Paused>(Count::default()).await.unwrap();
    let mut reg = Registry::new();
    reg.register::<Paused>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .queue_with(
            "ahead-paused",
            QueueConfig::new(2).with_poll_interval(Duration::from_millis(50)),
        )
        .start()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), STARTED.notified())
        .await
        .expect("step a started");
    assert!(gd.pause_queue("ahead-paused", None).await.unwrap());
    RELEASE.notify_one();
    let pool = db.pool();
    common::eventually_or_show(
        10,
        "the row back in its queue at b",
        || async move {
            column(pool, id, "step").await.as_deref() == Some("b")
                && common::status(pool, id).await == "runnable"
        },
        || common::show_instance(pool, id),
    )
    .await;
    assert_eq!(column(pool, id, "locked_by").await, None);
    assert!(gd.resume_queue("ahead-paused").await.unwrap());
    assert_eq!(finished(pool, id, 10).await, "done");
    assert_eq!(
        column(pool, id, "result").await.as_deref(),
        Some(r#"["b", "c"]"#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
