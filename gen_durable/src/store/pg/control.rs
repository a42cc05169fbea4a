//! Operator actions on one instance: cancel and retry.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Result;
use crate::Status;

/// Statement 1 of a cancel: the instance and its live descendants, locked in id order.
const CANCEL_TREE: &str = r#"
WITH RECURSIVE tree AS (
    SELECT id FROM gd_instances WHERE id = $1
  UNION
    SELECT c.id FROM gd_instances c JOIN tree t ON c.parent_id = t.id
     WHERE c.status NOT IN ('done', 'failed')
)
SELECT i.id, i.status FROM gd_instances i JOIN tree USING (id) ORDER BY i.id
   FOR NO KEY UPDATE OF i
"#;

/// Statement 2: fail every live row of the tree that is not running (its inbox goes, and
/// a parent outside the tree is decremented), and flag the running ones: their workers
/// fail them after the current step (told at once by NOTIFY, or by the next heartbeat).
const CANCEL_APPLY: &str = concat!(
    r#"
WITH failed AS (
    UPDATE gd_instances i
       SET status = 'failed', last_error = 'cancelled', cancel_requested = true,
           await_deadline = NULL, updated_at = coalesce($2, now())
     WHERE i.id = ANY ($1) AND i.status IN ('runnable', 'awaiting_signal', 'awaiting_children')
    RETURNING i.id, i.status, i.parent_id, i.queue
), flagged AS (
    UPDATE gd_instances i SET cancel_requested = true
     WHERE i.id = ANY ($1) AND i.status = 'executing'
    RETURNING i.id
), inbox AS (
    DELETE FROM gd_signals s USING failed f WHERE s.target_id = f.id
), "#,
    fan_in!("failed", "$2", "AND p.id <> ALL ($1)"),
    r#"
SELECT (SELECT count(*) FROM failed) AS failed,
       (SELECT count(pg_notify('gd_cancel', id::text)) FROM flagged) AS flagged,
       (SELECT count(pg_notify('gd_wake', queue)) FROM fanin WHERE status = 'runnable') AS woke
"#
);

/// What a cancel found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelResult {
    NotFound,
    Finished(Status),
    Done { failed: i64, flagged: i64 },
}

/// Cancels instance `id` and its live descendants; `conn` must be in a transaction.
pub(crate) async fn cancel(
    conn: &mut PgConnection,
    id: i64,
    now: Option<DateTime<Utc>>,
) -> Result<CancelResult> {
    let tree: Vec<(i64, Status)> = sqlx::query_as(CANCEL_TREE)
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
    match tree.iter().find(|(i, _)| *i == id) {
        None => return Ok(CancelResult::NotFound),
        Some((_, st)) if st.is_terminal() => return Ok(CancelResult::Finished(*st)),
        Some(_) => {}
    }
    let ids: Vec<i64> = tree
        .iter()
        .filter(|(_, st)| !st.is_terminal())
        .map(|(i, _)| *i)
        .collect();
    let (failed, flagged, _): (i64, i64, i64) = sqlx::query_as(CANCEL_APPLY)
        .bind(ids)
        .bind(now)
        .fetch_one(&mut *conn)
        .await?;
    Ok(CancelResult::Done { failed, flagged })
}

/// Makes a failed instance runnable again at its step, with a fresh attempt count.
const RETRY: &str = r#"
WITH target AS (
    SELECT id, status FROM gd_instances WHERE id = $1 FOR NO KEY UPDATE
), retried AS (
    UPDATE gd_instances i
       SET status = 'runnable', attempt = 0, reaps = 0, cancel_requested = false,
           children_pending = 0, awaits = '{}', await_deadline = NULL,
           locked_by = NULL, lease_expires_at = NULL,
           eligible_at = coalesce($2, now()), updated_at = coalesce($2, now())
      FROM target t
     WHERE i.id = t.id AND t.status = 'failed'
    RETURNING i.queue
)
SELECT (SELECT status FROM target) AS status,
       (SELECT count(pg_notify('gd_wake', queue)) FROM retried) AS retried
"#;

/// Returns the status found (None: no such row) and whether it was retried.
pub(crate) async fn retry(
    conn: &mut PgConnection,
    id: i64,
    now: Option<DateTime<Utc>>,
) -> Result<(Option<Status>, bool)> {
    let (status, retried): (Option<Status>, i64) = sqlx::query_as(RETRY)
        .bind(id)
        .bind(now)
        .fetch_one(&mut *conn)
        .await?;
    Ok((status, retried > 0))
}
