//! What a step sees: its instance, its typed state, its inbox and children, and
//! a transaction that commits with its outcome.

use std::ops::{Deref, DerefMut};

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;

use crate::model::error::{Error, Result};
use crate::model::inbox::{ChildInfo, Signal};
use crate::runtime::fsm::Fsm;

/// Everything a step sees except its typed state. Job handlers receive it directly
/// (as [`JobCtx`]); FSM steps reach it through [`Ctx`].
#[derive(Debug)]
pub struct StepContext {
    pub(crate) id: i64,
    pub(crate) fsm: &'static str,
    pub(crate) fsm_version: i32,
    pub(crate) step: &'static str,
    pub(crate) attempt: i32,
    pub(crate) awaited: Vec<Signal>,
    pub(crate) inbox: Vec<Signal>,
    pub(crate) children: Vec<ChildInfo>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) cancel: CancellationToken,
    pub(crate) pool: Option<PgPool>,
    pub(crate) tx: Option<Transaction<'static, Postgres>>,
}

/// The context a `#[durable_job]` function receives.
pub type JobCtx = StepContext;

impl StepContext {
    /// The instance's id.
    pub fn id(&self) -> i64 {
        self.id
    }
    /// The FSM's stored name.
    pub fn fsm(&self) -> &'static str {
        self.fsm
    }
    /// The FSM's version.
    pub fn fsm_version(&self) -> i32 {
        self.fsm_version
    }
    /// The stored name of the step running now.
    pub fn step(&self) -> &'static str {
        self.step
    }
    /// How many times this step has run before without progressing (replays and lost leases).
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
    /// The inbox signals whose names the last `await_signal` named. A progressing
    /// outcome (`next`, `schedule_children`) consumes exactly these, by id.
    pub fn awaited(&self) -> &[Signal] {
        &self.awaited
    }
    /// The whole inbox as it was when the step was claimed.
    pub fn inbox(&self) -> &[Signal] {
        &self.inbox
    }
    /// After `schedule_children`: every child with its status, state, result and error.
    pub fn children(&self) -> &[ChildInfo] {
        &self.children
    }
    /// The database's time when the step was claimed (the virtual clock in the testkit).
    pub fn now(&self) -> DateTime<Utc> {
        self.now
    }
    /// Resolves when the engine drains or the instance is cancelled: stop cooperatively.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }
    /// True once [`StepContext::cancelled`] would resolve.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
    /// A transaction for the step's own writes. It commits in the same transaction as
    /// the step's outcome, fenced by the lease: the writes happen exactly once, or not at
    /// all if the step fails or the lease was lost. Begun on first use.
    ///
    /// It runs at READ COMMITTED, whatever the database's default, and has taken its first
    /// snapshot when it is handed over: the outcome's commit relies on that level (under
    /// REPEATABLE READ the engine's own heartbeat, which touches the row, would make the
    /// commit fail with a serialization error and the step's writes would be lost), so a
    /// `SET TRANSACTION ISOLATION LEVEL …` on it fails at that call with PostgreSQL's
    /// "SET TRANSACTION ISOLATION LEVEL must be called before any query".
    pub async fn transaction(&mut self) -> Result<&mut Transaction<'static, Postgres>> {
        if self.tx.is_none() {
            let pool = self.pool.as_ref().ok_or_else(|| {
                Error::InvalidConfig(
                    "ctx.transaction() needs the Postgres engine; the in-memory testkit has no database".into(),
                )
            })?;
            self.tx = Some(
                pool.begin_with(crate::store::pg::BEGIN_READ_COMMITTED)
                    .await?,
            );
        }
        Ok(self.tx.as_mut().expect("transaction begun above"))
    }
}

/// What an FSM step sees: `ctx.state` (typed, mutable: what the outcome commits) and,
/// through `Deref`, the [`StepContext`] accessors (`ctx.id()`, `ctx.awaited()`, …).
#[derive(Debug)]
pub struct Ctx<F: Fsm> {
    /// The instance's state. Changes made here are committed with the step's outcome.
    pub state: F::State,
    pub(crate) base: StepContext,
}

impl<F: Fsm> Ctx<F> {
    /// Builds a context; used by the engine and the testkit.
    pub(crate) fn new(state: F::State, base: StepContext) -> Self {
        Ctx { state, base }
    }

    /// Splits into the state and the rest: what a job handler receives.
    pub fn split(&mut self) -> (&mut F::State, &mut StepContext) {
        (&mut self.state, &mut self.base)
    }
}

impl<F: Fsm> Deref for Ctx<F> {
    type Target = StepContext;
    fn deref(&self) -> &StepContext {
        &self.base
    }
}

impl<F: Fsm> DerefMut for Ctx<F> {
    fn deref_mut(&mut self) -> &mut StepContext {
        &mut self.base
    }
}
