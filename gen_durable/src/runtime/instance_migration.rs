//! Instance migrations: how an instance of one FSM version becomes an instance of a
//! later one, so that the old version's code can be dropped while its instances live on.
//!
//! A [`Migration`] is declared on the new version: a typed state transform and a step
//! map (old step → new step). Registered next to the FSMs (`#[durable_migration]` on the
//! impl, or [`crate::Registry::add_migration`]), it is applied
//! - lazily, by a node that claims a row of the old version and has the new one
//!   registered: the migration is committed fenced by the claim's lease, then the step
//!   runs on the new version under the same claim;
//! - in bulk, by [`crate::Client::migrate_instances`] (`gen_durable migrate-instances`),
//!   to rows that are not executing.
//!
//! Chains compose (1 → 2 → 3) and are applied whole in memory before anything is written:
//! a row moves from its version to the last one or stays where it is, never half-way.

use std::fmt;
use std::panic::AssertUnwindSafe;

use serde_json::Value;

use crate::model::rows::Migrated;
use crate::model::state::DurableState;
use crate::model::validate;
use crate::runtime::fsm::Fsm;
use crate::runtime::panic_message;

/// How an instance of [`Migration::From`] (an older version of the same FSM) becomes an
/// instance of `Self`. Implement it on the new version and mark the impl
/// `#[durable_migration]` so that every node, and the CLI built into your binary, knows it.
///
/// ```
/// use gen_durable::prelude::*;
/// # use gen_durable::{durable_fsm, durable_steps, durable_migration, Migration, MigrationError};
/// mod v1 {
///     use gen_durable::prelude::*;
///     # use gen_durable::{durable_fsm, durable_steps};
///     #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
///     pub struct Sub { pub plan: String }
///     #[durable_fsm(state = Sub, name = "subscription", version = 1)]
///     pub enum Subscription { #[initial] Charge, Notify }
///     #[durable_steps]
///     impl Subscription {
///         async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> { Ok(Step::next(Self::Notify)) }
///         async fn notify(_ctx: &mut Ctx<Self>) -> StepResult<Self> { Ok(Step::done(json!(null))) }
///     }
/// }
///
/// #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
/// pub struct Sub { pub plan: String, pub cents: u64 }
///
/// #[durable_fsm(state = Sub, name = "subscription", version = 2)]
/// pub enum Subscription { #[initial] Charge, Email }
/// # #[durable_steps]
/// # impl Subscription {
/// #     async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> { Ok(Step::next(Self::Email)) }
/// #     async fn email(_ctx: &mut Ctx<Self>) -> StepResult<Self> { Ok(Step::done(json!(null))) }
/// # }
///
/// #[durable_migration]
/// impl Migration for Subscription {
///     type From = v1::Subscription;
///
///     fn migrate_state(old: v1::Sub) -> Result<Sub, MigrationError> {
///         let cents = match old.plan.as_str() {
///             "basic" => 500,
///             "pro" => 2_000,
///             other => return Err(MigrationError::new(format!("unknown plan {other:?}"))),
///         };
///         Ok(Sub { plan: old.plan, cents })
///     }
///
///     // An exhaustive match: the compiler checks that every old step, removed ones
///     // included, is mapped.
///     fn migrate_step(old: v1::Subscription) -> Self {
///         match old {
///             v1::Subscription::Charge => Self::Charge,
///             v1::Subscription::Notify => Self::Email,
///         }
///     }
/// }
/// ```
pub trait Migration: Fsm {
    /// The version this one migrates from: the same FSM name, a lower version.
    type From: Fsm;

    /// The state transform. An `Err` (or a panic) leaves the instance on its old
    /// version, unchanged, with the error in its `last_error`.
    fn migrate_state(old: <Self::From as Fsm>::State) -> Result<Self::State, MigrationError>;

    /// The step map: where an instance that was at step `old` goes on. Every old step
    /// must map to one of the new version's steps.
    fn migrate_step(old: Self::From) -> Self;
}

/// Why a state transform refused an instance; stored in its `last_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MigrationError(String);

impl MigrationError {
    /// An error with `message`.
    pub fn new(message: impl fmt::Display) -> Self {
        MigrationError(message.to_string())
    }
}

impl From<String> for MigrationError {
    fn from(message: String) -> Self {
        MigrationError(message)
    }
}

impl From<&str> for MigrationError {
    fn from(message: &str) -> Self {
        MigrationError(message.to_string())
    }
}

/// One migration, type-erased: what the engine, the testkit and the CLI need to apply it
/// without knowing the Rust types.
#[derive(Clone, Copy)]
pub struct MigrationEntry {
    /// The FSM's stored name.
    pub name: &'static str,
    /// The version it migrates from.
    pub from: i32,
    /// The version it migrates to.
    pub to: i32,
    /// The old version's steps (each is mapped).
    pub from_steps: &'static [&'static str],
    map_step: fn(&str) -> Option<&'static str>,
    transform: fn(&Value) -> Result<Value, String>,
}

impl fmt::Debug for MigrationEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MigrationEntry({} v{} -> v{})",
            self.name, self.from, self.to
        )
    }
}

const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

impl MigrationEntry {
    /// The entry of migration `M`. `const`, so the macro can submit it to `inventory`;
    /// a migration between two FSMs of different names, or to a version not above its
    /// source, does not compile.
    pub const fn of<M: Migration>() -> Self {
        const {
            assert!(
                same_str(M::NAME, <M::From as Fsm>::NAME),
                "a Migration's From must be the same FSM (the same NAME) at an older version"
            );
            assert!(
                M::VERSION > <M::From as Fsm>::VERSION,
                "a Migration must go to a higher VERSION than its From"
            );
        }
        MigrationEntry {
            name: M::NAME,
            from: <M::From as Fsm>::VERSION,
            to: M::VERSION,
            from_steps: <M::From as Fsm>::STEPS,
            map_step: map_step_of::<M>,
            transform: transform_of::<M>,
        }
    }

    /// Applies this one migration to a stored `(state, step)` of version `from`: the
    /// step map, then the state transform; a panic in either is an error.
    pub fn apply(&self, state: &Value, step: &str) -> Result<(Value, &'static str), String> {
        let step = self.map(step)?;
        let state = std::panic::catch_unwind(AssertUnwindSafe(|| (self.transform)(state)))
            .map_err(|p| format!("the state transform panicked: {}", panic_message(p)))??;
        Ok((state, step))
    }

    fn map(&self, step: &str) -> Result<&'static str, String> {
        std::panic::catch_unwind(|| (self.map_step)(step))
            .map_err(|p| format!("the step map panicked on {step:?}: {}", panic_message(p)))?
            .ok_or_else(|| format!("{} v{} has no step {step:?}", self.name, self.from))
    }

    /// Checks the step map at registration: every old step maps without a panic (a
    /// `match` with a catch-all that panics is caught here, not on a claim).
    pub(crate) fn check_steps(&self) -> Result<(), String> {
        self.from_steps
            .iter()
            .try_for_each(|s| self.map(s).map(drop))
    }
}

fn map_step_of<M: Migration>(step: &str) -> Option<&'static str> {
    <M::From as Fsm>::from_step_name(step).map(|old| M::migrate_step(old).step_name())
}

fn transform_of<M: Migration>(state: &Value) -> Result<Value, String> {
    let from = <M::From as Fsm>::VERSION;
    let old = <<M::From as Fsm>::State as DurableState>::cast(state)
        .map_err(|e| format!("the stored state does not cast into v{from}'s state: {e}"))?;
    let new = M::migrate_state(old).map_err(|e| e.to_string())?;
    let value =
        serde_json::to_value(&new).map_err(|e| format!("the new state does not serialize: {e}"))?;
    validate::json("state", &value).map_err(|e| e.to_string())?;
    Ok(value)
}

/// Applies `path` (consecutive migrations, e.g. from [`crate::Registry::path_to`]) to a
/// row's `(state, step)`, all in memory: the result is the row at the last version, or
/// the error of the hop that failed — nothing in between.
pub fn apply_path(path: &[MigrationEntry], state: &Value, step: &str) -> Result<Migrated, String> {
    let mut done: Option<Migrated> = None;
    for m in path {
        let (state, step) = match &done {
            None => m.apply(state, step),
            Some(prev) => m.apply(&prev.state, prev.step),
        }
        .map_err(|e| format!("migrating {} v{} to v{} failed: {e}", m.name, m.from, m.to))?;
        done = Some(Migrated {
            version: m.to,
            state,
            step,
        });
    }
    done.ok_or_else(|| "no migration to apply".to_string())
}

inventory::collect!(MigrationEntry);
