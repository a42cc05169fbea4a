//! Leases: the heartbeat that extends them, the reaper that takes back expired ones,
//! the release of rows a draining worker gives up, and await deadlines (spec §7.3, §7.5).

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::error::Result;

/// Extends every lease this node holds in one statement (buffered and executing rows
/// alike). Matching on the epoch too means a row that was reaped and re-claimed
/// elsewhere is not extended by mistake. Returns each extended row with its cancel
/// flag, so a cancellation whose NOTIFY was lost still reaches the step.
///
/// Shaped like the group commit (`gd_commit_outcomes`): rows by primary key in id order,
/// each row's epoch found by binary search in the sorted ids, and the fence on
/// `(locked_by, lease_epoch)` alone (`locked_by` is set only while a row is claimed). So
/// no plan rescans the arrays per row or reads every executing row through the lease
/// index, and rows are locked in the same (ascending) order as a commit locks them.
const HEARTBEAT: &str = r#"
UPDATE gd_instances i
   SET lease_expires_at = coalesce($4, now()) + $3 * interval '1 millisecond'
 WHERE i.id = ANY ($1::int8[])
   AND i.locked_by = $5
   AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])]
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
/// `max_reaps`. Bounded and `SKIP LOCKED`, so any number of nodes may reap at once. A
/// row failed here is terminal like any other: its inbox goes, and its parent is
/// decremented (and woken at zero) in the same statement.
const REAP: &str = concat!(
    r#"
WITH expired AS MATERIALIZED (
    SELECT id FROM gd_instances
     WHERE status = 'executing' AND lease_expires_at < coalesce($2, now())
     ORDER BY lease_expires_at
     LIMIT $1
       FOR NO KEY UPDATE SKIP LOCKED
), reaped AS (
    UPDATE gd_instances i
       SET status = (CASE WHEN i.cancel_requested OR i.reaps + 1 >= i.max_reaps
                          THEN 'failed' ELSE 'runnable' END)::gd_status,
           last_error = CASE
               WHEN i.cancel_requested THEN 'cancelled'
               WHEN i.reaps + 1 >= i.max_reaps
               THEN format('lease lost %s times (max_reaps = %s): the step at %L never committed an outcome',
                           i.reaps + 1, i.max_reaps, i.step)
               ELSE format('lease lost on %s (epoch %s); retrying', i.locked_by, i.lease_epoch) END,
           attempt = i.attempt + 1,
           reaps = i.reaps + 1,
           locked_by = NULL,
           lease_expires_at = NULL,
           eligible_at = coalesce($2, now()),
           updated_at = coalesce($2, now())
      FROM expired e
     WHERE i.id = e.id
    RETURNING i.id, i.status, i.parent_id, i.queue
), inbox AS (
    DELETE FROM gd_signals s USING reaped r WHERE s.target_id = r.id AND r.status = 'failed'
), "#,
    fan_in!("reaped", "$2", ""),
    r#", wake AS (
    SELECT count(pg_notify('gd_wake', q)) AS n
      FROM (SELECT queue AS q FROM reaped WHERE status = 'runnable'
            UNION SELECT queue FROM fanin WHERE status = 'runnable') w
)
SELECT r.id, r.status = 'failed' AS failed FROM reaped r, wake ORDER BY r.id
"#
);

/// Reaps up to `limit` expired rows; returns `(id, failed)` for each.
pub(crate) async fn reap<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<(i64, bool)>> {
    Ok(sqlx::query_as(REAP)
        .bind(limit)
        .bind(now)
        .fetch_all(db)
        .await?)
}

/// Gives rows back to `runnable` without counting an attempt: a draining worker's
/// buffer, or steps cancelled at the drain deadline. Fenced like an outcome. A row whose
/// instance was cancelled meanwhile fails instead, as its commit would have.
const RELEASE: &str = concat!(
    r#"
WITH released AS (
    UPDATE gd_instances i
       SET status = (CASE WHEN i.cancel_requested THEN 'failed' ELSE 'runnable' END)::gd_status,
           last_error = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE i.last_error END,
           locked_by = NULL, lease_expires_at = NULL, updated_at = coalesce($4, now())
      FROM unnest($1::int8[], $2::int8[]) AS l(id, epoch)
     WHERE i.id = l.id AND i.lease_epoch = l.epoch AND i.locked_by = $3 AND i.status = 'executing'
    RETURNING i.id, i.status, i.parent_id, i.queue
), inbox AS (
    DELETE FROM gd_signals s USING released r WHERE s.target_id = r.id AND r.status = 'failed'
), "#,
    fan_in!("released", "$4", ""),
    r#"
SELECT r.id,
       (SELECT count(pg_notify('gd_wake', q))
          FROM (SELECT queue AS q FROM released WHERE status = 'runnable'
                UNION SELECT queue FROM fanin WHERE status = 'runnable') d) AS n
  FROM released r
"#
);

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
    let rows: Vec<(i64, i64)> = sqlx::query_as(RELEASE)
        .bind(ids)
        .bind(epochs)
        .bind(node)
        .bind(now)
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(|(id, _)| id).collect())
}

/// Await timeouts: a parked row past its deadline becomes runnable at its next step with
/// `awaits` cleared, so that step sees nothing awaited. `SKIP LOCKED`: a row a delivery
/// holds right now is being woken by that delivery instead.
const EXPIRE_AWAITS: &str = r#"
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
const NEXT_DEADLINE: &str = r#"
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
