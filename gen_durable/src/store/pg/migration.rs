//! Instance migrations: moving rows to a later FSM version. The transforms are Rust
//! (`crate::runtime::instance_migration`); these statements read rows for them and write what they
//! return. Two paths:
//! - a claimed row, migrated by the node that holds its lease before its step runs
//!   (`MIGRATE_CLAIMED`, fenced like an outcome);
//! - rows that are not executing, migrated in bulk by `Client::migrate_instances`: short
//!   transactions over id-ordered batches, each row locked `SKIP LOCKED` (a row a claim or
//!   a caller holds is skipped and left for the lazy path or the next run; the picker,
//!   which skips locked rows too, never waits behind a batch).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgExecutor;

use crate::model::error::Result;
use crate::model::rows::Migrated;

/// Moves a claimed row to `$3` with its new state and step, fenced by the claim (for a
/// plain row claimed from the log, its entry): a row reaped (and perhaps claimed
/// elsewhere) meanwhile is not touched. Attempt, awaits,
/// inbox, children and lease stay: the step then runs on the new version under the same
/// claim.
///
/// The history records it (kind `migrated`, at every level) with the node that did it.
pub(super) const MIGRATE_CLAIMED: &str = r#"/* gd:migrate */
WITH was AS (
    SELECT i.step, i.fsm_version FROM gd_instances i WHERE i.id = $1
), m AS (
UPDATE gd_instances i
   SET fsm_version = $4, state = $5, step = $6, updated_at = coalesce($7, now())
 WHERE i.id = $1
   AND CASE WHEN i.locked_by IS NULL
            THEN i.status = 'runnable' AND i.ready_seq = $2
                 AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                              WHERE l.queue = i.queue AND l.fsm = i.fsm
                                AND l.priority = i.priority AND b.node = $3
                                AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
            ELSE i.lease_epoch = $2 AND i.locked_by = $3 AND i.status = 'executing' END
RETURNING i.id, i.attempt
), told AS (
    INSERT INTO gd_history (instance_id, at, kind, step, attempt, next_step, node, detail)
    SELECT m.id, coalesce($7, now()), 'migrated', w.step, m.attempt + 1, $6, $3,
           format('from version %s to %s', w.fsm_version, $4::int4)
      FROM m CROSS JOIN was w
)
SELECT id FROM m
"#;

/// Writes a claimed row's migration; `false` if its lease was lost.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn migrate_claimed<'e>(
    db: impl PgExecutor<'e>,
    id: i64,
    epoch: i64,
    node: &str,
    version: i32,
    state: &Value,
    step: &str,
    now: Option<DateTime<Utc>>,
) -> Result<bool> {
    let row: Option<i64> = sqlx::query_scalar(MIGRATE_CLAIMED)
        .bind(id)
        .bind(epoch)
        .bind(node)
        .bind(version)
        .bind(Json(state))
        .bind(step)
        .bind(now)
        .fetch_optional(db)
        .await?;
    Ok(row.is_some())
}

/// The versions below `$2` that live (not executing, not finished) rows of FSM `$1` are
/// at: what a bulk migration needs a chain from, checked before it writes anything.
const OLD_VERSIONS: &str = r#"/* gd:migrate */
SELECT DISTINCT fsm_version FROM gd_instances
 WHERE fsm = $1 AND fsm_version < $2 AND status NOT IN ('done', 'failed')
 ORDER BY 1
"#;

pub(crate) async fn old_versions<'e>(
    db: impl PgExecutor<'e>,
    fsm: &str,
    to: i32,
) -> Result<Vec<i32>> {
    Ok(sqlx::query_scalar(OLD_VERSIONS)
        .bind(fsm)
        .bind(to)
        .fetch_all(db)
        .await?)
}

/// One batch for a bulk migration: the next `$4` rows after id `$3` of FSM `$1` below
/// version `$2` that are neither executing nor finished, locked `SKIP LOCKED`. Walks the
/// primary key from the cursor, so each batch starts where the last one stopped. A plain
/// row whose step runs from the log (`gd_on_batch`) is executing.
const LOCK_BATCH: &str = r#"/* gd:migrate */
SELECT id, fsm_version, step, state FROM gd_instances i
 WHERE fsm = $1 AND fsm_version < $2 AND id > $3
   AND status IN ('runnable', 'awaiting_signal', 'awaiting_children')
   AND NOT gd_on_batch(i.queue, i.fsm, i.priority, i.ready_seq)
 ORDER BY id
 LIMIT $4
   FOR NO KEY UPDATE SKIP LOCKED
"#;

/// The same batch read without locking, for a dry run (a lock is a write too).
const PEEK_BATCH: &str = r#"/* gd:migrate */
SELECT id, fsm_version, step, state FROM gd_instances i
 WHERE fsm = $1 AND fsm_version < $2 AND id > $3
   AND status IN ('runnable', 'awaiting_signal', 'awaiting_children')
   AND NOT gd_on_batch(i.queue, i.fsm, i.priority, i.ready_seq)
 ORDER BY id
 LIMIT $4
"#;

/// A row a bulk migration read: `(id, version, step, state)`.
pub(crate) type OldRow = (i64, i32, String, Json<Value>);

pub(crate) async fn batch<'e>(
    db: impl PgExecutor<'e>,
    fsm: &str,
    to: i32,
    after: i64,
    limit: i64,
    lock: bool,
) -> Result<Vec<OldRow>> {
    Ok(sqlx::query_as(if lock { LOCK_BATCH } else { PEEK_BATCH })
        .bind(fsm)
        .bind(to)
        .bind(after)
        .bind(limit)
        .fetch_all(db)
        .await?)
}

/// Writes a batch's migrated rows (locked by the batch's transaction). A plain row leaves
/// its entry in the log for a new one at the end (at commit, `gd_instances_enqueue`): a
/// claim reads rows without locking them, so a claim that read it on its old version just
/// before this commit finds its fence moved and commits nothing of that step. Wakes the
/// queues of the runnable rows it moved, whose entries are new.
///
/// The history records each (kind `migrated`, at every level) with who did it (`$6`, else
/// the role); `was` reads the rows as they were before this statement.
const APPLY_BATCH: &str = r#"/* gd:migrate */
WITH was AS (
    SELECT i.id, i.step, i.fsm_version, i.attempt FROM gd_instances i WHERE i.id = ANY ($1)
), m AS (
    UPDATE gd_instances i
       SET fsm_version = u.version, state = u.state, step = u.step,
           updated_at = coalesce($5, now()), ready_seq = NULL
      FROM unnest($1::int8[], $2::int4[], $3::jsonb[], $4::text[]) AS u(id, version, state, step)
     WHERE i.id = u.id
    RETURNING i.id, i.queue, i.status, i.step, i.fsm_version
), told AS (
    INSERT INTO gd_history (instance_id, at, kind, step, attempt, next_step, actor, detail)
    SELECT m.id, coalesce($5, now()), 'migrated', w.step, w.attempt + 1, m.step,
           coalesce($6::text, session_user),
           format('from version %s to %s', w.fsm_version, m.fsm_version)
      FROM m JOIN was w ON w.id = m.id
)
SELECT count(*),
       (SELECT count(pg_notify('gd_wake', q))
          FROM (SELECT DISTINCT queue AS q FROM m WHERE status = 'runnable') w)
  FROM m
"#;

pub(crate) async fn apply_batch<'e>(
    db: impl PgExecutor<'e>,
    rows: &[(i64, Migrated)],
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<u64> {
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let versions: Vec<i32> = rows.iter().map(|r| r.1.version).collect();
    let states: Vec<Json<&Value>> = rows.iter().map(|r| Json(&r.1.state)).collect();
    let steps: Vec<&str> = rows.iter().map(|r| r.1.step).collect();
    let (n, _): (i64, i64) = sqlx::query_as(APPLY_BATCH)
        .bind(ids)
        .bind(versions)
        .bind(states)
        .bind(steps)
        .bind(now)
        .bind(actor)
        .fetch_one(db)
        .await?;
    Ok(n as u64)
}

/// Records why a row's transform failed, leaving it on its version.
const NOTE_FAILED: &str = r#"/* gd:migrate */
UPDATE gd_instances i SET last_error = u.error, updated_at = coalesce($3, now())
  FROM unnest($1::int8[], $2::text[]) AS u(id, error)
 WHERE i.id = u.id
"#;

pub(crate) async fn note_failed<'e>(
    db: impl PgExecutor<'e>,
    rows: &[(i64, String)],
    now: Option<DateTime<Utc>>,
) -> Result<()> {
    let (ids, errors): (Vec<i64>, Vec<&str>) = rows.iter().map(|(i, e)| (*i, e.as_str())).unzip();
    sqlx::query(NOTE_FAILED)
        .bind(ids)
        .bind(errors)
        .bind(now)
        .execute(db)
        .await?;
    Ok(())
}

/// What is left below version `$2` after a pass: `(executing, other live rows)`.
const LEFT: &str = r#"/* gd:migrate */
SELECT count(*) FILTER (WHERE x.status = 'executing'),
       count(*) FILTER (WHERE x.status <> 'executing')
  FROM (SELECT gd_status_of(i) AS status FROM gd_instances i
         WHERE fsm = $1 AND fsm_version < $2 AND status NOT IN ('done', 'failed')) x
"#;

pub(crate) async fn left<'e>(db: impl PgExecutor<'e>, fsm: &str, to: i32) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(LEFT)
        .bind(fsm)
        .bind(to)
        .fetch_one(db)
        .await?)
}
