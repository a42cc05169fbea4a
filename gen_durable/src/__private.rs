//! Re-exports that only macro-generated code uses. Not a public API.

pub use crate::ctx::{Ctx, StepContext};
pub use crate::fsm::{Fsm, Step, StepError, StepFuture, StepResult};
pub use crate::job::{JobResult, RetryPolicy};
pub use crate::registry::FsmEntry;
pub use crate::state::{cast_field, json_kind, CastError, DurableState};
pub use inventory;
pub use serde_json;
pub use serde_json::Value;
