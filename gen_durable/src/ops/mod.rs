//! Operations, above the client: pausing a queue cluster-wide, restarting an instance from a
//! named step or a history entry, forking an instance from a past step, cancelling or retrying every instance a [`Filter`] matches (each a method of
//! [`crate::Client`], of the testkit's `TestKit` and a command of the `gen_durable` CLI),
//! moving live instances to a later FSM version in bulk, migrating the schema, and the
//! bounded counts and Prometheus metrics (feature `metrics`).

mod bulk;
#[cfg(feature = "metrics")]
pub(crate) mod counts;
pub(crate) mod fork;
#[cfg(feature = "metrics")]
pub mod metrics;
pub(crate) mod migrate_instances;
mod pause;
mod restart;
pub(crate) mod schema;

pub use bulk::{BulkAction, BulkReport, Filter, FilterMatch, FilterRow, BULK_BATCH};
pub use pause::check_queue;
pub use restart::check_restart_step;
