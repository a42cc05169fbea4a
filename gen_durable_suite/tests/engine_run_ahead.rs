//! Run-ahead: a `next` commits durably and the same worker runs the next step
//! under the claim it holds, without a re-pick.

mod common;

use std::time::Duration;

use common::{column, finished, Count, Events};
use gen_durable::prelude::*;
use gen_durable::{Event, QueueConfig, Registry};
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
