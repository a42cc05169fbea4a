//! Operator actions on instances: cancel, retry and restart, of one instance or of a
//! batch (`Client::cancel_where` / `retry_where`). They wait for their row locks
//! (one caller, one instance tree) and take them in ascending id order, a parent before
//! its children, so that they cannot deadlock with each other; the engine's statements
//! never wait for an instance, so they cannot deadlock with those. A cancel or a restart
//! that gives rate-limit tokens back locks the buckets after all its instances, in key
//! order, as a claim does (which locks its instances without waiting): no cycle.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::UNIQUE_VIOLATION;
use crate::model::answers::RestartFound;
use crate::model::answers::{CancelFound, RetryFound};
use crate::model::error::Result;
use crate::store::pooler::On;
use crate::Status;

/// The end of a `refund` CTE of (`rate_limit`, `rate_key`, `w`) rows `r`, in key order:
/// each bucket locked (as a claim locks them, after every instance), then given back `w`
/// tokens that waiting rows had reserved (migration 0031). CANCEL_APPLY and RETRY.
macro_rules! give_back {
    () => {
        "     CROSS JOIN LATERAL (SELECT g.ctid AS tid FROM gd_buckets g
                          WHERE g.name = r.rate_limit AND g.key = r.rate_key
                            FOR NO KEY UPDATE) b
), refunded AS (
    UPDATE gd_buckets g SET tokens = g.tokens + f.w, held = greatest(g.held - f.w, 0)
      FROM refund f WHERE g.ctid = f.tid
"
    };
}

/// Statement 1 of a cancel: the instances `$1` (one for `Client::cancel`, a batch for
/// `Client::cancel_where`), their live descendants and their parents (whose counters the
/// cancel decrements), locked in id order. `in_tree` is false for a parent outside the
/// set. Only a live row's children are followed: a root that finished meanwhile brings
/// nothing of its own into the cancel. The rows to lock are one array of ids, read by
/// primary key: as `id IN (tree) OR id IN (parents)` they were a scan of the whole table.
pub(super) const CANCEL_TREE: &str = r#"/* gd:cancel */
WITH RECURSIVE tree AS (
    SELECT id, status FROM gd_instances WHERE id = ANY ($1)
  UNION
    SELECT c.id, c.status FROM gd_instances c JOIN tree t ON c.parent_id = t.id
     WHERE c.status NOT IN ('done', 'failed') AND t.status NOT IN ('done', 'failed')
)
SELECT i.id, gd_status_of(i)::text, i.id IN (SELECT id FROM tree) AS in_tree
  FROM gd_instances i
 WHERE i.id = ANY (ARRAY(SELECT id FROM tree)
                   || ARRAY(SELECT parent_id FROM gd_instances
                             WHERE id = ANY ($1) AND parent_id IS NOT NULL))
 ORDER BY i.id
   FOR NO KEY UPDATE OF i
"#;

/// Statement 2: fail every live row of the tree that is not running (its inbox goes),
/// and flag the running ones (a plain row runs while its entry lies in a live batch of the
/// log: `gd_status_of`): their workers fail them after the current step (told at
/// once by NOTIFY, or by the next heartbeat). A failed row's `children_pending` drops by
/// the children this statement fails with it, so it keeps counting exactly its live
/// children (the flagged ones); the parents outside that set are returned, one element
/// per child failed, for the fan-in.
pub(super) const CANCEL_APPLY: &str = concat!(
    r#"/* gd:cancel */
WITH refund AS MATERIALIZED (
    -- The rate-limit tokens that the runnable rows about to fail reserved, given back to
    -- their buckets (migration 0031); the buckets locked in key order, as a claim locks
    -- them.
    SELECT b.tid, r.w
      FROM (SELECT i.rate_limit, i.rate_key, sum(i.rate_weight) AS w
              FROM gd_instances i
             WHERE i.id = ANY ($1) AND i.status = 'runnable' AND i.rate_paid
             GROUP BY 1, 2 ORDER BY 1, 2) r
"#,
    give_back!(),
    r#"), failed AS (
    UPDATE gd_instances i
       SET status = 'failed', last_error = 'cancelled', cancel_requested = true,
           await_deadline = NULL, updated_at = coalesce($2, now()), rate_paid = false,
           children_pending = i.children_pending - (
               SELECT count(*)::int FROM gd_instances c
                WHERE c.parent_id = i.id AND c.id = ANY ($1)
                  AND gd_status_of(c) IN ('runnable', 'awaiting_signal', 'awaiting_children'))
     WHERE i.id = ANY ($1)
       AND gd_status_of(i) IN ('runnable', 'awaiting_signal', 'awaiting_children')
    RETURNING i.id, i.parent_id, i.step, i.attempt
), flagged AS (
    UPDATE gd_instances i SET cancel_requested = true
     WHERE i.id = ANY ($1) AND gd_status_of(i) = 'executing'
    RETURNING i.id, i.step, i.attempt
), inbox AS (
    DELETE FROM gd_signals s USING failed f WHERE s.target_id = f.id
), told AS (
    -- In the history, at every level, with who did it (`$3`, else the role).
    INSERT INTO gd_history (instance_id, at, kind, step, attempt, error, actor)
    SELECT f.id, coalesce($2, now()), 'cancelled', f.step, f.attempt + 1, 'cancelled',
           coalesce($3::text, session_user)
      FROM failed f
    UNION ALL
    SELECT f.id, coalesce($2, now()), 'cancel_requested', f.step, f.attempt + 1, NULL,
           coalesce($3::text, session_user)
      FROM flagged f
)
SELECT (SELECT count(*) FROM failed) AS failed,
       (SELECT count(pg_notify('gd_cancel', id::text)) FROM flagged) AS flagged,
       (SELECT coalesce(array_agg(parent_id), '{}') FROM failed
         WHERE parent_id IS NOT NULL AND parent_id NOT IN (SELECT id FROM failed)) AS parents
"#
);

/// Statement 3: the fan-in of the parents that statement 2 did not update itself (their
/// locks are held since statement 1).
const FAN_IN: &str =
    "/* gd:cancel */ SELECT count(pg_notify('gd_wake', q)) FROM gd_fan_in($1, coalesce($2, now())) AS q";

/// Cancels instance `id` and its live descendants, for `actor`; `conn` must be in a
/// transaction.
pub(crate) async fn cancel(
    conn: On<&mut PgConnection>,
    id: i64,
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<CancelFound> {
    let batch = cancel_many(conn, &[id], actor, now).await?;
    Ok(match batch.roots.first() {
        None => CancelFound::NotFound,
        Some((_, st)) if st.is_terminal() => CancelFound::Finished(*st),
        Some(_) => CancelFound::Cancelled {
            failed: batch.failed,
            flagged: batch.flagged,
        },
    })
}

/// What one cancel of several roots found and did.
#[derive(Debug, Default)]
pub(crate) struct CancelBatch {
    /// The roots found, with their status when locked (a root not listed is gone).
    pub(crate) roots: Vec<(i64, Status)>,
    /// Rows failed at once (live roots and their live descendants).
    pub(crate) failed: usize,
    /// Executing rows flagged to fail after their step.
    pub(crate) flagged: usize,
}

/// Cancels the live ones of instances `ids` with their live descendants, in the
/// statements of a single cancel, for `actor`; `conn` must be in a transaction. Roots
/// that are terminal when locked are left as they are.
pub(crate) async fn cancel_many(
    mut conn: On<&mut PgConnection>,
    ids: &[i64],
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<CancelBatch> {
    let locked: Vec<(i64, Status, bool)> = sqlx::query_as(CANCEL_TREE)
        .bind(ids)
        .fetch_all(conn.again())
        .await?;
    let roots: Vec<(i64, Status)> = locked
        .iter()
        .filter(|(i, _, _)| ids.contains(i))
        .map(|(i, st, _)| (*i, *st))
        .collect();
    let tree: Vec<i64> = locked
        .iter()
        .filter(|(_, st, in_tree)| *in_tree && !st.is_terminal())
        .map(|(i, _, _)| *i)
        .collect();
    if tree.is_empty() {
        return Ok(CancelBatch {
            roots,
            ..CancelBatch::default()
        });
    }
    let (failed, flagged, parents): (i64, i64, Vec<i64>) = sqlx::query_as(CANCEL_APPLY)
        .bind(tree)
        .bind(now)
        .bind(actor)
        .fetch_one(conn.again())
        .await?;
    if !parents.is_empty() {
        sqlx::query(FAN_IN)
            .bind(parents)
            .bind(now)
            .execute(conn.again())
            .await?;
    }
    Ok(CancelBatch {
        roots,
        failed: failed as usize,
        flagged: flagged as usize,
    })
}

/// A retry, or a restart at a named step, of instances `$1`, in one statement.
/// `locked` takes the instances and their parents in id order (a parent's id is the
/// smaller).
///
/// A retry (`$3` NULL) puts a failed instance back where the step it failed in began,
/// with a fresh attempt count: if it still has live children (a cancelled parent whose
/// running child has not stopped yet), it awaits them again (`children_pending` recounted
/// from the rows); if the step was woken by a signal (`awaits` is kept on failure), it
/// awaits one again — its inbox went with the failure — unless one is in; else it is
/// runnable.
///
/// A restart from a history entry also takes that entry's state (`$6`, the entry `$7`).
///
/// A restart (`$3` the step) takes any instance that is not executing, has no live
/// children and is still at the FSM version `$4` its step was checked against (a bulk
/// instance migration may have moved it since) — failed, done, runnable or parked — and
/// makes it runnable now at step `$3`:
/// attempt 0, nothing awaited, no deadline, no result; its inbox, kept while it lived, is
/// there for the step to read. Rate-limit tokens a runnable row reserved stay reserved
/// for a restart at the step they were reserved for, and go back to the bucket otherwise
/// (`refund`); a claim starts the row only when its bucket holds them (migration 0031).
///
/// Either way a finished child is taken back only while its parent awaits its children,
/// and re-arms it (the parent waits for this child again); once the parent has read the
/// child's outcome and gone on, nothing changes (a taken-back child would end with nobody
/// counting it). A parent already collected waits for nothing; a live child is still
/// counted by its parent. A row coming back into its unique key's scope while another
/// row holds the key fails the statement on the unique index (the caller's `KeyTaken`).
/// One row per instance found: its status when locked, its parent and the parent's
/// status, its live children, whether it was taken; the queues woken. The instances and
/// their parents are locked through one array of ids (primary-key probes), as in
/// [`CANCEL_TREE`].
pub(super) const RETRY: &str = concat!(
    r#"/* gd:retry */
WITH locked AS MATERIALIZED (
    SELECT i.id, gd_status_of(i) AS status, i.parent_id, i.fsm_version, i.step, i.rate_limit,
           i.rate_key, i.rate_weight, i.rate_step, i.rate_paid
      FROM gd_instances i
     WHERE i.id = ANY ($1 || ARRAY(SELECT parent_id FROM gd_instances
                                    WHERE id = ANY ($1) AND parent_id IS NOT NULL))
     ORDER BY i.id
       FOR NO KEY UPDATE OF i
), target AS (
    SELECT l.id, l.status, l.parent_id, l.fsm_version, l.step,
           (SELECT count(*)::int FROM gd_instances c
             WHERE c.parent_id = l.id AND c.status NOT IN ('done', 'failed')) AS live
      FROM locked l WHERE l.id = ANY ($1)
), judged AS MATERIALIZED (
    SELECT t.*, p.status AS parent_status,
           (CASE WHEN $3::text IS NULL THEN t.status = 'failed'
                 ELSE t.status <> 'executing' AND t.live = 0
                      AND t.fsm_version = coalesce($4::int4, t.fsm_version) END)
           AND (t.status NOT IN ('done', 'failed')
                OR coalesce(p.status = 'awaiting_children', true)) AS go
      FROM target t LEFT JOIN locked p ON p.id = t.parent_id
), refund AS MATERIALIZED (
    -- A reservation of rate-limit tokens stays with a row restarted at the step it was
    -- made for (the row keeps its place in its bucket's line); a row restarted at another
    -- step gives its tokens back (migration 0031). Read from `locked`: the rows as they
    -- are once locked (a claim that held one may have reserved for it meanwhile), where
    -- the statement's snapshot may be older. Buckets locked in key order.
    SELECT b.tid, r.w
      FROM (SELECT l.rate_limit, l.rate_key, sum(l.rate_weight) AS w
              FROM locked l JOIN judged j ON j.id = l.id
             WHERE j.go AND l.status = 'runnable' AND l.rate_paid
               AND l.rate_step IS DISTINCT FROM coalesce($3::text, l.step)
             GROUP BY 1, 2 ORDER BY 1, 2) r
"#,
    give_back!(),
    r#"), retried AS (
    UPDATE gd_instances i
       SET status = (CASE WHEN $3::text IS NOT NULL THEN 'runnable'
                          WHEN j.live > 0 THEN 'awaiting_children'
                          WHEN cardinality(i.awaits) > 0 AND NOT EXISTS (
                              SELECT 1 FROM gd_signals s
                               WHERE s.target_id = i.id AND s.name = ANY (i.awaits))
                          THEN 'awaiting_signal'
                          ELSE 'runnable' END)::gd_status,
           step = coalesce($3::text, i.step),
           state = coalesce($6::jsonb, i.state),
           awaits = CASE WHEN $3::text IS NULL THEN i.awaits ELSE '{}' END,
           result = CASE WHEN $3::text IS NULL THEN i.result END,
           children_pending = j.live,
           attempt = 0, reaps = 0, cancel_requested = false,
           await_deadline = NULL, locked_by = NULL, lease_expires_at = NULL,
           eligible_at = coalesce($2, now()), updated_at = coalesce($2, now()),
           rate_paid = i.rate_paid AND i.status = 'runnable'
                       AND i.rate_step = coalesce($3::text, i.step)
      FROM judged j
     WHERE i.id = j.id AND j.go
    RETURNING i.id, i.queue, i.status, j.step AS was_step, i.step
), told AS (
    -- In the history, at every level, with who did it (`$5`, else the role).
    INSERT INTO gd_history (instance_id, at, kind, step, attempt, next_step, actor, detail)
    SELECT r.id, coalesce($2, now()),
           CASE WHEN $3::text IS NULL THEN 'retried' ELSE 'restarted' END, r.was_step, 1,
           CASE WHEN $3::text IS NOT NULL THEN r.step END, coalesce($5::text, session_user),
           CASE WHEN $7::int8 IS NOT NULL THEN format('with the state of entry %s', $7) END
      FROM retried r
), rearmed AS (
    UPDATE gd_instances p
       SET children_pending = p.children_pending + r.n, updated_at = coalesce($2, now())
      FROM (SELECT parent_id, count(*)::int AS n FROM judged
             WHERE go AND status IN ('done', 'failed') AND parent_status IS NOT NULL
             GROUP BY parent_id) r
     WHERE p.id = r.parent_id
)
SELECT j.id, j.status::text AS status, j.parent_id, j.parent_status::text AS parent_status,
       j.live, j.go, j.fsm_version,
       (SELECT count(pg_notify('gd_wake', q.queue))
          FROM (SELECT DISTINCT queue FROM retried WHERE status = 'runnable') q) AS woke
  FROM judged j
 ORDER BY j.id
"#
);

/// RETRY's row for one instance.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct Rerun {
    /// Its status when locked.
    pub(crate) status: Status,
    pub(crate) parent_id: Option<i64>,
    /// The parent's status; `None` without a parent, or one already collected.
    pub(crate) parent_status: Option<Status>,
    /// Its live children.
    pub(crate) live: i32,
    /// Retried (or restarted).
    pub(crate) go: bool,
    /// Its FSM version when locked.
    pub(crate) fsm_version: i32,
}

/// What one RETRY statement found: a row per instance found, or `KeyTaken` when one of
/// them came back into its unique key's scope while another row holds the key (then
/// nothing changed).
#[derive(Debug)]
pub(crate) enum Reruns {
    Found(Vec<Rerun>),
    KeyTaken,
}

/// Retries (`step` `None`) or restarts at `step` (checked against FSM version
/// `version`) instances `ids` in one statement, for `actor`.
pub(crate) async fn rerun(
    conn: On<&mut PgConnection>,
    ids: &[i64],
    step: Option<(&str, i32)>,
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<Reruns> {
    rerun_from(conn, ids, step, None, actor, now).await
}

/// [`rerun`], a restart taking the state of history entry `from` (its id and state).
pub(crate) async fn rerun_from(
    mut conn: On<&mut PgConnection>,
    ids: &[i64],
    step: Option<(&str, i32)>,
    from: Option<(i64, &serde_json::Value)>,
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<Reruns> {
    let found = sqlx::query_as::<_, Rerun>(RETRY)
        .bind(ids)
        .bind(now)
        .bind(step.map(|(s, _)| s))
        .bind(step.map(|(_, v)| v))
        .bind(actor)
        .bind(from.map(|(_, state)| sqlx::types::Json(state)))
        .bind(from.map(|(entry, _)| entry))
        .fetch_all(conn.again())
        .await;
    match found {
        Ok(rows) => Ok(Reruns::Found(rows)),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(UNIQUE_VIOLATION) => {
            Ok(Reruns::KeyTaken)
        }
        Err(e) => Err(e.into()),
    }
}

/// Retries instance `id`, for `actor`.
pub(crate) async fn retry(
    conn: On<&mut PgConnection>,
    id: i64,
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<RetryFound> {
    Ok(match rerun(conn, &[id], None, actor, now).await? {
        Reruns::KeyTaken => RetryFound::KeyTaken,
        Reruns::Found(rows) => match rows.first() {
            None => RetryFound::NotFound,
            Some(r) => RetryFound::of(r.status, r.go, r.parent_id.zip(r.parent_status)),
        },
    })
}

/// Restarts instance `id` at `step`, checked by the caller against FSM version
/// `version`, for `actor`; with `from`, in the state of that history entry.
pub(crate) async fn restart(
    conn: On<&mut PgConnection>,
    id: i64,
    step: &str,
    version: i32,
    from: Option<(i64, &serde_json::Value)>,
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<RestartFound> {
    Ok(
        match rerun_from(conn, &[id], Some((step, version)), from, actor, now).await? {
            Reruns::KeyTaken => RestartFound::KeyTaken,
            Reruns::Found(rows) => match rows.first() {
                None => RestartFound::NotFound,
                Some(r) if r.fsm_version != version && !r.go => RestartFound::VersionChanged {
                    from: version,
                    to: r.fsm_version,
                },
                Some(r) => {
                    RestartFound::of(r.status, r.go, r.live, r.parent_id.zip(r.parent_status))
                }
            },
        },
    )
}

/// What a restart checks its step against: the instance's FSM and version, and the step
/// names the most recently seen live node running that version announces (`gd_nodes.steps`,
/// migration 0010), if any does.
const STEPS_OF: &str = r#"/* gd:retry */
SELECT i.fsm, i.fsm_version,
       (SELECT n.steps -> (i.fsm || '@' || i.fsm_version) FROM gd_nodes n
         WHERE n.last_seen_at > coalesce($2, now()) - $3 * interval '1 millisecond'
           AND n.steps ? (i.fsm || '@' || i.fsm_version)
         ORDER BY n.last_seen_at DESC
         LIMIT 1) AS steps
  FROM gd_instances i
 WHERE i.id = $1
"#;

/// STEPS_OF's row: the FSM, its version, and the announced steps.
type StepsOfRow = (String, i32, Option<sqlx::types::Json<Vec<String>>>);

/// Instance `id`'s FSM, version and the steps a live node announces for them; `None` if
/// there is no such instance.
pub(crate) async fn steps_of<'e>(
    db: impl sqlx::PgExecutor<'e>,
    id: i64,
    now: Option<DateTime<Utc>>,
) -> Result<Option<(String, i32, Option<Vec<String>>)>> {
    let row: Option<StepsOfRow> = sqlx::query_as(STEPS_OF)
        .bind(id)
        .bind(now)
        .bind(super::admin::NODE_LIVE_WINDOW_MS)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(f, v, s)| (f, v, s.map(|j| j.0))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pooler::Pooler;
    use gen_durable_testkit::TestDb;

    /// A restart checked against one version does not move a row an instance migration
    /// moved to another meanwhile: that step may not exist there.
    #[tokio::test]
    async fn a_restart_checked_against_an_older_version_changes_nothing() {
        let db = TestDb::new().await;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status)
             VALUES ('F', 2, 'b', '{}', 'q', 'done') RETURNING id",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        let mut conn = db.pool().acquire().await.unwrap();
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let found = restart(Pooler::None.on(&mut *tx), id, "a", 1, None, None, None)
            .await
            .unwrap();
        assert_eq!(found, RestartFound::VersionChanged { from: 1, to: 2 });
        let (status, step): (String, String) =
            sqlx::query_as("SELECT status::text, step FROM gd_instances WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        assert_eq!((status.as_str(), step.as_str()), ("done", "b"));
        let found = restart(Pooler::None.on(&mut *tx), id, "a", 2, None, None, None)
            .await
            .unwrap();
        assert_eq!(found, RestartFound::Restarted);
        tx.rollback().await.unwrap();
        drop(conn);
        db.close().await;
    }

    /// A cancel and a retry of one instance read its rows by primary key, not the table:
    /// their statements found "the rows and their parents" with `id = ANY (ids) OR id IN
    /// (parents)`, an `OR` with a subquery, which PostgreSQL can only run as a scan of every
    /// row (550 ms for a retry and 140 ms for a cancel at 1,000,000 rows).
    #[tokio::test]
    async fn a_cancel_and_a_retry_read_their_rows_by_primary_key() {
        let db = TestDb::new().await;
        let mut conn = db.pool().acquire().await.unwrap();
        // 20,000 rows behind a parent awaiting its children, of which one failed child
        // and one runnable child.
        sqlx::raw_sql(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 20000);
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status,
                                       children_pending)
             VALUES ('F', 1, 's', '{}', 'q', 'awaiting_children', 1);
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, parent_id)
             VALUES ('F', 1, 's', '{}', 'q', 'failed', 20001),
                    ('F', 1, 's', '{}', 'q', 'runnable', 20001);
             ANALYZE gd_instances;",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        let scans = "SELECT seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables
                      WHERE relname = 'gd_instances'";
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let before: (i64, i64, i64) = sqlx::query_as(scans).fetch_one(&mut *tx).await.unwrap();
        let retried = retry(Pooler::None.on(&mut *tx), 20002, None, None)
            .await
            .unwrap();
        assert_eq!(retried, RetryFound::Retried);
        let cancelled = cancel(Pooler::None.on(&mut *tx), 20003, None, None)
            .await
            .unwrap();
        assert!(
            matches!(cancelled, CancelFound::Cancelled { .. }),
            "{cancelled:?}"
        );
        let after: (i64, i64, i64) = sqlx::query_as(scans).fetch_one(&mut *tx).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (0, 0),
            "sequential scans and rows they read"
        );
        assert!(
            after.2 - before.2 <= 40,
            "{} rows fetched through indexes",
            after.2 - before.2
        );
        drop(conn);
        db.close().await;
    }
}
