//! Every SQL statement of gen_durable, one named statement per operation, each with
//! a comment on why it is shaped that way. Nothing outside this module writes SQL, but
//! the schema and its `gd_*` functions, as they are now in `gen_durable/sql/` — among them
//! the group commit `gd_commit_outcomes`, the reaper `gd_reap`, the release `gd_release`
//! (functions so that their statements run in one round trip, each with a fresh snapshot)
//! and the fan-in `gd_fan_in`, the one writer of a parent's `children_pending` after its
//! children are inserted.
//!
//! Locking: service statements (claim, commit, heartbeat, reap, release, sweep, collector)
//! take row locks with `SKIP LOCKED` and never wait for one, so a caller's open transaction
//! delays only the rows it holds. Caller statements that wait (delivery, cancel, retry) lock
//! in ascending id order, a parent before its children.
//!
//! Conventions: `$now` is the injected clock (`coalesce($now, now())`); every write
//! to a claimed row is fenced by `(locked_by, lease_epoch)`; wake-ups are one
//! `pg_notify('gd_wake', queue)` per queue per statement, delivered at commit.
//!
//! Markers: every statement's text starts with a comment naming its kind,
//! `/* gd:claim */ WITH picked AS MATERIALIZED …`. The statement counter of
//! `gen_durable_testkit::statements` classifies by it (its `MARKED_KINDS` lists the
//! kinds), and it names the statement in `pg_stat_activity` and the server's log. The
//! kinds: `advance` (a claim's ranges of the log), `claim`, `handoff`, `fence`, `apply`, `insert`, `signal`, `notify`, `heartbeat`, `reap`,
//! `release`, `await_timeouts`, `announce`, `collect`, `cancel`, `retry`, `admin`,
//! `schedule`, `migrate`, `explain`, `history`, `pause` here (`dashboard` in `gen_durable_ops`);
//! `setup` and `begin` in the engine (`engine::shared`). A new statement takes one of
//! them (or a new kind added to that list) at the very start of its text.

pub(crate) mod admin;
pub(crate) mod bulk;
pub(crate) mod claim;
pub(crate) mod control;
#[cfg(feature = "metrics")]
pub(crate) mod counts;
pub(crate) mod explain;
pub(crate) mod gate;
pub(crate) mod handoff;
pub(crate) mod history;
pub(crate) mod insert;
pub(crate) mod lease;
pub(crate) mod log;
pub(crate) mod migration;
pub(crate) mod minutes;
pub(crate) mod outcome;
pub(crate) mod pause;
pub(crate) mod rate_limit;
pub(crate) mod schedule;
pub(crate) mod signal;
pub(crate) mod wait;

use std::borrow::Cow;

/// The LISTEN/NOTIFY channel; the payload is the queue name.
pub(crate) const WAKE_CHANNEL: &str = "gd_wake";

/// The channel that tells a worker to cancel a running step; the payload is the id.
pub(crate) const CANCEL_CHANNEL: &str = "gd_cancel";

/// Postgres' SQLSTATE for unique_violation.
pub(crate) const UNIQUE_VIOLATION: &str = "23505";

/// Milliseconds of a duration, as SQL intervals are built from them.
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The engine's statements under the names and parameter types of the SQL audit's probes
/// (`PREPARE name(types) AS …`), so the probes run against the statements as they are
/// now: `gd_audit_prep` prints them as the probes' `prep.sql`.
pub(crate) fn prepared() -> Vec<(&'static str, &'static str, Cow<'static, str>)> {
    let claim_types = "text, text[], int4[], int8, text, int8, timestamptz";
    let claims = [
        ("claim", "gd_claim"),
        ("claim_rated", "gd_claim_rated"),
        ("claim_plain", "gd_claim_plain"),
    ]
    .map(|(name, function)| (name, claim_types, Cow::Owned(claim::body(function))));
    // The probes reap with two arguments, as before 0029: no TTL, so only leases that
    // expired before the server started are spared.
    let reap = (
        "reap",
        "int8, timestamptz",
        Cow::Owned(lease::REAP.replace("$3", "NULL")),
    );
    let statements = [
        ("deliver", "int8, text, jsonb, text, timestamptz", signal::DELIVER),
        ("expire_awaits", "int8, timestamptz", lease::EXPIRE_AWAITS),
        ("retry", "int8[], timestamptz, text, int4", control::RETRY),
        ("heartbeat", "int8[], int8[], int8, timestamptz, text", lease::HEARTBEAT),
        ("cancel_tree", "int8[]", control::CANCEL_TREE),
        ("cancel_apply", "int8[], timestamptz", control::CANCEL_APPLY),
        ("fence", "int8[], int8[], text", outcome::FENCE),
        ("release", "int8[], int8[], text, timestamptz", lease::RELEASE),
        (
            "insert_one",
            "text, int4, text, jsonb, text, int2, text, text, text, timestamptz, int8, int4, timestamptz, bool, text, text, text, float8",
            insert::INSERT_ONE,
        ),
        (
            "insert",
            "text[], int4[], text[], jsonb[], text[], int2[], text[], text[], text[], timestamptz[], int8[], int4[], timestamptz, int8[], text[], text[], text[], text[], float8[]",
            insert::INSERT,
        ),
        (
            "insert_fresh",
            "text[], int4[], text[], jsonb[], text[], int2[], text[], text[], text[], timestamptz[], int8[], int4[], timestamptz, int8[], text[], text[], text[], text[], float8[]",
            insert::INSERT_FRESH,
        ),
        ("gc", "int8, int8, timestamptz", admin::GC),
    ];
    claims
        .into_iter()
        .chain([reap])
        .chain(statements.map(|(name, types, sql)| (name, types, Cow::Borrowed(sql))))
        .collect()
}

/// Waits (up to 10 s, else panics with `what`) until backend `pid` waits on a lock: a
/// test's way to know that a statement it started on another connection is blocked.
#[cfg(test)]
pub(crate) async fn until_waiting_on_a_lock(db: &sqlx::PgPool, pid: i32, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1",
        )
        .bind(pid)
        .fetch_one(db)
        .await
        .unwrap();
        if waiting {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what} never waited");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Begins a READ COMMITTED transaction and takes its first snapshot, in one round trip.
/// The snapshot makes a later `SET TRANSACTION ISOLATION LEVEL` fail at once, with
/// PostgreSQL's "must be called before any query" (see `ctx.transaction()`).
pub(crate) const BEGIN_READ_COMMITTED: &str =
    "/* gd:begin */ BEGIN ISOLATION LEVEL READ COMMITTED; SELECT";

#[cfg(test)]
mod tests {
    #[test]
    fn every_statement_starts_with_its_marker() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/pg");
        let not_sql = ["WAKE_CHANNEL", "CANCEL_CHANNEL", "UNIQUE_VIOLATION"];
        let seen = gen_durable_testkit::statements::assert_marked(&dir, &not_sql);
        // Every statement of the audit's list is among them: the scan found them all.
        assert!(
            seen >= super::prepared().len(),
            "only {seen} statements found"
        );
        for (name, _, sql) in super::prepared() {
            assert!(sql.starts_with("/* gd:"), "{name}");
        }
        assert!(super::BEGIN_READ_COMMITTED.starts_with("/* gd:begin */"));
        for sql in [super::signal::DELIVER, super::signal::DELIVER_BY_KEY] {
            assert!(sql.starts_with("/* gd:signal */"), "{sql}");
        }
        for sql in [super::insert::INSERT, super::insert::INSERT_FRESH] {
            assert!(sql.starts_with("/* gd:insert */"), "{sql}");
        }
        for sql in [super::bulk::MATCHING_IDS, super::bulk::MATCHING_COUNT] {
            assert!(sql.starts_with("/* gd:admin */"), "{sql}");
        }
    }
}
