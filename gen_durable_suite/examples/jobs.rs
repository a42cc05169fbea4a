//! The job form (`#[durable_job]`): one-step background work with retries.
//!
//! - `charge_card` hits a timeout on its first run, is retried after a backoff, and
//!   succeeds on its second run;
//! - `sync_inventory` always fails: after `max_attempts = 3` runs it gives up and the
//!   instance fails with the last error;
//! - `send_receipt` to an address that cannot work ends at once with
//!   `JobError::Fail`, without retrying; the other receipts are sent.
//!
//! ```sh
//! cargo run --example jobs             # 20 receipts besides the three jobs above
//! cargo run --example jobs -- 3        # 3 receipts (the CI smoke size)
//! ```
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates. Ctrl-C drains.

mod common;

use std::time::Duration;

use gen_durable::prelude::*;
use gen_durable::{Event, OutcomeKind};

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct Charge {
    pub order: u64,
    pub cents: u64,
}

/// Retried with a capped exponential backoff (at most 1 s here, to keep the demo short).
#[durable_job(queue = "jobs", max_attempts = 5, max_backoff_secs = 1)]
async fn charge_card(args: Charge, ctx: &mut JobCtx) -> JobResult {
    if ctx.attempt() == 0 {
        println!(
            "  charge_card  order {}: run 1 — card network timed out",
            args.order
        );
        return Err(JobError::retry("card network timed out"));
    }
    println!(
        "  charge_card  order {}: run {} — charged {} cents",
        args.order,
        ctx.attempt() + 1,
        args.cents
    );
    Ok(json!({ "charged": args.cents, "runs": ctx.attempt() + 1 }))
}

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct Sync {
    pub warehouse: String,
}

/// Never succeeds: gives up after three runs.
#[durable_job(queue = "jobs", max_attempts = 3, max_backoff_secs = 1)]
async fn sync_inventory(args: Sync, ctx: &mut JobCtx) -> JobResult {
    println!(
        "  sync_inventory {}: run {} — warehouse API is down",
        args.warehouse,
        ctx.attempt() + 1
    );
    Err(JobError::retry("warehouse API is down"))
}

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct Receipt {
    pub email: String,
}

/// An address without `@` can never work: cancel instead of retrying.
#[durable_job(queue = "jobs")]
async fn send_receipt(args: Receipt, _ctx: &mut JobCtx) -> JobResult {
    if !args.email.contains('@') {
        println!("  send_receipt {}: not an address, cancelled", args.email);
        return Err(JobError::fail(format!(
            "{:?} is not an email address",
            args.email
        )));
    }
    Ok(json!({ "sent_to": args.email }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let receipts = common::size_arg(20);
    let pool = common::connect().await?;

    let engine = Engine::builder(pool.clone())
        .queue("jobs", 8)
        .on_event(|e| {
            if let Event::StepStop { id, fsm, kind, .. } = e {
                let what = match *kind {
                    OutcomeKind::Replay => "will retry after a backoff",
                    OutcomeKind::Stop => "failed for good",
                    _ => return,
                };
                println!("  [{id}] {fsm}: {what}");
            }
        })
        .start()
        .await?;

    let gd = Client::new(pool.clone());
    let mut ids = vec![
        (
            "charge_card",
            gd.insert::<ChargeCard>(Charge {
                order: 7,
                cents: 4_200,
            })
            .await?,
        ),
        (
            "sync_inventory",
            gd.insert::<SyncInventory>(Sync {
                warehouse: "north".into(),
            })
            .await?,
        ),
        (
            "send_receipt",
            gd.insert::<SendReceipt>(Receipt {
                email: "nobody".into(),
            })
            .await?,
        ),
    ];
    for n in 1..=receipts {
        let id = gd
            .insert::<SendReceipt>(Receipt {
                email: format!("customer{n}@example.com"),
            })
            .await?;
        ids.push(("send_receipt", id));
    }
    println!("inserted {} jobs", ids.len());

    let all: Vec<i64> = ids.iter().map(|(_, id)| *id).collect();
    let waited = common::wait_for(&pool, &all, |_| {}).await?;
    let report = engine.shutdown(Duration::from_secs(10)).await;
    common::print_drain(&report);

    /// One job as stored: id, status, attempt, result, last_error.
    type JobRow = (i64, String, i32, Option<String>, Option<String>);
    let rows: Vec<JobRow> = sqlx::query_as(
        "SELECT id, status::text, attempt, result::text, last_error
           FROM gd_instances WHERE id = ANY($1) ORDER BY id",
    )
    .bind(&all)
    .fetch_all(&pool)
    .await?;
    println!(
        "\n{:>6}  {:<15}  {:<7}  {:>4}  result / error",
        "id", "job", "status", "runs"
    );
    for (id, status, attempt, result, error) in rows.iter().take(6) {
        let job = ids.iter().find(|(_, i)| i == id).map_or("?", |(j, _)| j);
        println!(
            "{id:>6}  {job:<15}  {status:<7}  {:>4}  {}",
            attempt + 1,
            result.clone().or(error.clone()).unwrap_or_default()
        );
    }
    if rows.len() > 6 {
        println!("   … and {} more receipts", rows.len() - 6);
    }
    let done = rows.iter().filter(|r| r.1 == "done").count();
    println!("\n{done} done, {} failed", rows.len() - done);
    if waited == common::Waited::Finished && done != rows.len() - 2 {
        return Err("expected every job but sync_inventory and the bad receipt to succeed".into());
    }
    Ok(())
}
