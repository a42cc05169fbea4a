//! Operator actions beyond one instance's `cancel` / `retry`: pausing a queue cluster-wide,
//! restarting an instance from a named step, and cancelling or retrying every instance a
//! [`Filter`] matches. Each is a method of [`crate::Client`] (and of the testkit's
//! `TestKit`), and a command of the `gen_durable` CLI.

mod bulk;
mod pause;
mod restart;

pub use bulk::{BulkAction, BulkReport, Filter, FilterMatch, BULK_BATCH};
pub use pause::check_queue;
pub use restart::check_restart_step;
