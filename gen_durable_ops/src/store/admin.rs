//! What operators run: the statements behind the `gen_durable` CLI (status, inspect,
//! migration state), which the dashboard's overview and instance page reuse. The node
//! announcements they read, the database's clock and `gc`'s delete are the library's
//! (`gen_durable::backend::admin`, re-exported here).
//!
//! None of these is on the hot path. They read with plain snapshots, so running them
//! against a busy database holds back no worker.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgExecutor;

pub(crate) use gen_durable::backend::admin::{db_now, gc_batch, GC_BATCH, NODE_LIVE_WINDOW_MS};
use gen_durable::{Result, Status};

/// The most signals and children `inspect` lists (it always counts them all).
pub(crate) const INSPECT_LIST_LIMIT: i64 = 100;

/// The most ids listed per (queue, node) among expired leases.
const EXPIRED_IDS_SHOWN: i32 = 10;

/// Whether sqlx's table of applied migrations exists (the first migration run creates it).
const MIGRATIONS_TABLE: &str = r#"/* gd:admin */
SELECT to_regclass('_sqlx_migrations') IS NOT NULL
"#;

pub(crate) async fn has_migrations_table<'e>(db: impl PgExecutor<'e>) -> Result<bool> {
    Ok(sqlx::query_scalar(MIGRATIONS_TABLE).fetch_one(db).await?)
}

/// The migrations recorded as applied, so `migrate` can say what it did. Only call it
/// when [`has_migrations_table`].
const APPLIED_MIGRATIONS: &str = r#"/* gd:admin */
SELECT version, description FROM _sqlx_migrations WHERE success ORDER BY version
"#;

pub(crate) async fn applied_migrations<'e>(db: impl PgExecutor<'e>) -> Result<Vec<(i64, String)>> {
    Ok(sqlx::query_as(APPLIED_MIGRATIONS).fetch_all(db).await?)
}

/// Counts per queue and status, with the rows ready to run now and the oldest of them,
/// in one statement: one scan of the table serves every figure of the queue table, and
/// they all come from one snapshot. The status is the one readers see (`gd_status_of`: a
/// plain row whose step runs from the log is `executing`). It is a full scan (no index covers every status);
/// that is the price of exact counts, paid only when an operator asks.
///
/// `ready` and `oldest_ready` only count runnable rows whose `eligible_at` has passed: a
/// row scheduled for tomorrow is not late, so it must not show as lag.
pub(crate) const QUEUE_STATUS: &str = r#"/* gd:admin */
SELECT queue, status::text AS status, count(*) AS count,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at <= coalesce($1, now())) AS ready,
       min(eligible_at) FILTER (WHERE status = 'runnable' AND eligible_at <= coalesce($1, now()))
           AS oldest_ready,
       count(*) FILTER (WHERE unique_guard IS NOT NULL) AS keyed
  FROM (SELECT i.queue, gd_status_of(i) AS status, i.eligible_at, i.unique_guard
          FROM gd_instances i) i
 GROUP BY queue, i.status
 ORDER BY queue, i.status
"#;

/// One (queue, status) cell of the status table.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct QueueStatusRow {
    pub(crate) queue: String,
    pub(crate) status: Status,
    pub(crate) count: i64,
    pub(crate) ready: i64,
    pub(crate) oldest_ready: Option<DateTime<Utc>>,
    /// Rows holding their correlation key.
    pub(crate) keyed: i64,
}

pub(crate) async fn queue_status<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<QueueStatusRow>> {
    Ok(sqlx::query_as(QUEUE_STATUS).bind(now).fetch_all(db).await?)
}

/// Live rows that no live node can run, by (queue, fsm, version): a node runs a row only
/// if it picks from the row's queue *and* has registered its `(fsm, fsm_version)`
///, so both must match one node. Executing rows are left out: a node holds
/// them (the expired-lease report covers the ones whose node died). Parked rows are
/// counted: nobody will run them when they wake. `live` is a CTE over a small table,
/// and the per-row probe compares against arrays of a handful of nodes.
const UNRUNNABLE: &str = r#"/* gd:admin */
WITH live AS (
    SELECT queues, fsms FROM gd_nodes
     WHERE last_seen_at > coalesce($1, now()) - $2 * interval '1 millisecond'
)
SELECT i.queue, i.fsm, i.fsm_version, count(*) AS rows,
       count(*) FILTER (WHERE i.status = 'runnable') AS runnable
  FROM gd_instances i
 WHERE i.status IN ('runnable', 'awaiting_signal', 'awaiting_children')
   AND NOT EXISTS (SELECT 1 FROM live n
                    WHERE i.queue = ANY (n.queues)
                      AND i.fsm || '@' || i.fsm_version = ANY (n.fsms))
 GROUP BY i.queue, i.fsm, i.fsm_version
 ORDER BY i.queue, i.fsm, i.fsm_version
"#;

/// Rows of one (queue, fsm, version) that no live node runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub(crate) struct UnrunnableRow {
    pub(crate) queue: String,
    pub(crate) fsm: String,
    pub(crate) fsm_version: i32,
    /// Live rows (runnable or parked).
    pub(crate) rows: i64,
    /// Of which runnable.
    pub(crate) runnable: i64,
}

pub(crate) async fn unrunnable<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<UnrunnableRow>> {
    Ok(sqlx::query_as(UNRUNNABLE)
        .bind(now)
        .bind(NODE_LIVE_WINDOW_MS)
        .fetch_all(db)
        .await?)
}

/// Executing rows whose lease has expired, by queue and holder: the reaper returns them
/// to `runnable` on its next pass, so rows that stay here mean no node runs a reaper,
/// and a holder that keeps appearing is a node that died. Reads the lease index
/// (`lease_expires_at WHERE status = 'executing'`) and the log's batches by expiry
/// (`gd_batches_expires`), so it costs the expired rows only.
pub(crate) const EXPIRED_LEASES: &str = r#"/* gd:admin */
SELECT queue, locked_by, count(*) AS count, min(expiry) AS oldest_expiry,
       (array_agg(id ORDER BY expiry, id))[1:$2] AS ids
  FROM (SELECT queue, locked_by, lease_expires_at AS expiry, id
          FROM gd_instances
         WHERE status = 'executing' AND lease_expires_at < coalesce($1, now())
        UNION ALL
        SELECT i.queue, b.node, b.expires_at, i.id
          FROM gd_batches b
          JOIN gd_ready r ON r.lane = b.lane AND r.seq >= b.lo AND r.seq < b.hi
          JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq AND i.status = 'runnable'
         WHERE b.expires_at < coalesce($1, now())) x
 GROUP BY queue, locked_by
 ORDER BY queue, locked_by
"#;

/// Expired leases of one queue held by one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub(crate) struct ExpiredLeaseRow {
    pub(crate) queue: String,
    pub(crate) locked_by: Option<String>,
    pub(crate) count: i64,
    pub(crate) oldest_expiry: Option<DateTime<Utc>>,
    /// The first few ids, oldest expiry first.
    pub(crate) ids: Vec<i64>,
}

pub(crate) async fn expired_leases<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<ExpiredLeaseRow>> {
    Ok(sqlx::query_as(EXPIRED_LEASES)
        .bind(now)
        .bind(EXPIRED_IDS_SHOWN)
        .fetch_all(db)
        .await?)
}

/// The queues any announced node picks, live or not: a queue named nowhere here is likely
/// a misspelt one.
const ANNOUNCED_QUEUES: &str = r#"/* gd:admin */
SELECT DISTINCT q FROM gd_nodes, unnest(queues) AS q ORDER BY q
"#;

pub(crate) async fn announced_queues<'e>(db: impl PgExecutor<'e>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(ANNOUNCED_QUEUES).fetch_all(db).await?)
}

/// Every announced node, live or not, with the database's verdict on liveness so the
/// CLI and the `UNRUNNABLE` statement use the same window and the same clock.
pub(crate) const NODES: &str = r#"/* gd:admin */
SELECT node_id, queues, fsms, started_at, last_seen_at,
       last_seen_at > coalesce($1, now()) - $2 * interval '1 millisecond' AS live
  FROM gd_nodes
 ORDER BY node_id
"#;

/// One announced node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub(crate) struct NodeRow {
    pub(crate) node_id: String,
    pub(crate) queues: Vec<String>,
    /// `name@version` each.
    pub(crate) fsms: Vec<String>,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) last_seen_at: DateTime<Utc>,
    pub(crate) live: bool,
}

pub(crate) async fn nodes<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<NodeRow>> {
    Ok(sqlx::query_as(NODES)
        .bind(now)
        .bind(NODE_LIVE_WINDOW_MS)
        .fetch_all(db)
        .await?)
}

/// Every declared schedule (see [`gen_durable::Schedule`]).
pub(crate) const SCHEDULES: &str = r#"/* gd:admin */
SELECT name, pattern, timezone, catch_up, next_fire, last_fire, last_id, skipped, last_error
  FROM gd_schedules
 ORDER BY name
"#;

/// One declared schedule, as its last fire left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub(crate) struct ScheduleRow {
    pub(crate) name: String,
    pub(crate) pattern: String,
    pub(crate) timezone: String,
    pub(crate) catch_up: String,
    pub(crate) next_fire: Option<DateTime<Utc>>,
    pub(crate) last_fire: Option<DateTime<Utc>>,
    pub(crate) last_id: Option<i64>,
    pub(crate) skipped: i64,
    pub(crate) last_error: Option<String>,
}

pub(crate) async fn schedules<'e>(db: impl PgExecutor<'e>) -> Result<Vec<ScheduleRow>> {
    Ok(sqlx::query_as(SCHEDULES).fetch_all(db).await?)
}

/// One instance with its inbox and children, in one statement and so one snapshot (an
/// inbox read after the row could show a signal the row's status already consumed).
/// Statuses are the ones readers see (`gd_status_of`: a plain row whose step runs from the
/// ready log is `executing`, though its column says `runnable`), and such a row's
/// `locked_by` is its batch's node (`gd_holder`).
/// The row comes back as JSON (`to_jsonb`), every column included, so `inspect --json`
/// shows exactly what is stored; `unique_guard` is dropped, being derived. Inbox and
/// children are counted in full but listed only up to `$2`, by id: a parent of 10,000
/// children must not print them all. Children come from the `parent_id` index.
pub(crate) const INSPECT: &str = r#"/* gd:admin */
SELECT to_jsonb(i) - 'unique_guard'
           || jsonb_build_object('status', gd_status_of(i), 'locked_by', gd_holder(i)) AS row,
       (SELECT count(*) FROM gd_signals s WHERE s.target_id = i.id) AS inbox_total,
       (SELECT coalesce(jsonb_agg(to_jsonb(s) - 'target_id' ORDER BY s.id), '[]')
          FROM (SELECT * FROM gd_signals WHERE target_id = i.id ORDER BY id LIMIT $2) s) AS inbox,
       (SELECT coalesce(jsonb_object_agg(c.status, c.n), '{}')
          FROM (SELECT gd_status_of(c) AS status, count(*) AS n FROM gd_instances c
                 WHERE c.parent_id = i.id GROUP BY 1) c) AS children_by_status,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'id', c.id, 'fsm', c.fsm, 'fsm_version', c.fsm_version, 'step', c.step,
                   'status', c.shown, 'result', c.result, 'last_error', c.last_error,
                   'updated_at', c.updated_at) ORDER BY c.id), '[]')
          FROM (SELECT c.*, gd_status_of(c) AS shown FROM gd_instances c
                 WHERE c.parent_id = i.id ORDER BY c.id LIMIT $2) c) AS children
  FROM gd_instances i
 WHERE i.id = $1
"#;

/// What `inspect` shows of one instance.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub(crate) struct Inspection {
    /// Every stored column, by name.
    pub(crate) row: Value,
    pub(crate) inbox_total: i64,
    /// Signals, oldest first, up to the limit.
    pub(crate) inbox: Value,
    /// `{status: count}` over every child.
    pub(crate) children_by_status: Value,
    /// Children by id, up to the limit.
    pub(crate) children: Value,
}

pub(crate) async fn inspect<'e>(
    db: impl PgExecutor<'e>,
    id: i64,
    list_limit: i64,
) -> Result<Option<Inspection>> {
    Ok(sqlx::query_as(INSPECT)
        .bind(id)
        .bind(list_limit)
        .fetch_optional(db)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use gen_durable::backend::admin::{announce, forget};
    use gen_durable_testkit::TestDb;

    #[tokio::test]
    async fn announce_forget_and_what_no_live_node_runs() {
        let db = TestDb::new().await;
        let p = db.pool();
        let t0 = db_now(p, None).await.unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             VALUES ('Checkout', 2, 'reserve', '{}', 'checkout'),
                    ('Checkout', 1, 'reserve', '{}', 'checkout'),
                    ('Checkout', 2, 'reserve', '{}', 'other')",
        )
        .execute(p)
        .await
        .unwrap();
        let unrun = |at| async move {
            unrunnable(p, Some(at))
                .await
                .unwrap()
                .into_iter()
                .map(|u| (u.queue, u.fsm_version, u.rows))
                .collect::<Vec<_>>()
        };
        assert_eq!(unrun(t0).await.len(), 3, "no node yet");

        let fsms = [("Checkout".to_string(), 2)];
        let steps = serde_json::json!({ "Checkout@2": ["reserve", "ship"] });
        announce(p, "n1", &["checkout".into()], &fsms, &steps, Some(t0))
            .await
            .unwrap();
        // Only the row of a queue n1 picks *and* a version it runs is covered.
        assert_eq!(
            unrun(t0).await,
            [("checkout".into(), 1, 1), ("other".into(), 2, 1)]
        );
        let n = nodes(p, Some(t0)).await.unwrap();
        assert_eq!((n[0].node_id.as_str(), n[0].live), ("n1", true));
        assert_eq!(n[0].fsms, ["Checkout@2"]);

        // Silent for longer than the window: no longer live.
        let later = t0 + Duration::milliseconds(NODE_LIVE_WINDOW_MS + 1);
        assert_eq!(unrun(later).await.len(), 3);
        assert!(!nodes(p, Some(later)).await.unwrap()[0].live);

        // A new announce keeps started_at and refreshes last_seen_at.
        announce(p, "n1", &["checkout".into()], &fsms, &steps, Some(later))
            .await
            .unwrap();
        let n = nodes(p, Some(later)).await.unwrap();
        assert_eq!(
            (n[0].started_at, n[0].last_seen_at, n[0].live),
            (t0, later, true)
        );

        // A node unseen for a day is deleted by anyone's announce.
        let next_day = later + Duration::days(1) + Duration::seconds(1);
        announce(p, "n2", &[], &[], &serde_json::json!({}), Some(next_day))
            .await
            .unwrap();
        let ids: Vec<String> = nodes(p, Some(next_day))
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.node_id)
            .collect();
        assert_eq!(ids, ["n2"]);

        forget(p, "n2").await.unwrap();
        assert!(nodes(p, None).await.unwrap().is_empty());
        db.close().await;
    }
}
