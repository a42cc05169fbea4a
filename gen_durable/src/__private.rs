//! Re-exports that only macro-generated code uses. Not a public API.

pub use crate::flow::schedule::{Built, Plan};
pub use crate::model::gate::ConcurrencyKey;
pub use crate::model::gate::LimitKey;
pub use crate::model::state::{cast_field, json_kind, CastError, DurableState};
pub use crate::model::transition::StepRate;
pub use crate::runtime::ctx::{Ctx, StepContext};
pub use crate::runtime::fsm::{Fsm, Step, StepError, StepFuture, StepResult};
pub use crate::runtime::instance_migration::{apply_path, MigrationEntry};
pub use crate::runtime::job::{JobResult, RetryPolicy};
pub use crate::runtime::registry::FsmEntry;
pub use inventory;
pub use serde_json;
pub use serde_json::Value;

use std::marker::PhantomData;

/// What `#[durable_steps]` implements for an FSM: the part of the dispatch only the
/// impl block knows, i.e. whether it defines `handle`. `#[durable_fsm]`'s `Fsm::handle`
/// forwards here, so an FSM without a `#[durable_steps]` block fails to compile with
/// the message below, on the enum's name.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no `#[durable_steps]` impl block",
    label = "the step handlers of `{Self}` are missing",
    note = "add `#[durable_steps] impl {Self} {{ … }}` with one `async fn <step>(ctx: &mut Ctx<Self>) -> StepResult<Self>` per variant"
)]
pub trait DurableSteps: Fsm {
    /// The FSM's `handle`; without one, the same default as `Fsm::handle`: `stop`.
    fn handle_failure<'a>(err: StepError, ctx: &'a mut Ctx<Self>) -> StepFuture<'a, Self> {
        let _ = ctx;
        Box::pin(async move { Ok(Step::stop(err.to_string())) })
    }

    /// The rate limit of the handler named `handler` (its `#[step(rate_limit = "…")]`),
    /// from `state`; `Fsm::step_rate_limit` forwards here by each variant's handler.
    fn handler_rate_limit(handler: &str, state: &Self::State) -> Option<StepRate> {
        let _ = (handler, state);
        None
    }

    /// Whether the handler named `handler` declares a rate limit (without a state).
    fn handler_rate_limited(handler: &str) -> bool {
        let _ = handler;
        false
    }
}

/// Casts one field of a `#[derive(DurableState)]` struct: through the field type's
/// own `DurableState::cast_at` when it has one (so a nested state's
/// `#[durable(default)]` fields work and its paths nest), else through serde.
/// Chosen by autoref: `(&&CastVia::<T>::new()).cast_via(value, path)`.
#[derive(Debug)]
pub struct CastVia<T>(PhantomData<T>);

impl<T> CastVia<T> {
    /// A selector for `T`.
    pub const fn new() -> Self {
        CastVia(PhantomData)
    }
}

impl<T> Default for CastVia<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The preferred route: `T: DurableState`.
pub trait CastViaState {
    /// The field type.
    type Target;
    /// Casts `value` at `path`.
    fn cast_via(&self, value: &Value, path: &str) -> Result<Self::Target, CastError>;
}

impl<T: DurableState> CastViaState for &CastVia<T> {
    type Target = T;
    fn cast_via(&self, value: &Value, path: &str) -> Result<T, CastError> {
        T::cast_at(value, path)
    }
}

/// The fallback route: any `T: DeserializeOwned`.
pub trait CastViaSerde {
    /// The field type.
    type Target;
    /// Casts `value` at `path`.
    fn cast_via(&self, value: &Value, path: &str) -> Result<Self::Target, CastError>;
}

impl<T: serde::de::DeserializeOwned> CastViaSerde for CastVia<T> {
    type Target = T;
    fn cast_via(&self, value: &Value, path: &str) -> Result<T, CastError> {
        cast_field(value, path)
    }
}
