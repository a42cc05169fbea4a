//! Every SQL statement of gen_durable, one named statement per operation, each with
//! a comment on why it is shaped that way. Nothing outside this module writes SQL.
//!
//! Conventions: `$now` is the injected clock (`coalesce($now, now())`); every write
//! to a claimed row is fenced by `(locked_by, lease_epoch)`; wake-ups are one
//! `pg_notify('gd_wake', queue)` per queue per statement, delivered at commit.

pub(crate) mod claim;
pub(crate) mod insert;
pub(crate) mod lease;
pub(crate) mod outcome;
pub(crate) mod signal;

/// The LISTEN/NOTIFY channel; the payload is the queue name.
pub(crate) const WAKE_CHANNEL: &str = "gd_wake";

/// Postgres' SQLSTATE for unique_violation.
pub(crate) const UNIQUE_VIOLATION: &str = "23505";

/// Milliseconds of a duration, as SQL intervals are built from them.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
