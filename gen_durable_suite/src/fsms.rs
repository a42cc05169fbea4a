//! FSMs for the reliability suite and the soak. Each step writes one audit row through
//! `ctx.transaction()`, so "exactly once per (instance, step)" can be checked in SQL.
//! Their statements are unnamed (`.persistent(false)`), as a step's must be when the
//! engine runs behind a transaction-mode pooler (README "Behind a connection pooler").

use std::time::Duration;

use gen_durable::prelude::*;

/// The audit table the FSMs write to; created by [`create_audit_table`].
pub const AUDIT_TABLE: &str = "gd_audit";

/// Creates the audit table (not part of gen_durable's schema).
pub async fn create_audit_table(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS gd_audit (
             instance bigint NOT NULL, step text NOT NULL, node text NOT NULL,
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What every FSM here does with a failed step (say its connection was killed): try
/// again shortly, up to 20 times. The failed attempt's own writes rolled back with it.
fn retry_shortly<F: Fsm>(err: StepError, attempt: i32) -> Step<F> {
    if attempt < 20 {
        Step::replay(Duration::from_millis(50)).with_error(err)
    } else {
        Step::stop(err)
    }
}

/// What an `Audited` instance does in each step.
#[derive(DurableState, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Milliseconds each step sleeps (inside the step, before its outcome).
    #[durable(default)]
    pub step_ms: u64,
    /// Abort the worker process in this step, on the first attempt only.
    #[durable(default)]
    pub abort_in: Option<String>,
    /// Abort the worker process in this step on every attempt (a poison step).
    #[durable(default)]
    pub always_abort_in: Option<String>,
    /// Steps done so far, in order, as the committed state saw them.
    #[durable(default)]
    pub trail: Vec<String>,
}

/// Three steps, each writing an audit row in the step's own transaction.
#[durable_fsm(state = Plan, queue = "audited", max_reaps = 3)]
pub enum Audited {
    #[initial]
    One,
    Two,
    Three,
}

async fn audited_step(ctx: &mut Ctx<Audited>, name: &str) -> Result<(), StepError> {
    if ctx.state.always_abort_in.as_deref() == Some(name)
        || (ctx.state.abort_in.as_deref() == Some(name) && ctx.attempt() == 0)
    {
        eprintln!("worker: aborting in step {name} of instance {}", ctx.id());
        std::process::abort();
    }
    if ctx.state.step_ms > 0 {
        tokio::time::sleep(Duration::from_millis(ctx.state.step_ms)).await;
    }
    let id = ctx.id();
    let node = std::env::var("GD_NODE").unwrap_or_default();
    let tx = ctx.transaction().await.map_err(StepError::new)?;
    sqlx::query("INSERT INTO gd_audit (instance, step, node) VALUES ($1, $2, $3)")
        .persistent(false)
        .bind(id)
        .bind(name)
        .bind(node)
        .execute(&mut **tx)
        .await?;
    ctx.state.trail.push(name.to_string());
    Ok(())
}

#[durable_steps]
impl Audited {
    async fn one(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        audited_step(ctx, "one").await?;
        Ok(Step::next(Audited::Two))
    }

    async fn two(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        audited_step(ctx, "two").await?;
        Ok(Step::next(Audited::Three))
    }

    async fn three(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        audited_step(ctx, "three").await?;
        Ok(Step::done(json!({ "trail": ctx.state.trail })))
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(retry_shortly(err, ctx.attempt()))
    }
}

/// The span table [`Keyed`] writes to; created by [`create_span_table`].
pub async fn create_span_table(pool: &sqlx::PgPool) -> sqlx::Result<()> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS gd_spans (
             instance bigint NOT NULL, key text NOT NULL,
             started timestamptz NOT NULL, ended timestamptz NOT NULL)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A partitioned instance: which key, how long its step takes.
#[derive(DurableState, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct KeyedWork {
    /// The partition key it runs under (also passed as `partition_key` at insert).
    pub key: String,
    /// Milliseconds the step takes.
    #[durable(default)]
    pub ms: u64,
}

/// One step that records `[started, finished]` (database clock) for its key, committed
/// with its outcome, so overlapping steps of one key would show in `gd_spans`.
#[durable_fsm(state = KeyedWork, queue = "audited")]
pub enum Keyed {
    #[initial]
    Work,
}

#[durable_steps]
impl Keyed {
    async fn work(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let (id, key, ms) = (ctx.id(), ctx.state.key.clone(), ctx.state.ms);
        let tx = ctx.transaction().await.map_err(StepError::new)?;
        // Not ctx.now(): that is when the claim statement began, which may be well
        // before the claim committed and the step actually started.
        let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .persistent(false)
            .fetch_one(&mut **tx)
            .await?;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        sqlx::query("INSERT INTO gd_spans VALUES ($1, $2, $3, clock_timestamp())")
            .persistent(false)
            .bind(id)
            .bind(key)
            .bind(started)
            .execute(&mut **tx)
            .await?;
        Ok(Step::done(json!(null)))
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(retry_shortly(err, ctx.attempt()))
    }
}

/// A parent that fans out to `n` [`FanChild`]ren and sums them up.
#[derive(DurableState, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Fan {
    /// How many children to spawn.
    pub n: u32,
}

/// Spawns `n` children, then audits one `sum` row when they are all terminal.
#[durable_fsm(state = Fan, queue = "audited")]
pub enum FanParent {
    #[initial]
    Spawn,
    Sum,
}

#[durable_steps]
impl FanParent {
    async fn spawn(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let children = (0..ctx.state.n)
            .map(|_| Child::new::<FanChild>(()))
            .collect();
        Ok(Step::schedule_children(children, FanParent::Sum))
    }

    async fn sum(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let total = ctx.children().len();
        let done = ctx
            .children()
            .iter()
            .filter(|c| c.status == Status::Done)
            .count();
        let id = ctx.id();
        let tx = ctx.transaction().await.map_err(StepError::new)?;
        sqlx::query("INSERT INTO gd_audit (instance, step, node) VALUES ($1, 'sum', '')")
            .persistent(false)
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(Step::done(json!({ "children": total, "done": done })))
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(retry_shortly(err, ctx.attempt()))
    }
}

/// A child that audits one `child` row.
#[durable_fsm(state = (), queue = "audited")]
pub enum FanChild {
    #[initial]
    Run,
}

#[durable_steps]
impl FanChild {
    async fn run(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let id = ctx.id();
        let tx = ctx.transaction().await.map_err(StepError::new)?;
        sqlx::query("INSERT INTO gd_audit (instance, step, node) VALUES ($1, 'child', '')")
            .persistent(false)
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(Step::done(json!(null)))
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(retry_shortly(err, ctx.attempt()))
    }
}

/// Parks until `go`, then audits what it received (once) and finishes with it.
#[durable_fsm(state = (), queue = "audited")]
pub enum Waiter {
    #[initial]
    Park,
    Got,
}

#[durable_steps]
impl Waiter {
    async fn park(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::await_signal(["go"], Waiter::Got))
    }

    async fn got(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let (id, got) = (ctx.id(), ctx.awaited().len());
        let tx = ctx.transaction().await.map_err(StepError::new)?;
        sqlx::query("INSERT INTO gd_audit (instance, step, node) VALUES ($1, 'got', '')")
            .persistent(false)
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(Step::done(json!({ "awaited": got })))
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(retry_shortly(err, ctx.attempt()))
    }
}

/// Spawns `n` parked [`Waiter`]s, then finishes once they are all terminal: the soak's
/// operator signals, cancels and retries these parents and their children.
#[durable_fsm(state = Fan, queue = "audited")]
pub enum WaitFan {
    #[initial]
    Spawn,
    Sum,
}

#[durable_steps]
impl WaitFan {
    async fn spawn(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let children = (0..ctx.state.n).map(|_| Child::new::<Waiter>(())).collect();
        Ok(Step::schedule_children(children, WaitFan::Sum))
    }

    async fn sum(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let done = ctx
            .children()
            .iter()
            .filter(|c| c.status == Status::Done)
            .count();
        Ok(Step::done(json!({ "done": done })))
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(retry_shortly(err, ctx.attempt()))
    }
}
