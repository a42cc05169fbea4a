//! Leases: the heartbeat that extends them, the reaper that takes back expired ones,
//! the release of rows a draining worker gives up, and await deadlines.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;

/// Extends every lease this node holds in one statement (buffered and executing rows
/// alike). Matching on the epoch too means a row that was reaped and re-claimed
/// elsewhere is not extended by mistake. Returns each extended row with its cancel
/// flag, so a cancellation whose NOTIFY was lost still reaches the step.
///
/// A row someone else has locked right now (a caller's transaction that signalled it and
/// stays open) is skipped, not waited for: waiting would hold up every lease after it,
/// and the reaper skips a locked row too, so a skipped row is extended at the next beat.
/// Shaped like the group commit: rows by primary key in id order, each row's epoch found
/// by binary search in the sorted ids (no join whose plan could rescan the arrays per
/// row), and the update reads the locked ids as one array (an index scan by `= ANY`).
pub(super) const HEARTBEAT: &str = r#"/* gd:heartbeat */
WITH mine AS MATERIALIZED (
    SELECT i.id FROM gd_instances i
     WHERE i.id = ANY ($1::int8[])
       AND i.locked_by = $5
       AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])]
     ORDER BY i.id
       FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE gd_instances i
   SET lease_expires_at = coalesce($4, now()) + $3 * interval '1 millisecond'
 WHERE i.id = ANY ((SELECT array_agg(id) FROM mine)::int8[])
RETURNING i.id, i.cancel_requested
"#;

pub(crate) async fn heartbeat<'e>(
    db: impl PgExecutor<'e>,
    leases: &[(i64, i64)],
    ttl_ms: i64,
    node: &str,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<(i64, bool)>> {
    let mut sorted = leases.to_vec();
    sorted.sort_unstable();
    let (ids, epochs): (Vec<i64>, Vec<i64>) = sorted.into_iter().unzip();
    Ok(sqlx::query_as(HEARTBEAT)
        .bind(ids)
        .bind(epochs)
        .bind(ttl_ms)
        .bind(now)
        .bind(node)
        .fetch_all(db)
        .await?)
}

/// Returns expired executing rows to `runnable` with `attempt + 1` (the lost worker's
/// step will run again; `handle` is not called), or fails them once `reaps` reaches
/// `max_reaps`: the function `gd_reap` of `gen_durable/sql/lease.sql`. A lease that ran out
/// while the database was down (its row claimed before the server's start, and expired
/// before the start plus `$3`, the lease TTL) is not counted toward `max_reaps`. Bounded and `SKIP LOCKED`, so any number of
/// nodes may reap at once and none waits behind a caller. A row failed here is terminal
/// like any other: its inbox goes and its parent is decremented.
pub(super) const REAP: &str =
    "/* gd:reap */ SELECT id, failed FROM gd_reap($1, $2, NULL, $3) ORDER BY id";

/// The same for the given rows only, when a batch failed (see the reaper).
const REAP_ONLY: &str = "/* gd:reap */ SELECT id, failed FROM gd_reap($1, $2, $3, $4) ORDER BY id";

/// The expired rows a reap would take, oldest lease first, for reaping one by one.
const EXPIRED: &str = r#"/* gd:reap */
SELECT id FROM gd_instances
 WHERE status = 'executing' AND lease_expires_at < coalesce($2, now())
 ORDER BY lease_expires_at
 LIMIT $1
"#;

/// Reaps up to `limit` expired rows; returns `(id, failed)` for each. `ttl_ms` is the
/// lease TTL, which tells the leases a restart of the database took (see [`REAP`]).
pub(crate) async fn reap<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
    now: Option<DateTime<Utc>>,
    ttl_ms: i64,
) -> Result<Vec<(i64, bool)>> {
    Ok(sqlx::query_as(REAP)
        .bind(limit)
        .bind(now)
        .bind(ttl_ms)
        .fetch_all(db)
        .await?)
}

/// Reaps row `id` alone, if its lease has expired.
pub(crate) async fn reap_one<'e>(
    db: impl PgExecutor<'e>,
    id: i64,
    now: Option<DateTime<Utc>>,
    ttl_ms: i64,
) -> Result<Vec<(i64, bool)>> {
    Ok(sqlx::query_as(REAP_ONLY)
        .bind(1_i64)
        .bind(now)
        .bind(vec![id])
        .bind(ttl_ms)
        .fetch_all(db)
        .await?)
}

/// The ids of up to `limit` expired rows, oldest lease first.
pub(crate) async fn expired<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(EXPIRED)
        .bind(limit)
        .bind(now)
        .fetch_all(db)
        .await?)
}

/// Gives rows back to `runnable` without counting an attempt: a draining worker's
/// buffer, or steps cancelled at the drain deadline. Fenced like an outcome; a row whose
/// instance was cancelled meanwhile fails instead, as its commit would have. The function
/// `gd_release` of `gen_durable/sql/lease.sql`: a row it cannot lock at once is left to its lease.
pub(super) const RELEASE: &str =
    "/* gd:release */ SELECT id FROM gd_release($1, $2, $3, $4) AS r(id)";

pub(crate) async fn release<'e>(
    db: impl PgExecutor<'e>,
    leases: &[(i64, i64)],
    node: &str,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<i64>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, epochs): (Vec<i64>, Vec<i64>) = leases.iter().copied().unzip();
    Ok(sqlx::query_scalar(RELEASE)
        .bind(ids)
        .bind(epochs)
        .bind(node)
        .bind(now)
        .fetch_all(db)
        .await?)
}

/// Await timeouts: a parked row past its deadline becomes runnable at its next step with
/// `awaits` cleared, so that step sees nothing awaited. `SKIP LOCKED`: a row a delivery
/// holds right now is being woken by that delivery instead.
pub(super) const EXPIRE_AWAITS: &str = r#"/* gd:await_timeouts */
WITH due AS MATERIALIZED (
    SELECT id FROM gd_instances
     WHERE status = 'awaiting_signal' AND await_deadline <= coalesce($2, now())
     ORDER BY await_deadline
     LIMIT $1
       FOR NO KEY UPDATE SKIP LOCKED
), woken AS (
    UPDATE gd_instances i
       SET status = 'runnable', awaits = '{}', await_deadline = NULL,
           eligible_at = coalesce($2, now()), updated_at = coalesce($2, now())
      FROM due d
     WHERE i.id = d.id
    RETURNING i.id, i.queue
)
SELECT count(*) AS n,
       (SELECT count(pg_notify('gd_wake', q)) FROM (SELECT DISTINCT queue AS q FROM woken) d) AS notified
  FROM woken
"#;

pub(crate) async fn expire_awaits<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<i64> {
    let (n, _): (i64, i64) = sqlx::query_as(EXPIRE_AWAITS)
        .bind(limit)
        .bind(now)
        .fetch_one(db)
        .await?;
    Ok(n)
}

/// Milliseconds until the earliest await deadline, by the database clock (never the
/// worker's), so the timeout service can sleep until it.
const NEXT_DEADLINE: &str = r#"/* gd:await_timeouts */
SELECT (extract(epoch FROM min(await_deadline) - coalesce($1, now())) * 1000)::int8
  FROM gd_instances WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL
"#;

pub(crate) async fn next_deadline_ms<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(NEXT_DEADLINE)
        .bind(now)
        .fetch_one(db)
        .await?)
}
