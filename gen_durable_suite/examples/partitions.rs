//! Per-account serialization with `partition_key`: instances that share a key never run
//! steps at the same time, on any number of nodes, while other keys run in parallel.
//!
//! Each posting to an account is an instance with two steps (`debit`, then `settle`),
//! each taking a little while. Several postings per account are inserted at once into a
//! queue with room for many steps; the example records which steps overlap in time and
//! shows that steps of one account never do, while different accounts do.
//!
//! ```sh
//! cargo run --example partitions          # 4 accounts × 8 postings
//! cargo run --example partitions -- 3     # 4 accounts × 3 postings (the CI smoke size)
//! ```
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates. Ctrl-C drains.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use gen_durable::prelude::*;
use gen_durable::Event;

const ACCOUNTS: u64 = 4;

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct PostingState {
    pub account: u64,
    pub amount: i64,
}

#[durable_fsm(state = PostingState, queue = "ledger")]
pub enum Posting {
    #[initial]
    Debit,
    Settle,
}

/// Steps running right now, per account, and the most seen at once: per account (must
/// stay 1) and overall (shows that accounts do run in parallel).
static RUNNING: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);
static MAX_PER_ACCOUNT: AtomicUsize = AtomicUsize::new(0);
static RUNNING_ALL: AtomicUsize = AtomicUsize::new(0);
static MAX_ALL: AtomicUsize = AtomicUsize::new(0);

/// Marks a step of `account` as running for as long as it lives.
struct Running(u64);

impl Running {
    fn start(account: u64) -> Running {
        let mut running = RUNNING.lock().unwrap();
        let now = running
            .get_or_insert_with(HashMap::new)
            .entry(account)
            .or_default();
        *now += 1;
        MAX_PER_ACCOUNT.fetch_max(*now, Ordering::SeqCst);
        if *now > 1 {
            println!("  !! account {account}: {now} steps at once");
        }
        let all = RUNNING_ALL.fetch_add(1, Ordering::SeqCst) + 1;
        MAX_ALL.fetch_max(all, Ordering::SeqCst);
        Running(account)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap();
        if let Some(n) = running.get_or_insert_with(HashMap::new).get_mut(&self.0) {
            *n -= 1;
        }
        RUNNING_ALL.fetch_sub(1, Ordering::SeqCst);
    }
}

#[durable_steps]
impl Posting {
    async fn debit(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let (account, amount) = (ctx.state.account, ctx.state.amount);
        let _running = Running::start(account);
        println!(
            "  account {account}: posting {} debit {amount:>4} …",
            ctx.id()
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        Ok(Step::next(Posting::Settle))
    }

    async fn settle(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let account = ctx.state.account;
        let _running = Running::start(account);
        tokio::time::sleep(Duration::from_millis(20)).await;
        println!("  account {account}: posting {} settled", ctx.id());
        Ok(Step::done(
            json!({ "account": account, "amount": ctx.state.amount }),
        ))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_account = common::size_arg(8);
    let pool = common::connect().await?;

    let contended = std::sync::Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder(pool.clone())
        .queue("ledger", 16)
        .on_event({
            let contended = contended.clone();
            move |e| {
                if let Event::PartitionContended { count, .. } = e {
                    contended.fetch_add(*count, Ordering::Relaxed);
                }
            }
        })
        .start()
        .await?;

    let gd = Client::new(pool.clone());
    let mut ids = Vec::new();
    for i in 0..per_account {
        for account in 1..=ACCOUNTS {
            let amount = (account * 10 + i) as i64;
            let id = gd
                .insert::<Posting>(PostingState { account, amount })
                .partition_key(format!("account:{account}"))
                .await?;
            ids.push(id);
        }
    }
    println!(
        "inserted {} postings over {ACCOUNTS} accounts (partition_key \"account:N\")",
        ids.len()
    );

    let waited = common::wait_for(&pool, &ids, |_| {}).await?;
    let report = engine.shutdown(Duration::from_secs(10)).await;
    common::print_drain(&report);

    let per_account_max = MAX_PER_ACCOUNT.load(Ordering::SeqCst);
    println!(
        "\nmost steps of one account at once: {per_account_max} (never more than 1)\n\
         most steps of all accounts at once: {} (accounts run side by side)\n\
         picks that skipped a busy account: {}",
        MAX_ALL.load(Ordering::SeqCst),
        contended.load(Ordering::Relaxed)
    );
    if per_account_max > 1 {
        return Err("steps of one account overlapped".into());
    }
    if waited == common::Waited::Finished {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM gd_instances WHERE id = ANY($1) AND status = 'done'",
        )
        .bind(&ids)
        .fetch_one(&pool)
        .await?;
        println!("{done} of {} postings done", ids.len());
    }
    Ok(())
}
