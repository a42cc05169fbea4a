//! Fan-out and fan-in: a parent schedules N children (default 1,000) with
//! `Step::schedule_children`, parks until every one of them has ended, then reads their
//! outcomes in `ctx.children()` and aggregates them. A few children fail on purpose: the
//! barrier waits for the end of each child, not for its success, and the parent decides.
//!
//! ```sh
//! cargo run --example fan_out            # 1,000 children
//! cargo run --example fan_out -- 50      # 50 children (the CI smoke size)
//! ```
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates. Ctrl-C drains.

mod common;

use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::Event;

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct BatchState {
    pub children: u64,
}

/// The parent: split the work, then sum it up.
#[durable_fsm(state = BatchState, queue = "fan_out")]
pub enum Batch {
    #[initial]
    Split,
    Sum,
}

#[durable_steps]
impl Batch {
    async fn split(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let children: Vec<Child> = (1..=ctx.state.children)
            .map(|n| Child::new::<Square>(SquareState { n }))
            .collect();
        println!(
            "  [{}] split: scheduling {} children",
            ctx.id(),
            children.len()
        );
        Ok(Step::schedule_children(children, Batch::Sum))
    }

    async fn sum(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let children = ctx.children();
        let sum: u64 = children
            .iter()
            .filter_map(|c| c.result.as_ref().and_then(|r| r["square"].as_u64()))
            .sum();
        let failed: Vec<i64> = children
            .iter()
            .filter(|c| c.status == Status::Failed)
            .map(|c| c.id)
            .collect();
        println!(
            "  [{}] sum: {} children ended, {} failed; sum of squares {sum}",
            ctx.id(),
            children.len(),
            failed.len()
        );
        Ok(Step::done(json!({
            "children": children.len(),
            "failed": failed.len(),
            "sum_of_squares": sum,
        })))
    }
}

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct SquareState {
    pub n: u64,
}

/// A child: squares its number, except every 250th, which fails.
#[durable_fsm(state = SquareState, queue = "fan_out")]
pub enum Square {
    #[initial]
    Compute,
}

#[durable_steps]
impl Square {
    async fn compute(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let n = ctx.state.n;
        if n.is_multiple_of(250) {
            return Ok(Step::stop(format!("{n} is unlucky")));
        }
        Ok(Step::done(json!({ "square": n * n })))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let children = common::size_arg(1_000);
    let pool = common::connect().await?;

    let engine = Engine::builder(pool.clone())
        .queue("fan_out", 16)
        .on_event(|e| {
            // Children are too many to print one by one; the parent's steps and the
            // children that fail are worth a line.
            if let Event::StepStop { id, fsm, kind, .. } = e {
                if *fsm == "Square" && *kind == "stop" {
                    println!("  [{id}] child failed (on purpose)");
                }
            }
        })
        .start()
        .await?;

    let started = Instant::now();
    let gd = Client::new(pool.clone());
    let parent = gd.insert::<Batch>(BatchState { children }).await?;
    println!("inserted parent {parent} with {children} children to schedule");

    // Progress, once a second: how many children have ended so far.
    let ticker = {
        let pool = pool.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let ended: Result<i64, _> = sqlx::query_scalar(
                    "SELECT count(*) FROM gd_instances
                      WHERE parent_id = $1 AND status IN ('done', 'failed')",
                )
                .bind(parent)
                .fetch_one(&pool)
                .await;
                if let Ok(n) = ended {
                    println!("  … {n}/{children} children ended");
                }
            }
        })
    };
    // The parent is the only id to wait for: it ends after all of its children.
    let waited = common::wait_for(&pool, &[parent], |_| {}).await;
    ticker.abort();
    let waited = waited?;
    let report = engine.shutdown(Duration::from_secs(10)).await;
    common::print_drain(&report);

    let (status, result, pending): (String, Option<serde_json::Value>, i32) = sqlx::query_as(
        "SELECT status::text, result, children_pending FROM gd_instances WHERE id = $1",
    )
    .bind(parent)
    .fetch_one(&pool)
    .await?;
    let by_status: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status::text, count(*) FROM gd_instances WHERE parent_id = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(parent)
    .fetch_all(&pool)
    .await?;
    println!("\nparent {parent}: {status}, children still pending: {pending}");
    for (s, n) in &by_status {
        println!("  children {s:<17} {n:>6}");
    }
    if waited == common::Waited::Finished {
        let expected: u64 = (1..=children)
            .filter(|n| !n.is_multiple_of(250))
            .map(|n| n * n)
            .sum();
        let result = result.unwrap_or_default();
        println!("result: {result}");
        if result["sum_of_squares"].as_u64() != Some(expected) {
            return Err(format!("expected a sum of squares of {expected}").into());
        }
        println!("matches the expected sum of squares");
        println!("{} steps in {:.2?}", children + 2, started.elapsed());
    } else {
        println!("interrupted: run it again and the engine picks up where it stopped");
    }
    Ok(())
}
