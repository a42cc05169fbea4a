//! Every SQL statement of gen_durable, one named statement per operation, each with
//! a comment on why it is shaped that way. Nothing outside this module writes SQL, but
//! the schema's migrations — among them the body of the group commit, the function
//! `gd_commit_outcomes` of migration 0004 (a function so that its three statements run
//! in one round trip, each with a fresh snapshot: see `outcome.rs`).
//!
//! Conventions: `$now` is the injected clock (`coalesce($now, now())`); every write
//! to a claimed row is fenced by `(locked_by, lease_epoch)`; wake-ups are one
//! `pg_notify('gd_wake', queue)` per queue per statement, delivered at commit.

/// The fan-in CTE, named `fanin`, shared by every statement that can make a child
/// terminal (an outcome, a reap, a cancel, a release): decrements each parent of the rows
/// of CTE `$src` that are now `done`/`failed`, once per child and in one update per
/// parent, and wakes a parent whose count reaches zero. `$skip` excludes parents the same
/// statement updates itself (Postgres applies only one update per row and statement).
/// `gd_commit_outcomes` (migration 0004) carries the same CTE for outcome commits.
macro_rules! fan_in {
    ($src:literal, $now:literal, $skip:literal) => {
        concat!(
            "fanin AS (
    UPDATE gd_instances p
       SET children_pending = p.children_pending - d.n,
           status = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - d.n = 0
                         THEN 'runnable' ELSE p.status END,
           eligible_at = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - d.n = 0
                              THEN coalesce(",
            $now,
            ", now()) ELSE p.eligible_at END,
           updated_at = coalesce(",
            $now,
            ", now())
      FROM (SELECT parent_id, count(*)::int AS n FROM ",
            $src,
            "
             WHERE status IN ('done', 'failed') AND parent_id IS NOT NULL
             GROUP BY parent_id) d
     WHERE p.id = d.parent_id ",
            $skip,
            "
    RETURNING p.queue, p.status
)"
        )
    };
}

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
