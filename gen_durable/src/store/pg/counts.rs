//! Rows per queue and status at a bounded cost, for the dashboard's overview and the queue
//! gauges of `gen_durable::metrics` (`crate::ops::counts` puts the figures together).
//!
//! Exact counts of every status need every row: no index covers them all, and adding one
//! (or a counter table) would tax every step the engine commits — each update of
//! `gd_instances` writes every index. So these statements read what the existing partial
//! indexes give cheaply, and stop:
//!
//! - runnable rows, rows due now and the oldest due row per queue, from the pick index
//!   (rows with a key, a gate or a limit) and the ready log (plain rows), counted up to a
//!   cap ([`LANES`]);
//! - executing rows per queue, from the lease index and the log's live batches, up to a
//!   cap ([`EXECUTING`]);
//! - every status per queue from a sample of about [`SAMPLE_PAGES`] pages of the table
//!   ([`SAMPLE_BY_QUEUE`]): exact when the table is that small (a 100% sample reads every
//!   page), an estimate scaled from the sample otherwise;
//! - runnable rows that wait for something other than a worker, by the reason `explain`
//!   would give ([`WAITING`]), per lane up to a cap.
//!
//! None of them locks or writes anything.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;

/// How many pages of `gd_instances` a sample reads (8 kB each): about 4,000 rows of a
/// typical table, a few milliseconds. A table of at most this many pages is read whole,
/// so its counts are exact.
pub(crate) const SAMPLE_PAGES: i64 = 128;

/// The `(queue, priority)` lanes of runnable rows, and for each:
///
/// - `runnable`: its rows, counted up to `$1`;
/// - `ready`: its rows due at `$2`, up to `$1`;
/// - `oldest`: the smallest `eligible_at` of its rows (the oldest due row if it is not
///   in the future).
///
/// Three parts, each bounded whatever the backlog:
/// - rows claimed by themselves (a K = 1 key, a gate, a rate limit): the distinct lanes by
///   a loose index scan of the pick index (a recursive CTE that jumps from one lane to the
///   next, one index probe each), then per lane an index-only range scan stopped by the
///   `LIMIT` (within a lane the index is ordered by `eligible_at`, so the due rows are a
///   prefix of the range) and its first entry;
/// - plain rows on the log: per lane of `gd_lanes`, the entries not yet claimed whose row
///   still waits at them (`gd_ready_lane_seq`, then the row by primary key), up to `$1`,
///   and the first one's row;
/// - plain rows due later (`gd_due`), up to `$1` in all.
///
/// Its cost is the number of lanes times `$1` index entries at most.
pub const LANES: &str = r#"/* gd:admin */
WITH RECURSIVE lanes AS (
    (SELECT queue, priority FROM gd_instances
      WHERE status = 'runnable'
        AND (partition_key IS NOT NULL OR gate IS NOT NULL OR rate_limit IS NOT NULL)
      ORDER BY queue, priority
      LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority
      FROM lanes l,
           LATERAL (SELECT i.queue, i.priority FROM gd_instances i
                     WHERE i.status = 'runnable'
                       AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL
                            OR i.rate_limit IS NOT NULL)
                       AND (i.queue, i.priority) > (l.queue, l.priority)
                     ORDER BY i.queue, i.priority
                     LIMIT 1) n
), parts AS (
    SELECT l.queue, l.priority,
           (SELECT count(*) FROM (SELECT 1 FROM gd_instances i
                                   WHERE i.status = 'runnable'
                                     AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL
                                          OR i.rate_limit IS NOT NULL)
                                     AND i.queue = l.queue AND i.priority = l.priority
                                   LIMIT $1) x) AS runnable,
           (SELECT count(*) FROM (SELECT 1 FROM gd_instances i
                                   WHERE i.status = 'runnable'
                                     AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL
                                          OR i.rate_limit IS NOT NULL)
                                     AND i.queue = l.queue AND i.priority = l.priority
                                     AND i.eligible_at <= coalesce($2, now())
                                   LIMIT $1) x) AS ready,
           (SELECT i.eligible_at FROM gd_instances i
             WHERE i.status = 'runnable'
               AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
               AND i.queue = l.queue AND i.priority = l.priority
             ORDER BY i.eligible_at
             LIMIT 1) AS oldest
      FROM lanes l
    UNION ALL
    SELECT g.queue, g.priority, w.n, w.n,
           (SELECT i.eligible_at FROM gd_ready r
              JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq AND i.status = 'runnable'
             WHERE r.lane = g.lane AND r.seq >= g.next_seq
             ORDER BY r.seq
             LIMIT 1)
      FROM gd_lanes g,
           LATERAL (SELECT count(*) AS n FROM (
                        SELECT 1 FROM gd_ready r
                          JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq
                                             AND i.status = 'runnable'
                         WHERE r.lane = g.lane AND r.seq >= g.next_seq
                         LIMIT $1) x) w
    UNION ALL
    SELECT i.queue, i.priority, count(*),
           count(*) FILTER (WHERE i.eligible_at <= coalesce($2, now())), min(i.eligible_at)
      FROM (SELECT DISTINCT d.id FROM (SELECT d.id FROM gd_due d LIMIT $1) d) d
      JOIN gd_instances i ON i.id = d.id AND i.status = 'runnable'
                         AND coalesce(i.ready_seq, 0) = 0
     GROUP BY i.queue, i.priority
)
SELECT queue, priority, least(sum(runnable), $1)::int8 AS runnable,
       least(sum(ready), $1)::int8 AS ready, min(oldest) AS oldest
  FROM parts
 GROUP BY queue, priority
HAVING sum(runnable) > 0
 ORDER BY queue, priority
"#;

/// One `(queue, priority)` lane of runnable rows; counts stop at the cap.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct LaneRow {
    pub(crate) queue: String,
    pub(crate) priority: i16,
    pub(crate) runnable: i64,
    pub(crate) ready: i64,
    pub(crate) oldest: Option<DateTime<Utc>>,
}

pub(crate) async fn lanes<'e>(
    db: impl PgExecutor<'e>,
    cap: i64,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<LaneRow>> {
    Ok(sqlx::query_as(LANES)
        .bind(cap)
        .bind(now)
        .fetch_all(db)
        .await?)
}

/// Executing rows per queue, up to `$1` rows of each kind: a range of the lease index
/// `gd_instances_lease WHERE status = 'executing'` stopped by the `LIMIT` (the queue is
/// read from each row), and the plain rows still at their entries in the log's live
/// batches (`gd_batches`, their entries by `gd_ready_lane_seq`, each row by primary key).
/// Executing rows are the ones nodes hold, so there are rarely many; when the cap is
/// reached the per-queue counts are lower bounds.
pub const EXECUTING: &str = r#"/* gd:admin */
SELECT queue, count(*) AS executing
  FROM ((SELECT queue FROM gd_instances WHERE status = 'executing' LIMIT $1)
        UNION ALL
        (SELECT i.queue FROM gd_batches b
           JOIN gd_ready r ON r.lane = b.lane AND r.seq >= b.lo AND r.seq < b.hi
           JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq AND i.status = 'runnable'
          LIMIT $1)) x
 GROUP BY queue
 ORDER BY queue
"#;

/// Executing rows of one queue (see [`EXECUTING`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ExecutingRow {
    pub(crate) queue: String,
    pub(crate) executing: i64,
}

pub(crate) async fn executing<'e>(db: impl PgExecutor<'e>, cap: i64) -> Result<Vec<ExecutingRow>> {
    Ok(sqlx::query_as(EXECUTING).bind(cap).fetch_all(db).await?)
}

/// The table's size in pages, from the file's size (no row is read): what sets the
/// sample's percentage ([`sample_percent`]).
pub const TABLE_PAGES: &str = r#"/* gd:admin */
SELECT (pg_relation_size('gd_instances') / current_setting('block_size')::int8)::int8
"#;

/// The table's size in pages ([`TABLE_PAGES`]).
pub async fn table_pages<'e>(db: impl PgExecutor<'e>) -> Result<i64> {
    Ok(sqlx::query_scalar(TABLE_PAGES).fetch_one(db).await?)
}

/// The `TABLESAMPLE SYSTEM` percentage that reads about `SAMPLE_PAGES` of a table of
/// `pages` pages: 100 (every page, exact counts) for a table that small.
pub fn sample_percent(pages: i64) -> f64 {
    if pages <= SAMPLE_PAGES {
        100.0
    } else {
        100.0 * SAMPLE_PAGES as f64 / pages as f64
    }
}

/// Rows per queue and status in a sample of the table: `TABLESAMPLE SYSTEM ($1)` reads
/// each page with probability `$1`%, so the cost follows the pages sampled, not the
/// table; counts scaled by `100 / $1` estimate the table's. `REPEATABLE` samples the same
/// pages on every call while the table keeps its size, so a page refreshed twice shows
/// the same estimate rather than noise. `ready` counts the sampled runnable rows due at
/// `$2`; `oldest` is the sampled rows' oldest `updated_at` (for a parked row, when it
/// parked).
pub const SAMPLE_BY_QUEUE: &str = r#"/* gd:admin */
SELECT queue, status::text AS status, count(*) AS rows,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at <= coalesce($2, now())) AS ready,
       min(updated_at) AS oldest
  FROM gd_instances TABLESAMPLE SYSTEM ($1) REPEATABLE (0)
 GROUP BY queue, gd_instances.status
 ORDER BY queue, gd_instances.status
"#;

/// The sampled rows of one (queue, status).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct SampleRow {
    pub(crate) queue: String,
    pub(crate) status: crate::Status,
    pub(crate) rows: i64,
    pub(crate) ready: i64,
    pub(crate) oldest: Option<DateTime<Utc>>,
}

pub(crate) async fn sample_by_queue<'e>(
    db: impl PgExecutor<'e>,
    percent: f64,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<SampleRow>> {
    Ok(sqlx::query_as(SAMPLE_BY_QUEUE)
        .bind(percent as f32)
        .bind(now)
        .fetch_all(db)
        .await?)
}

/// Runnable rows that wait for something other than a worker, per queue and reason (the
/// names of `explain`'s reasons), with the first `eligible_at` of each: the soonest due
/// for rows not due yet, the longest waiting for rows held back. `$1` caps what each part
/// reads per lane (or per queue), `$2` is the clock, `$3`/`$4` the `(queue, priority)`
/// lanes that hold runnable rows ([`LANES`]), `$5` the queues and `$6` the nodes' liveness
/// window in milliseconds.
///
/// - **Not due yet**, rows with a key, a gate or a limit: per lane, the pick index's range
///   after `$2`, up to `$1` entries: `rate_limited` (tokens reserved, `rate_paid`),
///   `scheduled` (attempt 0) or `backoff` (a retry).
/// - **Not due yet**, plain rows: per queue, `gd_due`'s range after `$2` (`gd_due_queue_at`),
///   up to `$1` entries, each row by primary key: `scheduled` or `backoff`.
/// - **Due and held back**, rows with a key, a gate or a limit: per lane, the first `$1`
///   due entries of the pick index, each checked in `explain`'s order by the index of its
///   key's executing rows — `partition_blocked` (a K = 1 key runs,
///   `gd_instances_partition_executing`), `gate_full` (its gate key runs K,
///   `gd_instances_gate_executing`) — then `no_node_for_version` (live nodes pick its
///   queue, none runs its FSM at its version: the `name@version` tags of `gd_nodes`).
/// - **Due and held back**, plain rows: per lane of `gd_lanes` of the queues, the first
///   `$1` entries not yet claimed whose row still waits at them (`gd_ready_lane_seq`, the
///   row by primary key), and per queue the first `$1` due entries of `gd_due` not yet
///   promoted (a claim promotes only the FSMs its node runs): `no_node_for_version`.
///
/// Each line says whether a part it was read from stopped at `$1` (`capped`): its count
/// is then a lower bound.
///
/// A queue no live node picks at all is the caller's verdict (`no_node_for_queue`, which
/// `explain` checks first): its due rows are counted by [`LANES`], none here. Its cost is the number of lanes times `4 × $1`
/// index entries at most, plus one probe per due row read.
pub const WAITING: &str = r#"/* gd:admin */
WITH t AS (SELECT coalesce($2, now()) AS now),
live AS MATERIALIZED (
    SELECT n.queues, n.fsms FROM gd_nodes n, t
     WHERE n.last_seen_at > t.now - $6 * interval '1 millisecond'
),
lanes AS (SELECT * FROM unnest($3::text[], $4::int2[]) AS l(queue, priority)),
flow_later AS (
    SELECT l.queue,
           CASE WHEN x.rate_paid THEN 'rate_limited'
                WHEN x.attempt = 0 THEN 'scheduled' ELSE 'backoff' END AS reason,
           x.eligible_at, count(*) OVER (PARTITION BY l.queue, l.priority) >= $1 AS capped
      FROM lanes l CROSS JOIN t
     CROSS JOIN LATERAL (
           SELECT i.rate_paid, i.attempt, i.eligible_at FROM gd_instances i
            WHERE i.queue = l.queue AND i.priority = l.priority AND i.status = 'runnable'
              AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
              AND i.eligible_at > t.now
            ORDER BY i.eligible_at
            LIMIT $1) x
),
due AS (
    -- Per queue, the first `$1` entries of `gd_due` after now (not due yet) and up to now
    -- (due, not promoted yet: a claim promotes only the FSMs its node runs), by id.
    SELECT q.queue, d.id, d.later, count(*) OVER (PARTITION BY q.queue, d.later) >= $1 AS capped
      FROM unnest($5::text[]) AS q(queue) CROSS JOIN t
     CROSS JOIN LATERAL (
           (SELECT DISTINCT d.id, true AS later
              FROM (SELECT d.id FROM gd_due d
                     WHERE d.queue = q.queue AND d.at > t.now
                     ORDER BY d.at LIMIT $1) d)
           UNION ALL
           (SELECT DISTINCT d.id, false
              FROM (SELECT d.id FROM gd_due d
                     WHERE d.queue = q.queue AND d.at <= t.now
                     ORDER BY d.at LIMIT $1) d)) d
),
plain_later AS (
    SELECT d.queue, CASE WHEN i.attempt = 0 THEN 'scheduled' ELSE 'backoff' END AS reason,
           i.eligible_at, d.capped
      FROM due d CROSS JOIN t
      JOIN gd_instances i ON i.id = d.id AND i.status = 'runnable'
                         AND coalesce(i.ready_seq, 0) = 0 AND i.eligible_at > t.now
     WHERE d.later
),
flow_held AS (
    SELECT l.queue,
           CASE WHEN x.partition_key IS NOT NULL AND x.gate IS NULL
                     AND EXISTS (SELECT 1 FROM gd_instances e
                                  WHERE e.partition_key = x.partition_key
                                    AND e.status = 'executing' AND e.gate IS NULL)
                THEN 'partition_blocked'
                WHEN x.gate IS NOT NULL
                     AND (SELECT count(*) FROM gd_instances e
                           WHERE e.status = 'executing' AND e.gate = x.gate
                             AND e.partition_key = x.partition_key)
                         >= (SELECT g.size FROM gd_gates g WHERE g.name = x.gate)
                THEN 'gate_full'
                WHEN EXISTS (SELECT 1 FROM live WHERE x.queue = ANY (live.queues))
                     AND NOT EXISTS (SELECT 1 FROM live
                                      WHERE x.queue = ANY (live.queues)
                                        AND x.fsm || '@' || x.fsm_version = ANY (live.fsms))
                THEN 'no_node_for_version'
           END AS reason,
           x.eligible_at, count(*) OVER (PARTITION BY l.queue, l.priority) >= $1 AS capped
      FROM lanes l CROSS JOIN t
     CROSS JOIN LATERAL (
           SELECT i.queue, i.fsm, i.fsm_version, i.gate, i.partition_key, i.eligible_at
             FROM gd_instances i
            WHERE i.queue = l.queue AND i.priority = l.priority AND i.status = 'runnable'
              AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
              AND i.eligible_at <= t.now
            ORDER BY i.eligible_at
            LIMIT $1) x
),
plain_due AS (
    SELECT g.queue, x.fsm, x.fsm_version, x.eligible_at,
           count(*) OVER (PARTITION BY g.lane) >= $1 AS capped
      FROM gd_lanes g
     CROSS JOIN LATERAL (
           SELECT i.fsm, i.fsm_version, i.eligible_at
             FROM gd_ready r
             JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq AND i.status = 'runnable'
            WHERE r.lane = g.lane AND r.seq >= g.next_seq
            ORDER BY r.seq
            LIMIT $1) x
     WHERE g.queue = ANY ($5::text[])
    UNION ALL
    SELECT d.queue, i.fsm, i.fsm_version, i.eligible_at, d.capped
      FROM due d CROSS JOIN t
      JOIN gd_instances i ON i.id = d.id AND i.status = 'runnable'
                         AND coalesce(i.ready_seq, 0) = 0 AND i.eligible_at <= t.now
     WHERE NOT d.later
),
plain_held AS (
    SELECT p.queue, 'no_node_for_version' AS reason, p.eligible_at, p.capped
      FROM plain_due p
     WHERE EXISTS (SELECT 1 FROM live WHERE p.queue = ANY (live.queues))
       AND NOT EXISTS (SELECT 1 FROM live
                        WHERE p.queue = ANY (live.queues)
                          AND p.fsm || '@' || p.fsm_version = ANY (live.fsms))
)
SELECT queue, reason, count(*) AS rows, min(eligible_at) AS first, bool_or(capped) AS capped
  FROM (SELECT * FROM flow_later
        UNION ALL SELECT * FROM plain_later
        UNION ALL SELECT * FROM flow_held WHERE reason IS NOT NULL
        UNION ALL SELECT * FROM plain_held) w
 GROUP BY queue, reason
 ORDER BY queue, reason
"#;

/// Rows of one queue waiting for one reason ([`WAITING`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct WaitingRow {
    pub(crate) queue: String,
    pub(crate) reason: String,
    pub(crate) rows: i64,
    pub(crate) first: Option<DateTime<Utc>>,
    /// A part it was read from stopped at the cap: `rows` is a lower bound.
    pub(crate) capped: bool,
}

pub(crate) async fn waiting<'e>(
    db: impl PgExecutor<'e>,
    cap: i64,
    now: DateTime<Utc>,
    lanes: &[(String, i16)],
    queues: &[String],
) -> Result<Vec<WaitingRow>> {
    let (lane_queues, priorities): (Vec<&str>, Vec<i16>) =
        lanes.iter().map(|(q, p)| (q.as_str(), *p)).unzip();
    Ok(sqlx::query_as(WAITING)
        .bind(cap)
        .bind(now)
        .bind(lane_queues)
        .bind(priorities)
        .bind(queues)
        .bind(super::admin::NODE_LIVE_WINDOW_MS)
        .fetch_all(db)
        .await?)
}
