//! Every SQL statement of gen_durable, one named statement per operation, each with
//! a comment on why it is shaped that way. Nothing outside this module writes SQL, but
//! the schema's migrations — among them the functions of migration 0005: the group
//! commit `gd_commit_outcomes`, the reaper `gd_reap`, the release `gd_release` (functions
//! so that their statements run in one round trip, each with a fresh snapshot) and the
//! fan-in `gd_fan_in`, the one writer of a parent's `children_pending` after its children
//! are inserted.
//!
//! Locking: service statements (claim, commit, heartbeat, reap, release, sweep, collector)
//! take row locks with `SKIP LOCKED` and never wait for one, so a caller's open transaction
//! delays only the rows it holds. Caller statements that wait (delivery, cancel, retry) lock
//! in ascending id order, a parent before its children.
//!
//! Conventions: `$now` is the injected clock (`coalesce($now, now())`); every write
//! to a claimed row is fenced by `(locked_by, lease_epoch)`; wake-ups are one
//! `pg_notify('gd_wake', queue)` per queue per statement, delivered at commit.

pub(crate) mod admin;
pub(crate) mod claim;
pub(crate) mod control;
pub(crate) mod insert;
pub(crate) mod lease;
pub(crate) mod outcome;
pub(crate) mod signal;

/// The LISTEN/NOTIFY channel; the payload is the queue name.
pub(crate) const WAKE_CHANNEL: &str = "gd_wake";

/// The channel that tells a worker to cancel a running step; the payload is the id.
pub(crate) const CANCEL_CHANNEL: &str = "gd_cancel";

/// Postgres' SQLSTATE for unique_violation.
pub(crate) const UNIQUE_VIOLATION: &str = "23505";

/// Milliseconds of a duration, as SQL intervals are built from them.
pub(crate) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The engine's statements under the names and parameter types of the SQL audit's probes
/// (`PREPARE name(types) AS …`), so the probes run against the statements as they are
/// now: `gd_audit_prep` prints them as the probes' `prep.sql`.
pub(crate) fn prepared() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        ("claim", "text, text[], int4[], int8, text, int8, timestamptz", claim::CLAIM),
        ("reap", "int8, timestamptz", lease::REAP),
        ("deliver", "int8, text, jsonb, text, timestamptz", signal::DELIVER),
        ("expire_awaits", "int8, timestamptz", lease::EXPIRE_AWAITS),
        ("retry", "int8, timestamptz", control::RETRY),
        ("heartbeat", "int8[], int8[], int8, timestamptz, text", lease::HEARTBEAT),
        ("cancel_tree", "int8", control::CANCEL_TREE),
        ("cancel_apply", "int8[], timestamptz", control::CANCEL_APPLY),
        ("fence", "int8[], int8[], text", outcome::FENCE),
        ("release", "int8[], int8[], text, timestamptz", lease::RELEASE),
        (
            "insert_one",
            "text, int4, text, jsonb, text, int2, text, text, text, timestamptz, int8, int4, timestamptz, bool",
            insert::INSERT_ONE,
        ),
        (
            "insert",
            "text[], int4[], text[], jsonb[], text[], int2[], text[], text[], text[], timestamptz[], int8[], int4[], timestamptz, int8[], text[]",
            insert::INSERT,
        ),
        ("gc", "int8, int8, timestamptz", admin::GC),
    ]
}
