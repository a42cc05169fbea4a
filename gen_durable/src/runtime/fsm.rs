//! The contract between a declared FSM and the engine: the [`Fsm`] trait that
//! `#[durable_fsm]` / `#[durable_job]` generate, and the [`Step`] outcomes a step returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::model::gate::{ConcurrencyKey, LimitKey};
use crate::model::history::HistoryLevel;
use crate::model::insert::NewInstance;
use crate::model::options::InsertOptions;
use crate::model::state::DurableState;
use crate::model::step::{Outcome, OutcomeKind};
use crate::model::transition::{KeyChange, StepRate};
use crate::runtime::ctx::Ctx;
use crate::runtime::registry::FsmEntry;

/// The future a step handler returns.
pub type StepFuture<'a, F> = Pin<Box<dyn Future<Output = StepResult<F>> + Send + 'a>>;

/// What a step returns: an outcome, or an error that goes to the FSM's `handle`.
pub type StepResult<F> = Result<Step<F>, StepError>;

/// A durable finite-state machine: its identity, its steps and their dispatch.
///
/// `#[durable_fsm]` on an enum (and `#[durable_job]` on an async fn) implement it;
/// the enum's variants are the steps. A hand-written impl is possible and is what
/// the engine's own tests use.
pub trait Fsm: Copy + Send + Sync + fmt::Debug + 'static {
    /// The typed state every step sees as `ctx.state`.
    type State: DurableState;
    /// The stored FSM name (`gd_instances.fsm`).
    const NAME: &'static str;
    /// The stored version (`gd_instances.fsm_version`), a positive integer.
    const VERSION: i32;
    /// The queue new instances go to unless the insert says otherwise.
    const QUEUE: &'static str;
    /// How many lost leases one step may cause before the reaper fails the instance.
    const MAX_REAPS: i32 = 10;
    /// Run-ahead: after a `next`, the worker that ran the step commits it (durably,
    /// fenced) and runs the next step at once under the claim it holds, instead of
    /// handing the row back to be picked again. Default off; `#[durable_fsm(run_ahead =
    /// true)]` or [`Step::run_ahead`] per outcome turns it on.
    const RUN_AHEAD: bool = false;
    /// How much of its history each instance keeps (`#[durable_fsm(history = "full")]`):
    /// every step's entry (the default), with the state it began with, or none.
    const HISTORY: HistoryLevel = HistoryLevel::Steps;
    /// Every stored step name, in declaration order.
    const STEPS: &'static [&'static str];

    /// The step a new instance starts at.
    fn initial() -> Self;
    /// The stored name of this step.
    fn step_name(self) -> &'static str;
    /// The step stored under `name`, if any.
    fn from_step_name(name: &str) -> Option<Self>;
    /// Runs this step's handler.
    fn run_step<'a>(self, ctx: &'a mut Ctx<Self>) -> StepFuture<'a, Self>;
    /// The rate limit this step pays each time it runs, as `#[step(rate_limit = "…")]`
    /// declares it in `#[durable_steps]`, from the state the transition commits. Used
    /// on every transition into the step that names no limit of its own, and at insert
    /// for the first step. Default: none.
    fn step_rate_limit(self, state: &Self::State) -> Option<StepRate> {
        let _ = state;
        None
    }
    /// Whether this step declares a rate limit: [`Fsm::step_rate_limit`] may answer
    /// `Some`. (An insert casts the state for it only then.)
    fn rate_limited(self) -> bool {
        false
    }
    /// Turns a failed step (an `Err` or a panic) into an outcome. Default: `stop`.
    fn handle<'a>(err: StepError, ctx: &'a mut Ctx<Self>) -> StepFuture<'a, Self> {
        let _ = ctx;
        Box::pin(async move { Ok(Step::stop(err.to_string())) })
    }
}

/// What a step decided. Build one with the constructors.
#[derive(Debug)]
pub struct Step<F: Fsm> {
    /// The outcome, type-erased as it is committed.
    pub(crate) outcome: Outcome,
    /// The step the outcome leads to (`next`, `await_signal`, `schedule_children`): its
    /// declared rate limit is read from the state the outcome commits.
    pub(crate) next: Option<F>,
    /// A child that cannot be inserted (its state does not serialize, an option is
    /// refused): the instance stops with this reason instead, keeping the state the step
    /// set, without its own transaction.
    pub(crate) child_error: Option<String>,
    /// Recorded as `last_error` with the outcome (set when a failure led to it).
    pub(crate) error: Option<String>,
    /// On a `next`: continue in this worker (see [`Fsm::RUN_AHEAD`]).
    pub(crate) run_ahead: bool,
    /// Per-transition options (see [`Step::partition_key`], [`Step::rate_limit`]).
    pub(crate) key: KeyChange,
    pub(crate) rate: Option<LimitKey>,
    pub(crate) weight: Option<f64>,
    pub(crate) no_run_ahead: bool,
}

impl<F: Fsm> Step<F> {
    fn of(outcome: Outcome, next: Option<F>) -> Self {
        Step {
            outcome,
            next,
            child_error: None,
            error: None,
            run_ahead: false,
            key: KeyChange::Keep,
            rate: None,
            weight: None,
            no_run_ahead: false,
        }
    }

    /// On an outcome that leads to a step (`next`, `await_signal`, `schedule_children`):
    /// from that step on, the instance runs under K = 1 key `key` instead of the key it
    /// had (see the insert option `partition_key`). The key is taken at the row's next
    /// claim: a run-ahead chain hands the row back to the picker for it.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.key = KeyChange::Set(ConcurrencyKey::Partition(key.into()));
        self
    }

    /// On an outcome that leads to a step: from that step on, the instance runs under key
    /// `key` of a gate (at most K at once) instead of the key it had. An undeclared gate
    /// is refused by the database when the outcome commits, and the instance stops with
    /// that refusal (`Error::UnknownGate` named in `last_error`).
    pub fn gate(mut self, key: impl Into<LimitKey>) -> Self {
        self.key = KeyChange::Set(ConcurrencyKey::Gate(key.into()));
        self
    }

    /// On an outcome that leads to a step: from that step on, the instance runs under no
    /// partition or gate key. Without this, `partition_key` or `gate`, the key is kept.
    pub fn release_partition(mut self) -> Self {
        self.key = KeyChange::Release;
        self
    }

    /// On an outcome that leads to a step: that step takes its tokens from `key` of a rate
    /// limit each time it runs (its first run, a replay, a re-run), instead of the limit
    /// its `#[step(rate_limit = "…")]` declares. A transition with neither leaves the step
    /// unlimited. The step never runs ahead: a claim admits it.
    pub fn rate_limit(mut self, key: impl Into<LimitKey>) -> Self {
        self.rate = Some(key.into());
        self
    }

    /// The tokens the next step's rate limit takes per run (default 1): positive and
    /// finite, or the instance stops when the outcome is built; above the limit's burst,
    /// the database refuses the outcome and the instance stops with that refusal.
    pub fn weight(mut self, weight: f64) -> Self {
        self.weight = Some(weight);
        self
    }

    /// On a `next`: hand the row back to the picker even if the FSM or
    /// [`Step::run_ahead`] asks to run ahead.
    pub fn no_run_ahead(mut self) -> Self {
        self.no_run_ahead = true;
        self
    }

    /// On a `next`: commit it and run the next step at once in this worker, under the
    /// claim it already holds (see [`Fsm::RUN_AHEAD`]). The commit is still durable and
    /// fenced before the next step runs. No effect on other outcomes.
    pub fn run_ahead(mut self) -> Self {
        self.run_ahead = true;
        self
    }

    /// Records `error` as the instance's `last_error` with this outcome, e.g. on a
    /// `replay` chosen because something failed.
    pub fn with_error(mut self, error: impl fmt::Display) -> Self {
        self.error = Some(error.to_string());
        self
    }

    /// Go on at step `next`, runnable now; `attempt` resets to 0 and the awaited signals are consumed.
    pub fn next(next: F) -> Self {
        let step = next.step_name();
        Step::of(Outcome::Next { step }, Some(next))
    }

    /// Run this same step again after `delay`; `attempt` goes up by one, nothing is consumed.
    pub fn replay(delay: Duration) -> Self {
        Step::of(Outcome::Replay { delay }, None)
    }

    /// Park until a signal with one of `names` arrives, then run `next`.
    /// Add [`Step::timeout`] to give up waiting after a while.
    pub fn await_signal<I, S>(names: I, next: F) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let outcome = Outcome::Await {
            names: names.into_iter().map(Into::into).collect(),
            step: next.step_name(),
            timeout: None,
        };
        Step::of(outcome, Some(next))
    }

    /// On an `await_signal`: run `next` with nothing awaited once `after` has passed
    /// (by the database clock). Has no effect on other outcomes.
    pub fn timeout(mut self, after: Duration) -> Self {
        if let Outcome::Await { timeout, .. } = &mut self.outcome {
            *timeout = Some(after);
        }
        self
    }

    /// Insert `children` and park until every one of them is terminal, then run `next`.
    pub fn schedule_children(children: Vec<Child>, next: F) -> Self {
        let step = next.step_name();
        let (children, child_error) =
            match children.into_iter().map(Child::into_new_instance).collect() {
                Ok(rows) => (rows, None),
                Err(reason) => (Vec::new(), Some(reason)),
            };
        let outcome = Outcome::ScheduleChildren { children, step };
        Step {
            child_error,
            ..Step::of(outcome, Some(next))
        }
    }

    /// Finish with `result`; the whole inbox is deleted.
    pub fn done(result: impl Into<Value>) -> Self {
        let result = result.into();
        Step::of(Outcome::Done { result }, None)
    }

    /// Stop for good with `reason` as `last_error`; the whole inbox is deleted.
    pub fn stop(reason: impl fmt::Display) -> Self {
        let reason = reason.to_string();
        Step::of(Outcome::Stop { reason }, None)
    }

    /// The outcome's kind, as telemetry reports it.
    pub fn kind(&self) -> OutcomeKind {
        self.outcome.kind()
    }
}

/// A failed step: an error a handler returned with `?`, a caught panic, or a state that no
/// longer casts. It is what `handle(err, ctx)` receives.
#[derive(Debug, Clone)]
pub struct StepError {
    kind: StepErrorKind,
    message: String,
}

/// Why a step failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepErrorKind {
    /// The handler returned `Err`.
    Error,
    /// The handler panicked.
    Panic,
    /// The stored state no longer casts into the state type.
    StateCast,
    /// Committing the step's own `ctx.transaction()` writes failed.
    Transaction,
}

impl StepError {
    /// A step error with a message.
    pub fn new(message: impl fmt::Display) -> Self {
        StepError {
            kind: StepErrorKind::Error,
            message: message.to_string(),
        }
    }

    pub(crate) fn with_kind(kind: StepErrorKind, message: impl fmt::Display) -> Self {
        StepError {
            kind,
            message: message.to_string(),
        }
    }

    /// Why the step failed.
    pub fn kind(&self) -> StepErrorKind {
        self.kind
    }

    /// The error's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True if the step panicked.
    pub fn is_panic(&self) -> bool {
        self.kind == StepErrorKind::Panic
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            StepErrorKind::Panic => write!(f, "step panicked: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Any error converts with `?`, like `anyhow`; its `Display` becomes the message.
impl<E: std::error::Error + Send + Sync + 'static> From<E> for StepError {
    fn from(err: E) -> Self {
        StepError::new(err)
    }
}

/// Capped exponential backoff: `1 s · 2^attempt`, at most 300 s.
pub fn backoff(attempt: i32) -> Duration {
    backoff_capped(attempt, Duration::from_secs(300))
}

/// `1 s · 2^attempt`, at most `cap`.
pub fn backoff_capped(attempt: i32, cap: Duration) -> Duration {
    let exp = attempt.clamp(0, 30) as u32;
    Duration::from_secs(1u64 << exp).min(cap)
}

/// A child instance to insert with [`Step::schedule_children`]: any FSM, any insert options.
#[derive(Debug, Clone)]
pub struct Child {
    pub(crate) entry: FsmEntry,
    pub(crate) state: Result<Value, String>,
    pub(crate) opts: InsertOptions,
}

impl Child {
    /// A child of FSM `C` starting from `state`.
    pub fn new<C: Fsm>(state: C::State) -> Self {
        Child {
            entry: FsmEntry::of::<C>(),
            state: serde_json::to_value(&state).map_err(|e| e.to_string()),
            opts: InsertOptions::default(),
        }
    }

    crate::insert_option_setters!(opts);

    /// Checks the child and turns it into a row.
    fn into_new_instance(self) -> Result<NewInstance, String> {
        let fsm = self.entry.name;
        let state = self
            .state
            .map_err(|e| format!("child {fsm} state does not serialize: {e}"))?;
        self.entry
            .new_instance(state, self.opts)
            .map_err(|e| format!("child {fsm}: {e}"))
    }
}
