//! # gen_durable
//!
//! Durable finite-state machines for Rust on PostgreSQL. Declare an FSM, insert
//! instances, deliver signals; workers run one step at a time outside any
//! transaction and commit each step's outcome, fenced by a lease, before the
//! instance goes on. See the README for the tour and the guarantees.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod client;
mod clock;
mod ctx;
mod engine;
mod error;
mod fsm;
mod job;
mod migrate;
mod options;
mod registry;
pub mod runtime;
mod state;
mod status;
mod store;
mod telemetry;

// The operator CLI behind the `gen_durable` binary; not part of the library API.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;

pub use client::{
    Client, Delivery, Entry, Insert, InsertAll, InsertJson, SignalSend, DEFAULT_MAX_SIGNAL_PAYLOAD,
};
pub use clock::Clock;
pub use ctx::{ChildInfo, Ctx, JobCtx, Signal, StepContext};
pub use engine::{DrainReport, Engine, EngineBuilder, QueueConfig, QueueDrain};
pub use error::{Error, Result};
pub use fsm::{
    backoff, backoff_capped, Child, Fsm, Step, StepError, StepErrorKind, StepFuture, StepResult,
};
pub use job::{JobError, JobResult, RetryPolicy};
pub use migrate::migrate;
pub use options::InsertOptions;
pub use registry::{FsmEntry, Registry};
pub use state::{cast_field, json_kind, CastError, DurableState};
pub use status::Status;
pub use telemetry::{Event, EventHandler};

pub use gen_durable_macros::*;

/// The usual imports: `use gen_durable::prelude::*;`
pub mod prelude {
    pub use crate::{
        backoff, Child, Client, Ctx, DurableState, Engine, Fsm, JobCtx, JobError, JobResult,
        Signal, Status, Step, StepError, StepResult,
    };
    pub use gen_durable_macros::{durable_fsm, durable_job, durable_steps};
    pub use serde::{Deserialize, Serialize};
    pub use serde_json::json;
    pub use std::time::Duration;
}

#[doc(hidden)]
pub mod __private;
