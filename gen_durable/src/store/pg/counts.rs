//! Rows per queue and status at a bounded cost, for the dashboard's overview and the queue
//! gauges of `gen_durable::metrics` (`crate::ops::counts` puts the figures together).
//!
//! Exact counts of every status need every row: no index covers them all, and adding one
//! (or a counter table) would tax every step the engine commits — each update of
//! `gd_instances` writes every index. So these statements read what the existing partial
//! indexes give cheaply, and stop:
//!
//! - runnable rows, rows due now and the oldest due row per queue, from the pick index
//!   `gd_instances_pick (queue, priority, eligible_at, id) WHERE status = 'runnable'`,
//!   counted up to a cap ([`LANES`]);
//! - executing rows per queue, from the lease index, up to a cap ([`EXECUTING`]);
//! - every status per queue from a sample of about [`SAMPLE_PAGES`] pages of the table
//!   ([`SAMPLE_BY_QUEUE`]): exact when the table is that small (a 100% sample reads every
//!   page), an estimate scaled from the sample otherwise.
//!
//! None of them locks or writes anything.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;

/// How many pages of `gd_instances` a sample reads (8 kB each): about 4,000 rows of a
/// typical table, a few milliseconds. A table of at most this many pages is read whole,
/// so its counts are exact.
pub(crate) const SAMPLE_PAGES: i64 = 128;

/// The distinct `(queue, priority)` lanes of runnable rows, found by a loose index scan
/// of the pick index (a recursive CTE that jumps from one lane to the next, one index
/// probe each, instead of reading every runnable row), and for each lane:
///
/// - `runnable`: its rows, counted up to `$1` (an index-only range scan stopped by the
///   `LIMIT`);
/// - `ready`: its rows due at `$2`, up to `$1`: within a lane the index is ordered by
///   `eligible_at`, so the due rows are a prefix of the range;
/// - `oldest`: its smallest `eligible_at`, the first entry of the range (the oldest due
///   row if it is not in the future).
///
/// Its cost is the number of lanes times `$1` index entries at most, whatever the backlog.
pub const LANES: &str = r#"/* gd:admin */
WITH RECURSIVE lanes AS (
    (SELECT queue, priority FROM gd_instances
      WHERE status = 'runnable'
      ORDER BY queue, priority
      LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority
      FROM lanes l,
           LATERAL (SELECT i.queue, i.priority FROM gd_instances i
                     WHERE i.status = 'runnable' AND (i.queue, i.priority) > (l.queue, l.priority)
                     ORDER BY i.queue, i.priority
                     LIMIT 1) n
)
SELECT l.queue, l.priority,
       (SELECT count(*) FROM (SELECT 1 FROM gd_instances i
                               WHERE i.status = 'runnable' AND i.queue = l.queue
                                 AND i.priority = l.priority
                               LIMIT $1) x) AS runnable,
       (SELECT count(*) FROM (SELECT 1 FROM gd_instances i
                               WHERE i.status = 'runnable' AND i.queue = l.queue
                                 AND i.priority = l.priority
                                 AND i.eligible_at <= coalesce($2, now())
                               LIMIT $1) x) AS ready,
       (SELECT i.eligible_at FROM gd_instances i
         WHERE i.status = 'runnable' AND i.queue = l.queue AND i.priority = l.priority
         ORDER BY i.eligible_at
         LIMIT 1) AS oldest
  FROM lanes l
 ORDER BY l.queue, l.priority
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

/// Executing rows per queue, up to `$1` rows in all: a range of the lease index
/// `gd_instances_lease WHERE status = 'executing'` stopped by the `LIMIT` (the queue is
/// read from each row). Executing rows are the ones nodes hold, so there are rarely many;
/// when the cap is reached the per-queue counts are lower bounds.
pub const EXECUTING: &str = r#"/* gd:admin */
SELECT queue, count(*) AS executing
  FROM (SELECT queue FROM gd_instances WHERE status = 'executing' LIMIT $1) x
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
/// `$2`.
pub const SAMPLE_BY_QUEUE: &str = r#"/* gd:admin */
SELECT queue, status::text AS status, count(*) AS rows,
       count(*) FILTER (WHERE status = 'runnable' AND eligible_at <= coalesce($2, now())) AS ready
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
