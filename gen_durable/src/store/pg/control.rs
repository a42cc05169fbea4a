//! Operator actions on one instance: cancel and retry. Both wait for their row locks
//! (one caller, one instance tree) and take them in ascending id order, a parent before
//! its children, so that they cannot deadlock with each other; the engine's statements
//! never wait, so they cannot deadlock with those.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::UNIQUE_VIOLATION;
use crate::answers::{CancelFound, RetryFound};
use crate::error::Result;
use crate::pooler::On;
use crate::Status;

/// Statement 1 of a cancel: the instance, its live descendants and its parent (whose
/// counter the cancel decrements), locked in id order. `in_tree` is false for the parent.
pub(super) const CANCEL_TREE: &str = r#"/* gd:cancel */
WITH RECURSIVE tree AS (
    SELECT id FROM gd_instances WHERE id = $1
  UNION
    SELECT c.id FROM gd_instances c JOIN tree t ON c.parent_id = t.id
     WHERE c.status NOT IN ('done', 'failed')
)
SELECT i.id, i.status::text, i.id IN (SELECT id FROM tree) AS in_tree
  FROM gd_instances i
 WHERE i.id IN (SELECT id FROM tree)
    OR i.id = (SELECT parent_id FROM gd_instances WHERE id = $1)
 ORDER BY i.id
   FOR NO KEY UPDATE OF i
"#;

/// Statement 2: fail every live row of the tree that is not running (its inbox goes),
/// and flag the running ones: their workers fail them after the current step (told at
/// once by NOTIFY, or by the next heartbeat). A failed row's `children_pending` drops by
/// the children this statement fails with it, so it keeps counting exactly its live
/// children (the flagged ones); the parents outside that set are returned, one element
/// per child failed, for the fan-in.
pub(super) const CANCEL_APPLY: &str = r#"/* gd:cancel */
WITH failed AS (
    UPDATE gd_instances i
       SET status = 'failed', last_error = 'cancelled', cancel_requested = true,
           await_deadline = NULL, updated_at = coalesce($2, now()),
           children_pending = i.children_pending - (
               SELECT count(*)::int FROM gd_instances c
                WHERE c.parent_id = i.id AND c.id = ANY ($1)
                  AND c.status IN ('runnable', 'awaiting_signal', 'awaiting_children'))
     WHERE i.id = ANY ($1) AND i.status IN ('runnable', 'awaiting_signal', 'awaiting_children')
    RETURNING i.id, i.parent_id
), flagged AS (
    UPDATE gd_instances i SET cancel_requested = true
     WHERE i.id = ANY ($1) AND i.status = 'executing'
    RETURNING i.id
), inbox AS (
    DELETE FROM gd_signals s USING failed f WHERE s.target_id = f.id
)
SELECT (SELECT count(*) FROM failed) AS failed,
       (SELECT count(pg_notify('gd_cancel', id::text)) FROM flagged) AS flagged,
       (SELECT coalesce(array_agg(parent_id), '{}') FROM failed
         WHERE parent_id IS NOT NULL AND parent_id NOT IN (SELECT id FROM failed)) AS parents
"#;

/// Statement 3: the fan-in of the parents that statement 2 did not update itself (their
/// locks are held since statement 1).
const FAN_IN: &str =
    "/* gd:cancel */ SELECT count(pg_notify('gd_wake', q)) FROM gd_fan_in($1, coalesce($2, now())) AS q";

/// Cancels instance `id` and its live descendants; `conn` must be in a transaction.
pub(crate) async fn cancel(
    mut conn: On<&mut PgConnection>,
    id: i64,
    now: Option<DateTime<Utc>>,
) -> Result<CancelFound> {
    let locked: Vec<(i64, Status, bool)> = sqlx::query_as(CANCEL_TREE)
        .bind(id)
        .fetch_all(conn.again())
        .await?;
    match locked.iter().find(|(i, _, _)| *i == id) {
        None => return Ok(CancelFound::NotFound),
        Some((_, st, _)) if st.is_terminal() => return Ok(CancelFound::Finished(*st)),
        Some(_) => {}
    }
    let ids: Vec<i64> = locked
        .iter()
        .filter(|(_, st, in_tree)| *in_tree && !st.is_terminal())
        .map(|(i, _, _)| *i)
        .collect();
    let (failed, flagged, parents): (i64, i64, Vec<i64>) = sqlx::query_as(CANCEL_APPLY)
        .bind(ids)
        .bind(now)
        .fetch_one(conn.again())
        .await?;
    if !parents.is_empty() {
        sqlx::query(FAN_IN)
            .bind(parents)
            .bind(now)
            .execute(conn.again())
            .await?;
    }
    Ok(CancelFound::Cancelled {
        failed: failed as usize,
        flagged: flagged as usize,
    })
}

/// A retry in one statement. `locked` takes the instance and its parent in id order (the
/// parent's id is the smaller). A failed instance goes back to where the step it failed in
/// began, with a fresh attempt count: if it still has live children (a cancelled parent
/// whose running child has not stopped yet), it awaits them again (`children_pending`
/// recounted from the rows); if the step was woken by a signal (`awaits` is kept on
/// failure), it awaits one again — its inbox went with the failure — unless one is in;
/// else it is runnable. A child is retried only while its parent awaits its children, and re-arms it
/// (the parent waits for this child again); once the parent has read the child's outcome
/// and gone on, nothing changes (a retried child would end with nobody counting it). A
/// parent already collected waits for nothing.
pub(super) const RETRY: &str = r#"/* gd:retry */
WITH locked AS MATERIALIZED (
    SELECT i.id, i.status, i.parent_id FROM gd_instances i
     WHERE i.id = $1 OR i.id = (SELECT parent_id FROM gd_instances WHERE id = $1)
     ORDER BY i.id
       FOR NO KEY UPDATE OF i
), target AS (
    SELECT * FROM locked WHERE id = $1
), parent AS (
    SELECT l.* FROM locked l JOIN target t ON l.id = t.parent_id
), go AS (
    SELECT t.id FROM target t
     WHERE t.status = 'failed'
       AND coalesce((SELECT status = 'awaiting_children' FROM parent), true)
), retried AS (
    UPDATE gd_instances i
       SET status = (CASE WHEN l.live > 0 THEN 'awaiting_children'
                          WHEN cardinality(i.awaits) > 0 AND NOT EXISTS (
                              SELECT 1 FROM gd_signals s
                               WHERE s.target_id = i.id AND s.name = ANY (i.awaits))
                          THEN 'awaiting_signal'
                          ELSE 'runnable' END)::gd_status,
           children_pending = l.live,
           attempt = 0, reaps = 0, cancel_requested = false,
           await_deadline = NULL, locked_by = NULL, lease_expires_at = NULL,
           eligible_at = coalesce($2, now()), updated_at = coalesce($2, now())
      FROM go,
           (SELECT count(*)::int AS live FROM gd_instances c
             WHERE c.parent_id = $1 AND c.status NOT IN ('done', 'failed')) l
     WHERE i.id = go.id
    RETURNING i.queue, i.status
), rearmed AS (
    UPDATE gd_instances p
       SET children_pending = p.children_pending + 1, updated_at = coalesce($2, now())
      FROM parent
     WHERE p.id = parent.id AND EXISTS (SELECT 1 FROM go)
)
SELECT (SELECT status::text FROM target) AS status,
       (SELECT id FROM parent) AS parent,
       (SELECT status::text FROM parent) AS parent_status,
       (SELECT count(*) FROM retried) AS retried,
       (SELECT count(pg_notify('gd_wake', queue)) FROM retried WHERE status = 'runnable') AS woke
"#;

/// RETRY's row: the instance's status, its parent and the parent's status, rows retried,
/// queues woken.
type RetryRow = (Option<Status>, Option<i64>, Option<Status>, i64, i64);

/// Retries instance `id`.
pub(crate) async fn retry(
    mut conn: On<&mut PgConnection>,
    id: i64,
    now: Option<DateTime<Utc>>,
) -> Result<RetryFound> {
    let found = sqlx::query_as::<_, RetryRow>(RETRY)
        .bind(id)
        .bind(now)
        .fetch_one(conn.again())
        .await;
    let (status, parent, parent_status, retried, _) = match found {
        Ok(row) => row,
        // The row came back into its unique key's scope while another row holds the key.
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(UNIQUE_VIOLATION) => {
            return Ok(RetryFound::KeyTaken)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(match (status, parent.zip(parent_status)) {
        (None, _) => RetryFound::NotFound,
        (Some(_), _) if retried > 0 => RetryFound::Retried,
        (Some(Status::Failed), Some((parent, status))) => {
            RetryFound::ParentMovedOn { parent, status }
        }
        (Some(st), _) => RetryFound::NotFailed(st),
    })
}
