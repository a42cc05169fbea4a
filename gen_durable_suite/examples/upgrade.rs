//! Instance migrations: release 2 of a subscription workflow changes its state (a price
//! in cents) and renames a step (`notify` becomes `email`), and moves the instances
//! release 1 left in flight instead of keeping v1's code around forever.
//!
//! 1. Release 1 (only v1's code) starts `N` subscriptions; each charges and parks until
//!    its renewal signal. Then it is stopped.
//! 2. A bulk migration (`Client::migrate_instances`, as `gen_durable migrate-instances`
//!    would run it from your binary) moves the parked ones to v2: first a dry run.
//!    One subscription's plan has no price: its transform fails, it stays on v1.
//!    Meanwhile a client still on release 1 inserts `N` more v1 subscriptions.
//! 3. Release 2 (v2's code and the migration, no v1 code) migrates those as it claims
//!    them, then every renewal signal finishes its instance on v2's `email`.
//!
//! ```sh
//! cargo run --example upgrade          # 5 + 5 subscriptions (and one that cannot move)
//! cargo run --example upgrade -- 3     # 3 + 3 (the CI smoke size)
//! ```
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates.

mod common;

use std::time::Duration;

use gen_durable::prelude::*;
use gen_durable::{durable_migration, Event, MigrateOptions, Registry};

/// Release 1 of the workflow, as it was.
mod v1 {
    use gen_durable::prelude::*;

    #[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
    pub struct Sub {
        pub customer: String,
        pub plan: String,
        #[durable(default)]
        pub log: Vec<String>,
    }

    #[durable_fsm(state = Sub, name = "subscription", version = 1, queue = "subs")]
    pub enum Subscription {
        #[initial]
        Charge,
        Notify,
    }

    #[durable_steps]
    impl Subscription {
        async fn charge(ctx: &mut Ctx<Self>) -> StepResult<Self> {
            ctx.state
                .log
                .push(format!("v1 charged plan {}", ctx.state.plan));
            Ok(Step::await_signal(["renewal"], Self::Notify))
        }
        async fn notify(ctx: &mut Ctx<Self>) -> StepResult<Self> {
            ctx.state.log.push("v1 notified".into());
            Ok(Step::done(json!(ctx.state.log)))
        }
    }
}

/// Release 2: a price in the state, and `notify` is now `email`.
#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct Sub {
    pub customer: String,
    pub cents: u64,
    pub log: Vec<String>,
}

#[durable_fsm(state = Sub, name = "subscription", version = 2, queue = "subs")]
pub enum Subscription {
    #[initial]
    Charge,
    Email,
}

#[durable_steps]
impl Subscription {
    async fn charge(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state
            .log
            .push(format!("v2 charged {} cents", ctx.state.cents));
        Ok(Step::await_signal(["renewal"], Self::Email))
    }
    async fn email(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state
            .log
            .push(format!("v2 emailed {}", ctx.state.customer));
        Ok(Step::done(json!(ctx.state.log)))
    }
}

/// How a v1 instance becomes a v2 one.
#[durable_migration]
impl Migration for Subscription {
    type From = v1::Subscription;

    fn migrate_state(old: v1::Sub) -> Result<Sub, MigrationError> {
        let cents = match old.plan.as_str() {
            "basic" => 500,
            "pro" => 2_000,
            other => return Err(MigrationError::new(format!("no price for plan {other:?}"))),
        };
        Ok(Sub {
            customer: old.customer,
            cents,
            log: old.log,
        })
    }

    fn migrate_step(old: v1::Subscription) -> Self {
        match old {
            v1::Subscription::Charge => Self::Charge,
            v1::Subscription::Notify => Self::Email,
        }
    }
}

fn new_sub(i: u64) -> v1::Sub {
    v1::Sub {
        customer: format!("customer-{i}"),
        plan: if i.is_multiple_of(2) { "basic" } else { "pro" }.into(),
        log: Vec::new(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = common::size_arg(5);
    let pool = common::connect().await?;
    // A new demo: forget earlier runs' subscriptions.
    sqlx::query("DELETE FROM gd_instances WHERE fsm = 'subscription'")
        .execute(&pool)
        .await?;
    let gd = Client::new(pool.clone()); // links v1, v2 and the migration

    // 1. Release 1 runs v1 only.
    let mut release_1 = Registry::new();
    release_1.register::<v1::Subscription>();
    let engine = Engine::builder(pool.clone())
        .with_registry(release_1)
        .queue("subs", 4)
        .start()
        .await?;
    let mut parked = Vec::new();
    for i in 0..n {
        parked.push(gd.insert::<v1::Subscription>(new_sub(i)).await?);
    }
    let legacy = v1::Sub {
        plan: "legacy".into(),
        ..new_sub(n)
    };
    let stuck = gd.insert::<v1::Subscription>(legacy).await?;
    for &id in parked.iter().chain([&stuck]) {
        let settled = gd.wait(id).timeout(Duration::from_secs(30)).await?;
        assert!(matches!(settled, Settled::Parked { .. }), "{settled:?}");
    }
    engine.shutdown(Duration::from_secs(10)).await;
    println!("release 1: {} subscriptions parked awaiting renewal", n + 1);

    // 2. Bulk: the dry run writes nothing, then the real one.
    let dry = gd
        .migrate_instances("subscription", 2, MigrateOptions::dry_run())
        .await?;
    println!(
        "dry run: would migrate {}, would fail {}",
        dry.migrated_total(),
        dry.failed
    );
    let report = gd
        .migrate_instances("subscription", 2, MigrateOptions::default())
        .await?;
    println!(
        "migrated {} to v2; {} failed: {:?}",
        report.migrated_total(),
        report.failed,
        report.failures
    );
    assert_eq!(report.migrated_total(), n);
    assert_eq!(report.failures.first().map(|f| f.0), Some(stuck));

    // Meanwhile, a web server still on release 1 goes on inserting v1 subscriptions.
    let mut runnable = Vec::new();
    for i in 0..n {
        runnable.push(gd.insert::<v1::Subscription>(new_sub(100 + i)).await?);
    }

    // 3. Release 2 has no v1 code: it migrates what it claims and runs it on v2.
    let mut release_2 = Registry::new();
    release_2.register::<Subscription>();
    release_2.add_migration::<Subscription>();
    let engine = Engine::builder(pool.clone())
        .with_registry(release_2)
        .queue("subs", 4)
        .on_event(|e| {
            if let Event::InstanceMigrated { id, from, to, .. } = e {
                println!("  instance {id} migrated v{from} -> v{to} on its claim");
            }
        })
        .start()
        .await?;
    for &id in &runnable {
        let settled = gd.wait(id).timeout(Duration::from_secs(30)).await?;
        assert!(matches!(settled, Settled::Parked { .. }), "{settled:?}");
    }
    for &id in parked.iter().chain(&runnable) {
        gd.signal(id, "renewal", json!({})).await?;
        match gd.wait(id).timeout(Duration::from_secs(30)).await? {
            Settled::Done(log) => println!("  {id}: {log}"),
            other => return Err(format!("instance {id}: {other:?}").into()),
        }
    }
    let (version, error): (i32, Option<String>) =
        sqlx::query_as("SELECT fsm_version, last_error FROM gd_instances WHERE id = $1")
            .bind(stuck)
            .fetch_one(&pool)
            .await?;
    println!(
        "  {stuck} stays on v{version}: {}",
        error.unwrap_or_default()
    );
    assert_eq!(version, 1);
    gd.cancel(stuck).await?;
    engine.shutdown(Duration::from_secs(10)).await;
    let on_v2: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gd_instances WHERE fsm = 'subscription' AND fsm_version = 2 AND status = 'done'",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(on_v2 as u64, 2 * n);
    println!("{on_v2} subscriptions finished on v2, none lost");
    Ok(())
}
