//! What `Client::explain` reads: one instance and the evidence of every reason it could be
//! where it is, in one statement (one snapshot: a row and its evidence read apart could
//! disagree). `crate::model::explain` decides the reason from it.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::PgExecutor;

use crate::model::error::Result;
use crate::model::explain::{
    ChildState, ExplainFacts, Holder, NodeFacts, EXPLAIN_COUNT_LIMIT, EXPLAIN_HISTORY_LIMIT,
    EXPLAIN_LIST_LIMIT,
};
use crate::store::pg::admin::NODE_LIVE_WINDOW_MS;
use crate::Status;

/// One instance `$1` at time `$2` with its evidence. Each piece of evidence is a scalar
/// subquery under a `CASE` on the row's status, so only the ones its status can need run,
/// and each reads an index and stops at a bound:
///
/// - executing: its node's row in `gd_nodes` (primary key); a plain row claimed from the
///   log is executing while its entry lies in a live batch (its lane by `gd_lanes_key`,
///   the lane's batches by primary key), whose node and expiry are its lease;
/// - awaiting a signal: the inbox's other signals, counted up to `$4` and their first
///   `$5` distinct names (`gd_signals_target_name`);
/// - awaiting children: the children counted up to `$4` and the first `$5` unfinished
///   ones by id (`gd_instances_parent`; sorted by `c.id + 0`, an order no index has, as
///   otherwise the planner may walk the primary key in id order hoping to meet ten
///   children early — the whole table, for a parent whose children are recent);
/// - runnable: the queue's pause (primary key of `gd_queue_pauses`), the executing row of
///   its partition key (the partial unique index `gd_instances_partition_executing`), the
///   live nodes (a small table; the liveness window and the `name@version` tags of
///   `admin::UNRUNNABLE`), and the rows ahead of it: for a plain row the entries not yet
///   claimed of its queue's more urgent lanes, and of its own priority's lanes those
///   before its own (`gd_ready_lane_seq`); for a row with a
///   key, a gate or a limit the due rows ahead of it in the pick's order, counted up
///   to `$4` on the pick index `(queue, priority, eligible_at, id) WHERE status =
///   'runnable'` by a row comparison, which the index reads as a range; ordered as the
///   index is, so that on a long backlog the scan walks it and stops at the bound (1M
///   rows: an index-only scan of 10,000 entries, 3 ms in all). Without the order the
///   planner takes a bitmap scan, which reads every entry ahead before the limit
///   applies; with it, it still may when the rows ahead are few enough to be cheap.
const EXPLAIN: &str = r#"/* gd:explain */
WITH t AS (SELECT coalesce($2, now()) AS now),
live AS MATERIALIZED (
    SELECT n.node_id, n.queues, n.fsms FROM gd_nodes n, t
     WHERE n.last_seen_at > t.now - $3 * interval '1 millisecond'
)
SELECT i.id, i.fsm, i.fsm_version, i.queue,
       CASE WHEN lb.node IS NOT NULL THEN 'executing' ELSE i.status::text END AS status,
       i.step, i.attempt,
       i.eligible_at, i.result, i.last_error, i.awaits, i.await_deadline,
       coalesce(i.locked_by, lb.node) AS locked_by,
       coalesce(i.lease_expires_at, lb.expires_at) AS lease_expires_at,
       i.updated_at, i.cancel_requested, i.children_pending,
       i.partition_key, t.now,
       CASE WHEN i.status = 'executing' OR lb.node IS NOT NULL THEN
           (SELECT n.last_seen_at FROM gd_nodes n WHERE n.node_id = coalesce(i.locked_by, lb.node)) END
           AS node_seen_at,
       CASE WHEN i.status = 'awaiting_signal' THEN
           (SELECT count(*) FROM (SELECT 1 FROM gd_signals s
                                   WHERE s.target_id = i.id AND s.name <> ALL (i.awaits)
                                   LIMIT $4) x) END AS unrelated,
       CASE WHEN i.status = 'awaiting_signal' THEN
           (SELECT array_agg(name ORDER BY name) FROM (
                SELECT DISTINCT s.name FROM gd_signals s
                 WHERE s.target_id = i.id AND s.name <> ALL (i.awaits)
                 ORDER BY s.name LIMIT $5) x) END AS unrelated_names,
       CASE WHEN i.status = 'awaiting_children' THEN
           (SELECT count(*) FROM (SELECT 1 FROM gd_instances c
                                   WHERE c.parent_id = i.id LIMIT $4) x) END AS children_total,
       CASE WHEN i.status = 'awaiting_children' THEN
           (SELECT jsonb_agg(jsonb_build_object('id', c.id, 'fsm', c.fsm, 'step', c.step,
                                                'status', c.shown) ORDER BY c.id)
              FROM (SELECT c.id, c.fsm, c.step, gd_status_of(c) AS shown FROM gd_instances c
                     WHERE c.parent_id = i.id AND c.status NOT IN ('done', 'failed')
                     ORDER BY c.id + 0 LIMIT $5) c) END AS waiting_on,
       p.paused_at, p.reason AS pause_reason,
       CASE WHEN i.status = 'runnable' AND i.partition_key IS NOT NULL THEN
           (SELECT jsonb_build_object('id', e.id, 'step', e.step, 'node', e.locked_by,
                                      'lease_until', e.lease_expires_at)
              FROM gd_instances e
             WHERE e.partition_key = i.partition_key AND e.status = 'executing'
               AND e.gate IS NULL AND i.gate IS NULL AND e.id <> i.id) END AS holder,
       i.gate,
       CASE WHEN i.status = 'runnable' AND i.gate IS NOT NULL THEN
           (SELECT g.size FROM gd_gates g WHERE g.name = i.gate) END AS gate_limit,
       CASE WHEN i.status = 'runnable' AND i.gate IS NOT NULL THEN
           (SELECT count(*) FROM gd_instances e
             WHERE e.status = 'executing' AND e.gate = i.gate
               AND e.partition_key = i.partition_key) END AS gate_running,
       CASE WHEN i.rate_paid THEN i.rate_limit END AS rate_limit,
       CASE WHEN i.rate_paid THEN i.rate_key END AS rate_key,
       (SELECT coalesce(array_agg(node_id ORDER BY node_id), '{}') FROM live) AS live_nodes,
       (SELECT coalesce(array_agg(node_id ORDER BY node_id), '{}') FROM live
         WHERE i.queue = ANY (queues)) AS nodes_on_queue,
       (SELECT coalesce(array_agg(node_id ORDER BY node_id), '{}') FROM live
         WHERE i.queue = ANY (queues)
           AND i.fsm || '@' || i.fsm_version = ANY (fsms)) AS nodes_running,
       (SELECT coalesce(array_agg(DISTINCT substr(f, length(i.fsm) + 2)), '{}')
          FROM live, unnest(fsms) f
         WHERE i.queue = ANY (queues) AND left(f, length(i.fsm) + 1) = i.fsm || '@')
           AS versions_on_queue,
       CASE WHEN i.status = 'runnable' AND lb.node IS NULL AND i.ready_seq IS NOT NULL THEN
           (SELECT count(*) FROM (
                SELECT 1 FROM gd_lanes l JOIN gd_ready r ON r.lane = l.lane AND r.seq >= l.next_seq
                 WHERE l.queue = i.queue
                   AND (l.priority < i.priority OR (l.priority = i.priority AND r.seq < i.ready_seq))
                 LIMIT $4) x)
            WHEN i.status = 'runnable' AND i.eligible_at <= t.now
                 AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL) THEN
           (SELECT count(*) FROM (
                SELECT 1 FROM gd_instances a
                 WHERE a.queue = i.queue AND a.status = 'runnable'
                   AND (a.partition_key IS NOT NULL OR a.gate IS NOT NULL OR a.rate_limit IS NOT NULL)
                   AND (a.priority, a.eligible_at, a.id) < (i.priority, i.eligible_at, i.id)
                   AND a.eligible_at <= t.now
                 ORDER BY a.priority, a.eligible_at, a.id
                 LIMIT $4) x) END AS rows_ahead,
       -- Its newest history entries, newest first (`gd_history_instance`, backwards).
       ARRAY(SELECT jsonb_build_array(h.kind, h.step, h.error) FROM gd_history h
              WHERE h.instance_id = i.id ORDER BY h.entry DESC LIMIT $6) AS recent
  FROM gd_instances i
 CROSS JOIN t
  LEFT JOIN gd_queue_pauses p ON p.queue = i.queue
  LEFT JOIN LATERAL (
      SELECT b.node, b.expires_at FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
       WHERE i.status = 'runnable' AND l.queue = i.queue AND l.fsm = i.fsm
         AND l.priority = i.priority AND b.lo <= i.ready_seq AND b.hi > i.ready_seq
       LIMIT 1) lb ON true
 WHERE i.id = $1
"#;

/// One row of `EXPLAIN`.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: i64,
    fsm: String,
    fsm_version: i32,
    queue: String,
    status: Status,
    step: String,
    attempt: i32,
    eligible_at: DateTime<Utc>,
    result: Option<serde_json::Value>,
    last_error: Option<String>,
    awaits: Vec<String>,
    await_deadline: Option<DateTime<Utc>>,
    locked_by: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    cancel_requested: bool,
    children_pending: i32,
    partition_key: Option<String>,
    now: DateTime<Utc>,
    node_seen_at: Option<DateTime<Utc>>,
    unrelated: Option<i64>,
    unrelated_names: Option<Vec<String>>,
    children_total: Option<i64>,
    waiting_on: Option<Json<Vec<ChildState>>>,
    paused_at: Option<DateTime<Utc>>,
    pause_reason: Option<String>,
    holder: Option<Json<Holder>>,
    gate: Option<String>,
    gate_limit: Option<i32>,
    gate_running: Option<i64>,
    rate_limit: Option<String>,
    rate_key: Option<String>,
    live_nodes: Vec<String>,
    nodes_on_queue: Vec<String>,
    nodes_running: Vec<String>,
    versions_on_queue: Vec<String>,
    rows_ahead: Option<i64>,
    recent: Vec<Json<(String, String, Option<String>)>>,
}

/// The facts of instance `id` at `now` (`None`: the database's clock); `None` if there
/// is no such instance.
pub(crate) async fn facts<'e>(
    db: impl PgExecutor<'e>,
    id: i64,
    now: Option<DateTime<Utc>>,
) -> Result<Option<ExplainFacts>> {
    let row: Option<Row> = sqlx::query_as(EXPLAIN)
        .bind(id)
        .bind(now)
        .bind(NODE_LIVE_WINDOW_MS)
        .bind(EXPLAIN_COUNT_LIMIT)
        .bind(EXPLAIN_LIST_LIMIT)
        .bind(EXPLAIN_HISTORY_LIMIT)
        .fetch_optional(db)
        .await?;
    Ok(row.map(Row::into_facts))
}

impl Row {
    fn into_facts(self) -> ExplainFacts {
        let node_live = self
            .locked_by
            .as_ref()
            .is_some_and(|n| self.live_nodes.contains(n));
        let mut versions: Vec<i32> = self
            .versions_on_queue
            .iter()
            .filter_map(|v| v.parse().ok())
            .collect();
        versions.sort_unstable();
        versions.dedup();
        ExplainFacts {
            id: self.id,
            fsm: self.fsm,
            version: self.fsm_version,
            queue: self.queue,
            status: self.status,
            step: self.step,
            attempt: self.attempt,
            now: self.now,
            eligible_at: self.eligible_at,
            result: self.result,
            last_error: self.last_error,
            awaits: self.awaits,
            await_deadline: self.await_deadline,
            locked_by: self.locked_by,
            lease_expires_at: self.lease_expires_at,
            since: self.updated_at,
            cancel_requested: self.cancel_requested,
            node_live,
            node_seen_at: self.node_seen_at,
            unrelated: self.unrelated.unwrap_or(0),
            unrelated_names: self.unrelated_names.unwrap_or_default(),
            children_pending: self.children_pending,
            children_total: self.children_total.unwrap_or(0),
            waiting_on: self.waiting_on.map(|j| j.0).unwrap_or_default(),
            paused: self.paused_at.map(|at| (at, self.pause_reason)),
            partition_key: self.partition_key,
            holder: self.holder.map(|j| j.0),
            gate: match (self.gate, self.gate_limit, self.gate_running) {
                (Some(g), Some(limit), Some(running)) => Some((g, i64::from(limit), running)),
                _ => None,
            },
            rate_wait: self.rate_limit.zip(self.rate_key),
            nodes: Some(NodeFacts {
                live: self.live_nodes,
                on_queue: self.nodes_on_queue,
                running: self.nodes_running,
                versions_on_queue: versions,
            }),
            rows_ahead: self.rows_ahead.unwrap_or(0),
            // A kind this build does not know (a later node's) ends the reading.
            recent: self
                .recent
                .into_iter()
                .map_while(|Json((kind, step, error))| Some((kind.parse().ok()?, step, error)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gen_durable_testkit::TestDb;

    /// The plan of `EXPLAIN` for instance `id`, run (`EXPLAIN ANALYZE`) on `conn`.
    async fn plan(conn: &mut sqlx::PgConnection, id: i64) -> String {
        let sql = format!(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) {}",
            EXPLAIN
                .replace("$1", &id.to_string())
                .replace("$2", "NULL::timestamptz")
                .replace("$3", &NODE_LIVE_WINDOW_MS.to_string())
                .replace("$4", &EXPLAIN_COUNT_LIMIT.to_string())
                .replace("$5", &EXPLAIN_LIST_LIMIT.to_string())
                .replace("$6", &EXPLAIN_HISTORY_LIMIT.to_string())
        );
        let lines: Vec<String> = sqlx::query_scalar(&sql).fetch_all(conn).await.unwrap();
        lines.join("\n")
    }

    /// On 100k+ rows, each kind of instance is explained through indexes only: no
    /// sequential scan of `gd_instances` or `gd_signals`, the rows ahead read from the
    /// pick index and stopped at the bound, children from the parent index, the
    /// partition's holder from its unique index. Run with `--nocapture` to see the plans.
    #[tokio::test]
    async fn every_reason_is_read_through_indexes_on_100k_rows() {
        let db = TestDb::new().await;
        let mut conn = db.pool().acquire().await.unwrap();
        let exec = |sql: &'static str| sqlx::query(sql);
        // 100,000 runnable rows of one queue, due, over 3 priorities; 20,000 done.
        exec(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, eligible_at)
             SELECT 'F', 1, 's', '{}', 'q', (g % 3)::int2, now() - interval '1 h' + g * interval '1 ms'
               FROM generate_series(1, 100000) g",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        exec(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, result)
             SELECT 'F', 1, 's', '{}', 'q', 'done', '1' FROM generate_series(1, 20000)",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        // A parked row with 2,000 signals, a parent of 2,000 children, an executing row
        // holding partition "p" and a runnable row of that partition.
        let ids: Vec<i64> = sqlx::query_scalar(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, awaits,
                                       partition_key, locked_by, lease_expires_at, children_pending)
             VALUES ('F', 1, 's', '{}', 'q', 'awaiting_signal', '{go}', NULL, NULL, NULL, 0),
                    ('F', 1, 's', '{}', 'q', 'awaiting_children', '{}', NULL, NULL, NULL, 2000),
                    ('F', 1, 's', '{}', 'q', 'executing', '{}', 'p', 'n1', now() + interval '30 s', 0),
                    ('F', 1, 's', '{}', 'q', 'runnable', '{}', 'p', NULL, NULL, 0)
             RETURNING id",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let (parked, parent, holder, blocked) = (ids[0], ids[1], ids[2], ids[3]);
        // Signals as a busy inbox table has them: 50,000 over as many instances, then
        // the parked row's 2,000.
        exec(
            "INSERT INTO gd_signals (target_id, name, payload)
             SELECT g, 'note', '{}' FROM generate_series(1, 50000) g",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO gd_signals (target_id, name, payload)
             SELECT $1, 'other' || (g % 7), '{}' FROM generate_series(1, 2000) g",
        )
        .bind(parked)
        .execute(&mut *conn)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, parent_id)
             SELECT 'C', 1, 's', '{}', 'kids', 'awaiting_signal', $1 FROM generate_series(1, 2000)",
        )
        .bind(parent)
        .execute(&mut *conn)
        .await
        .unwrap();
        exec("INSERT INTO gd_nodes (node_id, queues, fsms) VALUES ('n1', '{q}', '{F@1}')")
            .execute(&mut *conn)
            .await
            .unwrap();
        exec("ANALYZE").execute(&mut *conn).await.unwrap();
        let last_runnable: i64 = sqlx::query_scalar(
            "SELECT max(id) FROM gd_instances WHERE status = 'runnable' AND partition_key IS NULL",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();

        for (what, id, index) in [
            (
                "runnable at the back of 100k rows",
                last_runnable,
                "gd_instances_pick",
            ),
            (
                "awaiting a signal, 2,000 in the inbox",
                parked,
                "gd_signals_target_name",
            ),
            ("awaiting 2,000 children", parent, "gd_instances_parent"),
            ("executing", holder, "gd_instances_pkey"),
            (
                "blocked by its partition",
                blocked,
                "gd_instances_partition_executing",
            ),
        ] {
            let p = plan(&mut conn, id).await;
            println!("--- {what} (instance {id}):\n{p}\n");
            assert!(!p.contains("Seq Scan on gd_instances"), "{what}:\n{p}");
            assert!(!p.contains("Seq Scan on gd_signals"), "{what}:\n{p}");
            assert!(p.contains(index), "{what}: {index} not used:\n{p}");
        }

        let f = facts(&mut *conn, last_runnable, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(f.rows_ahead, EXPLAIN_COUNT_LIMIT, "counted up to the bound");
        let e = f.explain();
        assert!(e.to_string().contains("≥10,000 rows ahead"), "{e}");
        let f = facts(&mut *conn, parked, None).await.unwrap().unwrap();
        assert_eq!((f.unrelated, f.unrelated_names.len()), (2000, 7));
        let f = facts(&mut *conn, parent, None).await.unwrap().unwrap();
        assert_eq!((f.children_total, f.waiting_on.len()), (2000, 10));
        let f = facts(&mut *conn, blocked, None).await.unwrap().unwrap();
        assert_eq!(f.holder.map(|h| h.id), Some(holder));
        drop(conn);
        db.close().await;
    }
}
