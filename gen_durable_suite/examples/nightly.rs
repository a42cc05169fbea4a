//! Periodic schedules: two engines (two nodes of one deployment) declare the same
//! schedule; each fire time inserts exactly one `build_report` job, whichever node takes
//! it. The demo fires every two seconds instead of every night.
//!
//! ```sh
//! cargo run --example nightly          # 5 fire times
//! cargo run --example nightly -- 3     # 3 fire times (the CI smoke size)
//! ```
//! In production the schedule would read
//! `Schedule::cron("nightly-report", "0 2 * * *", ..)?.with_timezone(Tz::Europe__Paris)`.
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use gen_durable::prelude::*;
use gen_durable::{CatchUp, Entry, Event, Schedule};
use tokio::sync::mpsc;

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct ReportArgs {
    /// The fire time the report is for.
    pub period: String,
}

#[durable_job(queue = "reports")]
async fn build_report(args: ReportArgs, _ctx: &mut JobCtx) -> JobResult {
    Ok(json!({ "report_for": args.period }))
}

const NAME: &str = "report-every-2s";

/// The schedule both nodes declare.
fn every_two_seconds() -> gen_durable::Result<Schedule> {
    Ok(Schedule::cron(NAME, "*/2 * * * * *", |fire| {
        Entry::<BuildReport>::new(ReportArgs {
            period: fire.to_rfc3339(),
        })
    })?
    .with_catch_up(CatchUp::RunOnce))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fires = common::size_arg(5) as usize;
    let pool = common::connect().await?;
    // A new demo: forget earlier runs' schedule and reports.
    sqlx::query("DELETE FROM gd_schedules WHERE name = $1")
        .bind(NAME)
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM gd_instances WHERE unique_key LIKE $1")
        .bind(format!("gd:schedule:{NAME}:%"))
        .execute(&pool)
        .await?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut nodes = Vec::new();
    for node in ["node-a", "node-b"] {
        let tx = tx.clone();
        let engine = Engine::builder(pool.clone())
            .with_node_id(node)
            .queue("reports", 4)
            .schedule(every_two_seconds()?)
            .on_event(move |e| {
                if let Event::ScheduleFired { fire_time, id, .. } = e {
                    let _ = tx.send((node, *fire_time, *id));
                }
            })
            .start()
            .await?;
        nodes.push(engine);
    }
    println!("two nodes declare {NAME:?}; waiting for {fires} fire times");

    let mut by_time = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2 * fires as u64 + 15);
    while by_time.len() < fires {
        let (node, fire, id) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| "the schedule did not fire in time")?
            .ok_or("the engines stopped")?;
        println!("  {fire}  fired by {node}: instance {id:?}");
        assert!(
            by_time.insert(fire, id).is_none(),
            "fire time {fire} fired twice"
        );
    }
    for engine in nodes {
        engine.shutdown(Duration::from_secs(10)).await;
    }

    // One row per fire time, whichever node fired it.
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE unique_key LIKE $1")
            .bind(format!("gd:schedule:{NAME}:%"))
            .fetch_one(&pool)
            .await?;
    let fired: usize = by_time.len() + rx.len();
    assert_eq!(rows as usize, fired, "one instance per fire time");
    println!("{fired} fire times, {rows} reports: one each");
    Ok(())
}
