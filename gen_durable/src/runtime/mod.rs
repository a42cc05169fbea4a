//! The runtime, above the contract and the store: the FSM trait and its steps (`fsm`),
//! what a step sees (`ctx`), the job form (`job`), the registry of what this process runs
//! (`registry`), instance migrations (`instance_migration`), and here the backend-neutral
//! step runner, which turns a claimed instance into a committed-to-be outcome. The Postgres engine and the in-memory testkit both run steps through
//! [`run_erased`], so the two cannot differ in how a step, its `handle`, a panic or
//! an uncastable state become an outcome.

pub(crate) mod ctx;
pub(crate) mod fsm;
pub(crate) mod instance_migration;
pub(crate) mod job;
pub(crate) mod registry;

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::model::inbox::{ChildInfo, Signal};
use crate::model::state::DurableState;
use crate::model::step::{Outcome, StepOutput};
use crate::model::transition::{StepRate, Transition};
use crate::model::validate;
use crate::runtime::ctx::{Ctx, StepContext};
use crate::runtime::fsm::{Fsm, Step, StepError, StepErrorKind};

/// A claimed instance, as the runner needs it.
#[derive(Debug)]
pub struct StepInput {
    /// Instance id.
    pub id: i64,
    /// Stored step name to run.
    pub step: String,
    /// Stored state.
    pub state: Value,
    /// `attempt` column.
    pub attempt: i32,
    /// `awaits` column: the names the last await named.
    pub awaits: Vec<String>,
    /// The whole inbox.
    pub inbox: Vec<Signal>,
    /// The children, if any.
    pub children: Vec<ChildInfo>,
    /// The clock's time at claim.
    pub now: DateTime<Utc>,
    /// Cancelled on drain or instance cancel.
    pub cancel: CancellationToken,
    /// Where `ctx.transaction()` begins its transaction (None in the testkit).
    pub pool: Option<PgPool>,
}

impl StepInput {
    /// The input of step `step` of instance `id` at `now`, at attempt 0 with nothing
    /// awaited, no inbox, no children, a fresh cancellation token and no pool; set the
    /// rest with struct update syntax.
    pub fn new(id: i64, step: impl Into<String>, state: Value, now: DateTime<Utc>) -> Self {
        StepInput {
            id,
            step: step.into(),
            state,
            attempt: 0,
            awaits: Vec::new(),
            inbox: Vec::new(),
            children: Vec::new(),
            now,
            cancel: CancellationToken::new(),
            pool: None,
        }
    }
}

impl StepOutput {
    /// A claimed row whose instance migration failed: a `replay` of its unchanged step,
    /// on its old version with its stored state, after `backoff(attempt)`, recording `error`.
    pub fn migration_failed(state: Value, error: String, attempt: i32) -> Self {
        StepOutput {
            outcome: Outcome::Replay {
                delay: crate::runtime::fsm::backoff(attempt),
            },
            state,
            awaited: Vec::new(),
            error: Some(error),
            tx: None,
            run_ahead: false,
            transition: Transition::default(),
            duration: Duration::ZERO,
        }
    }

    /// A `stop` with `reason` that keeps the stored state (the committer's replacement for
    /// an outcome the database refused; the kit's, with the state it keeps).
    #[doc(hidden)]
    pub fn stopped(reason: String) -> Self {
        stop_output(reason, Value::Null, Instant::now())
    }
}

/// The `stop` reason of an outcome the database refused (an undeclared gate or rate
/// limit, a weight above the burst, a value it cannot store): the instance stops once,
/// naming the refusal, instead of being reaped and rerun.
#[doc(hidden)]
pub fn refused(err: &crate::Error) -> String {
    format!("the step's outcome was refused by the database, so the instance stops: {err}")
}

pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

fn stop_output(reason: String, state: Value, started: Instant) -> StepOutput {
    StepOutput {
        error: Some(reason.clone()),
        outcome: Outcome::Stop { reason },
        state,
        awaited: Vec::new(),
        tx: None,
        run_ahead: false,
        transition: Transition::default(),
        duration: started.elapsed(),
    }
}

/// Runs one step of FSM `F` on `input`: the handler outside any transaction, with
/// panics caught; on an `Err` or a panic, `handle` with the last committed state
/// and without the failed step's `ctx.transaction()` writes; a failing `handle`
/// stops the instance.
pub async fn run_erased<F: Fsm>(input: StepInput) -> StepOutput {
    let started = Instant::now();
    let Some(step) = F::from_step_name(&input.step) else {
        let reason = format!(
            "{} v{} has no step {:?} (steps: {:?})",
            F::NAME,
            F::VERSION,
            input.step,
            F::STEPS
        );
        return stop_output(reason, input.state, started);
    };
    let state = match F::State::cast(&input.state) {
        Ok(state) => state,
        Err(err) => {
            let reason = format!(
                "stored state no longer casts into {}: {err}",
                <F::State as DurableState>::TYPE_NAME
            );
            return stop_output(reason, input.state, started);
        }
    };
    let awaited: Vec<Signal> = input
        .inbox
        .iter()
        .filter(|s| input.awaits.contains(&s.name))
        .cloned()
        .collect();
    let base = StepContext {
        id: input.id,
        fsm: F::NAME,
        fsm_version: F::VERSION,
        step: step.step_name(),
        attempt: input.attempt,
        awaited,
        inbox: input.inbox,
        children: input.children,
        now: input.now,
        cancel: input.cancel,
        pool: input.pool,
        tx: None,
    };
    let mut ctx: Ctx<F> = Ctx::new(state, base);

    let stored_state = input.state;
    let first = AssertUnwindSafe(step.run_step(&mut ctx))
        .catch_unwind()
        .await;
    let failure = match first {
        Ok(Ok(step)) => return checked(finish(step, ctx, None, started), &stored_state),
        Ok(Err(err)) => err,
        Err(panic) => StepError::with_kind(StepErrorKind::Panic, panic_message(panic)),
    };

    // The failed step has no effects: its own writes roll back and `handle` sees the
    // last committed state, so re-running the step starts from where it started.
    ctx.base.tx = None;
    match F::State::cast(&stored_state) {
        Ok(state) => ctx.state = state,
        Err(err) => return stop_output(err.to_string(), stored_state, started),
    }
    let message = failure.to_string();
    let handled = AssertUnwindSafe(F::handle(failure, &mut ctx))
        .catch_unwind()
        .await;
    match handled {
        Ok(Ok(step)) => checked(finish(step, ctx, Some(message), started), &stored_state),
        Ok(Err(err)) => stop_output(
            format!("{message}; then handle failed: {err}"),
            stored_state,
            started,
        ),
        Err(panic) => stop_output(
            format!("{message}; then handle panicked: {}", panic_message(panic)),
            stored_state,
            started,
        ),
    }
}

/// An outcome the database could not store (a NUL character in its state or result, a
/// delay out of range, a bad awaited name, a child that would not insert) fails the
/// instance at once with a message naming the cause, keeping its last committed state,
/// rather than reaching SQL: there it would fail the whole group commit it is part of.
/// The step's own transaction is dropped (rolled back) with it. Messages are made
/// storable instead: a NUL character in an error becomes `\0`.
fn checked(mut out: StepOutput, stored: &Value) -> StepOutput {
    if let Some(e) = out.error.as_mut().filter(|e| e.contains('\0')) {
        *e = e.replace('\0', "\\0");
    }
    if let Outcome::Stop { reason } = &mut out.outcome {
        if reason.contains('\0') {
            *reason = reason.replace('\0', "\\0");
        }
    }
    let problem = validate::json("state", &out.state)
        .and_then(|()| out.transition.validate())
        .and_then(|()| match &out.outcome {
            Outcome::Replay { delay } => validate::delay("replay delay", *delay),
            Outcome::Await { names, timeout, .. } => names
                .iter()
                .try_for_each(|n| validate::signal_name(n))
                .and_then(|()| timeout.map_or(Ok(()), |t| validate::delay("await timeout", t))),
            Outcome::Done { result } => validate::json("result", result),
            _ => Ok(()),
        });
    match problem {
        Ok(()) => out,
        Err(e) => {
            let reason = format!(
                "the step's {} outcome cannot be stored: {e}",
                out.outcome.kind()
            );
            let mut failed = stop_output(reason, stored.clone(), Instant::now());
            failed.duration = out.duration;
            failed
        }
    }
}

/// Erases a typed outcome, with the state and context it commits.
fn finish<F: Fsm>(
    step: Step<F>,
    mut ctx: Ctx<F>,
    failure: Option<String>,
    started: Instant,
) -> StepOutput {
    let state = match serde_json::to_value(&ctx.state) {
        Ok(v) => v,
        Err(e) => {
            return stop_output(
                format!("state does not serialize: {e}"),
                Value::Null,
                started,
            )
        }
    };
    // A child that would not insert stops the instance, with the state the step set
    // but without its own transaction.
    if let Some(reason) = step.child_error {
        return stop_output(reason, state, started);
    }
    let awaited: Vec<i64> = ctx.base.awaited.iter().map(|s| s.id).collect();
    let outcome = step.outcome;
    let error = match &outcome {
        Outcome::Stop { reason } => Some(reason.clone()),
        _ => step.error.or(failure),
    };
    let run_ahead = matches!(outcome, Outcome::Next { .. }) && (F::RUN_AHEAD || step.run_ahead);
    // The step the outcome leads to: the transition's options apply there.
    let transition = match step.next {
        Some(to) => Transition {
            key: step.key,
            rate: step_rate(to, &ctx.state, step.rate, step.weight),
            no_run_ahead: step.no_run_ahead,
        },
        None => Transition::default(),
    };
    StepOutput {
        outcome,
        state,
        awaited,
        error,
        tx: ctx.base.tx.take(),
        run_ahead,
        transition,
        duration: started.elapsed(),
    }
}

/// The rate limit step `to` pays: the transition's own (`limit`, with `weight` or 1),
/// else the step's declared one (its weight replaced by `weight` if given), else none.
pub(crate) fn step_rate<F: Fsm>(
    to: F,
    state: &F::State,
    limit: Option<crate::LimitKey>,
    weight: Option<f64>,
) -> Option<StepRate> {
    let mut rate = match limit {
        Some(key) => StepRate::new(key, 1.0),
        None => to.step_rate_limit(state)?,
    };
    if let Some(w) = weight {
        rate.weight = w;
    }
    Some(rate)
}
