//! Not part of the stable API: the door for `gen_durable_ops` and `gen_durable_testkit`;
//! it may change in any release. Depend on the public API instead.
//!
//! What a second engine needs to behave as this one does (the in-memory kit): the step
//! runner's input and output, what a store reports back to the caller-facing code, and
//! the checks both run before they write. And what the operator tools (the `gen_durable`
//! CLI, the dashboard) need beyond the public API: reads that must share a caller's
//! transaction or connection, the bounded counts behind the dashboard and the metrics,
//! and the text of the engine's statements.

pub use crate::model::answers::{inserted, CancelFound, DeliveryFound, RestartFound, RetryFound};
pub use crate::model::explain::{ExplainFacts, NodeFacts};
pub use crate::model::gate::ConcurrencyKey;
pub use crate::model::insert::NewInstance;
pub use crate::model::rows::{Redeclared, ScheduleDeclaration, StoredSchedule, WaitRow};
pub use crate::model::step::{Outcome, StepOutput};
pub use crate::model::transition::KeyChange;
pub use crate::model::validate::{check_signal, check_target};
pub use crate::ops::fork::{fork_row, ForkOf};
pub use crate::ops::{check_queue, check_restart_step, BulkAction, FilterMatch, FilterRow};
pub use crate::runtime::{refused, run_erased, StepInput};

/// The engine's statements as `(name, parameter types, SQL)`, named as the SQL audit's
/// probes name them (see `gd_audit_prep` and `scripts/audit.sh`).
pub fn prepared_statements() -> Vec<(&'static str, &'static str, std::borrow::Cow<'static, str>)> {
    crate::store::pg::prepared()
}

pub use crate::store::pg::millis;

/// The schema migrations this build embeds: how many there are, and whether a database
/// has exactly them.
pub mod schema {
    pub use crate::ops::schema::{check, embedded};
}

/// Node announcements, the clock of the database and the collector's delete.
pub mod admin {
    pub use crate::store::pg::admin::{
        announce, db_now, forget, gc_batch, GC_BATCH, NODE_LIVE_WINDOW_MS,
    };
}

/// Gate usage, on any executor (`Client::gates` reads it on the pool).
pub mod gate {
    pub use crate::store::pg::gate::{usage, UsageRow};
}

/// Rate-limit buckets, on any executor (`Client::rate_limits` reads them on the pool).
pub mod rate_limit {
    pub use crate::store::pg::rate_limit::buckets;
}

/// Paused queues, on any executor (`Client::paused_queues` reads them on the pool).
pub mod pause {
    pub use crate::store::pg::pause::paused;
}

/// An instance's id by its correlation key.
pub mod wait {
    pub use crate::store::pg::wait::id_by_key;
}

/// Rows per queue and status at a bounded cost (what `metrics::observe_queues` exports),
/// and the statements behind them.
#[cfg(feature = "metrics")]
pub mod counts {
    pub use crate::ops::counts::{
        queue_counts, waiting, Counts, Figure, QueueCounts, WaitReason, Waiting,
    };
    pub use crate::store::pg::counts::{
        sample_percent, table_pages, EXECUTING, LANES, SAMPLE_BY_QUEUE, TABLE_PAGES, WAITING,
    };
}
