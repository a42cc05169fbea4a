//! The statements only the web dashboard runs (`crate::dashboard`); its overview and
//! instance page also reuse `status`'s and `inspect`'s statements from `admin.rs`.
//!
//! Every statement here is bounded by an index range, a `LIMIT` on an index scan or a
//! sample of a fixed number of pages, so a page costs the same on a table of a thousand
//! rows or of a million: the EXPLAIN lines are in docs/design/dashboard.md. All of them only
//! read. The overview's counts are `counts.rs`' (the metrics read them too).

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use gen_durable::Result;

/// Done and failed rows per minute since `$1`, with how long they took from insert to
/// finish (the median and the 95th percentile, in milliseconds), for the overview's chart
/// of the last 30 minutes. A range of the collector's index `gd_instances_finished
/// (finished_at) WHERE status IN ('done', 'failed')`, so it reads the rows that finished
/// in the window and nothing older: its cost follows the throughput, not the table.
const THROUGHPUT: &str = r#"/* gd:dashboard */
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - inserted_at))
           * 1000 AS p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - inserted_at))
           * 1000 AS p95_ms
  FROM gd_instances
 WHERE status IN ('done', 'failed') AND finished_at >= $1
 GROUP BY 1
 ORDER BY 1
"#;

/// One minute of the chart of the last 30 minutes.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct MinuteRow {
    pub(crate) minute: DateTime<Utc>,
    pub(crate) done: i64,
    pub(crate) failed: i64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p95_ms: Option<f64>,
}

pub(crate) async fn throughput<'e>(
    db: impl PgExecutor<'e>,
    since: DateTime<Utc>,
) -> Result<Vec<MinuteRow>> {
    Ok(sqlx::query_as(THROUGHPUT).bind(since).fetch_all(db).await?)
}

/// The collector's per-minute rollup for all queues (`gd_minutes`, queue `'*'`) since
/// `$1`, summed into buckets of `$2` seconds from `$1`: done, failed, and the histogram of
/// how long they took (slot by slot: one aggregate per slot, a single pass over the rows).
/// A range of its primary key `(queue, minute)`: 1,440 rows a day of window.
const ROLLUP: &str = r#"/* gd:dashboard */
SELECT $1 + floor(extract(epoch FROM minute - $1) / $2) * $2 * interval '1 second' AS at,
       sum(done)::int8 AS done, sum(failed)::int8 AS failed,
       ARRAY[
             sum(took_ms[1]), sum(took_ms[2]), sum(took_ms[3]), sum(took_ms[4]),
             sum(took_ms[5]), sum(took_ms[6]), sum(took_ms[7]), sum(took_ms[8]),
             sum(took_ms[9]), sum(took_ms[10]), sum(took_ms[11]), sum(took_ms[12]),
             sum(took_ms[13]), sum(took_ms[14]), sum(took_ms[15]), sum(took_ms[16]),
             sum(took_ms[17]), sum(took_ms[18]), sum(took_ms[19]), sum(took_ms[20]),
             sum(took_ms[21]), sum(took_ms[22]), sum(took_ms[23]), sum(took_ms[24]),
             sum(took_ms[25]), sum(took_ms[26]), sum(took_ms[27]), sum(took_ms[28]),
             sum(took_ms[29]), sum(took_ms[30]), sum(took_ms[31]), sum(took_ms[32])
       ]::int8[] AS took_ms
  FROM gd_minutes
 WHERE minute >= $1 AND queue = '*'
 GROUP BY 1
 ORDER BY 1
"#;

/// One bucket of a chart read from the rollup.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct RollupRow {
    pub(crate) at: DateTime<Utc>,
    pub(crate) done: i64,
    pub(crate) failed: i64,
    pub(crate) took_ms: Vec<i64>,
}

pub(crate) async fn rollup<'e>(
    db: impl PgExecutor<'e>,
    since: DateTime<Utc>,
    bucket_secs: i64,
) -> Result<Vec<RollupRow>> {
    Ok(sqlx::query_as(ROLLUP)
        .bind(since)
        .bind(bucket_secs as f64)
        .fetch_all(db)
        .await?)
}

/// Queues an operator paused (migration 0009): a handful of rows at most.
const PAUSES: &str = r#"/* gd:dashboard */
SELECT queue, paused_at, reason FROM gd_queue_pauses ORDER BY queue
"#;

/// One paused queue.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct PauseRow {
    pub(crate) queue: String,
    pub(crate) paused_at: DateTime<Utc>,
    pub(crate) reason: Option<String>,
}

pub(crate) async fn pauses<'e>(db: impl PgExecutor<'e>) -> Result<Vec<PauseRow>> {
    Ok(sqlx::query_as(PAUSES).fetch_all(db).await?)
}

/// One page of the instance list, newest first, below the keyset cursor `$1`.
///
/// The filters (queue, FSM, status, insert time) are checked on the rows of a *window*:
/// the `$2` rows below the cursor in primary-key order (a backward range scan of the
/// primary key, stopped by the `LIMIT`). No combination of filters can make a page read
/// more than the window, whatever the table holds; a page that finds fewer than `$8`
/// matches in its window says so and its "older" link starts below the window
/// ([`WINDOW_END`]). The subquery keeps the window's order, so no sort runs.
const PAGE: &str = r#"/* gd:dashboard */
SELECT w.id, w.fsm, w.fsm_version, w.step, w.status::text AS status, w.queue, w.attempt,
       w.unique_key, w.parent_id, w.last_error, w.inserted_at, w.updated_at
  FROM (SELECT id, fsm, fsm_version, step, gd_status_of(g) AS status, queue, attempt,
               unique_key, parent_id, last_error, inserted_at, updated_at, state, result
          FROM gd_instances g
         WHERE id < $1
         ORDER BY id DESC
         LIMIT $2) w
 WHERE ($3::text IS NULL OR w.queue = $3)
   AND ($4::text IS NULL OR w.fsm = $4)
   AND (cardinality($5::text[]) = 0 OR w.status::text = ANY ($5::text[]))
   AND ($6::timestamptz IS NULL OR w.inserted_at >= $6)
   AND ($7::timestamptz IS NULL OR w.inserted_at < $7)
   AND ($9::text IS NULL OR w.last_error ILIKE $9)
   AND ($10::text IS NULL OR jsonb_build_object('state', w.state, 'result', w.result) @@ $10::text::jsonpath)
 ORDER BY w.id DESC
 LIMIT $8
"#;

/// The same page for one correlation key: the key index `gd_instances_key (unique_key,
/// id)` gives exactly its rows, newest first, so no window is needed (`$2` is the key;
/// the other parameters are [`PAGE`]'s).
const PAGE_BY_KEY: &str = r#"/* gd:dashboard */
SELECT id, fsm, fsm_version, step, gd_status_of(g)::text AS status, queue, attempt,
       unique_key, parent_id, last_error, inserted_at, updated_at
  FROM gd_instances g
 WHERE unique_key = $2 AND id < $1
   AND ($3::text IS NULL OR queue = $3)
   AND ($4::text IS NULL OR fsm = $4)
   AND (cardinality($5::text[]) = 0 OR gd_status_of(g)::text = ANY ($5::text[]))
   AND ($6::timestamptz IS NULL OR inserted_at >= $6)
   AND ($7::timestamptz IS NULL OR inserted_at < $7)
   AND ($9::text IS NULL OR last_error ILIKE $9)
   AND ($10::text IS NULL OR jsonb_build_object('state', state, 'result', result) @@ $10::text::jsonpath)
 ORDER BY id DESC
 LIMIT $8
"#;

/// The same page for one parent's children: the parent index `gd_instances_parent
/// (parent_id)` gives exactly them (`$2` is the parent; the other parameters are
/// [`PAGE`]'s), newest first.
const PAGE_BY_PARENT: &str = r#"/* gd:dashboard */
SELECT id, fsm, fsm_version, step, gd_status_of(g)::text AS status, queue, attempt,
       unique_key, parent_id, last_error, inserted_at, updated_at
  FROM gd_instances g
 WHERE parent_id = $2 AND id < $1
   AND ($3::text IS NULL OR queue = $3)
   AND ($4::text IS NULL OR fsm = $4)
   AND (cardinality($5::text[]) = 0 OR gd_status_of(g)::text = ANY ($5::text[]))
   AND ($6::timestamptz IS NULL OR inserted_at >= $6)
   AND ($7::timestamptz IS NULL OR inserted_at < $7)
   AND ($9::text IS NULL OR last_error ILIKE $9)
   AND ($10::text IS NULL OR jsonb_build_object('state', state, 'result', result) @@ $10::text::jsonpath)
 ORDER BY id DESC
 LIMIT $8
"#;

/// Whether `$1` is a JSON path predicate PostgreSQL reads (`$.state.order == 42`).
const CHECK_PATH: &str = r#"/* gd:dashboard */ SELECT $1::text::jsonpath::text"#;

/// `Err` with PostgreSQL's words when `path` is not a JSON path it reads.
pub(crate) async fn check_path<'e>(
    db: impl PgExecutor<'e>,
    path: &str,
) -> Result<std::result::Result<(), String>> {
    match sqlx::query_scalar::<_, String>(CHECK_PATH)
        .bind(path)
        .fetch_one(db)
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(sqlx::Error::Database(e)) if e.code().is_some_and(|c| c.starts_with("42")) => {
            Ok(Err(e.message().to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// The queue and FSM names in use, for the list's pick lists and to read a filter's name
/// without regard to case: what nodes announce, and the ready log's lanes (one per queue,
/// FSM and priority that ever had a plain row). Two small tables.
const NAMES: &str = r#"/* gd:dashboard */
SELECT 'queue' AS kind, q AS name FROM gd_nodes, unnest(queues) q
UNION SELECT 'fsm', split_part(f, '@', 1) FROM gd_nodes, unnest(fsms) f
UNION SELECT 'queue', queue FROM gd_lanes
UNION SELECT 'fsm', fsm FROM gd_lanes
 ORDER BY 1, 2
"#;

/// The queue names and the FSM names in use ([`NAMES`]).
pub(crate) async fn names<'e>(db: impl PgExecutor<'e>) -> Result<(Vec<String>, Vec<String>)> {
    let rows: Vec<(String, String)> = sqlx::query_as(NAMES).fetch_all(db).await?;
    let (queues, fsms): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(k, _)| k == "queue");
    Ok((
        queues.into_iter().map(|(_, n)| n).collect(),
        fsms.into_iter().map(|(_, n)| n).collect(),
    ))
}

/// The lowest id of a window (see [`PAGE`]): an index-only scan of `$2` primary-key
/// entries. `NULL` when no row is below the cursor.
const WINDOW_END: &str = r#"/* gd:dashboard */
SELECT min(id) FROM (SELECT id FROM gd_instances WHERE id < $1 ORDER BY id DESC LIMIT $2) w
"#;

/// What the instance list filters on; `None` is "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListFilter {
    pub(crate) queue: Option<String>,
    pub(crate) fsm: Option<String>,
    /// Any of these statuses; empty: any status.
    pub(crate) status: Vec<String>,
    pub(crate) key: Option<String>,
    /// The children of this instance only.
    pub(crate) parent: Option<i64>,
    /// Text the last error contains, any case.
    pub(crate) error: Option<String>,
    /// A JSON path predicate over `{"state": …, "result": …}` ([`check_path`] first).
    pub(crate) path: Option<String>,
    pub(crate) since: Option<DateTime<Utc>>,
    pub(crate) until: Option<DateTime<Utc>>,
}

/// One line of the instance list.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ListRow {
    pub(crate) id: i64,
    pub(crate) fsm: String,
    pub(crate) fsm_version: i32,
    pub(crate) step: String,
    pub(crate) status: String,
    pub(crate) queue: String,
    pub(crate) attempt: i32,
    pub(crate) unique_key: Option<String>,
    pub(crate) parent_id: Option<i64>,
    pub(crate) last_error: Option<String>,
    pub(crate) inserted_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

/// Up to `limit` rows matching `filter` with ids below `before`, newest first; without a
/// key, only among the `window` rows below `before`.
pub(crate) async fn page<'e>(
    db: impl PgExecutor<'e>,
    filter: &ListFilter,
    before: i64,
    window: i64,
    limit: i64,
) -> Result<Vec<ListRow>> {
    let q = match (&filter.key, filter.parent) {
        (Some(key), _) => sqlx::query_as(PAGE_BY_KEY).bind(before).bind(key.clone()),
        (None, Some(parent)) => sqlx::query_as(PAGE_BY_PARENT).bind(before).bind(parent),
        (None, None) => sqlx::query_as(PAGE).bind(before).bind(window),
    };
    let contains = filter.error.as_deref().map(|e| {
        let escaped = e
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        format!("%{escaped}%")
    });
    let q = q
        .bind(&filter.queue)
        .bind(&filter.fsm)
        .bind(&filter.status)
        .bind(filter.since)
        .bind(filter.until)
        .bind(limit)
        .bind(contains)
        .bind(&filter.path);
    Ok(q.fetch_all(db).await?)
}

pub(crate) async fn window_end<'e>(
    db: impl PgExecutor<'e>,
    before: i64,
    window: i64,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(WINDOW_END)
        .bind(before)
        .bind(window)
        .fetch_one(db)
        .await?)
}

/// The descendants of `$1`, breadth first, down to depth `$2`, at most `$3` of them: a
/// recursive walk of the `gd_instances_parent (parent_id)` index. The outer `LIMIT`
/// stops the walk (a recursive CTE is evaluated as its rows are read), so a parent of
/// 10,000 children costs `$3` index probes.
const TREE: &str = r#"/* gd:dashboard */
WITH RECURSIVE tree AS (
    SELECT g.id, g.parent_id, g.fsm, g.fsm_version, g.step, gd_status_of(g) AS status, 1 AS depth
      FROM gd_instances g WHERE g.parent_id = $1
    UNION ALL
    SELECT c.id, c.parent_id, c.fsm, c.fsm_version, c.step, gd_status_of(c), t.depth + 1
      FROM tree t JOIN gd_instances c ON c.parent_id = t.id
     WHERE t.depth < $2
)
SELECT id, parent_id, fsm, fsm_version, step, status::text AS status, depth
  FROM tree
 LIMIT $3
"#;

/// One descendant in the instance page's tree.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct TreeRow {
    pub(crate) id: i64,
    pub(crate) parent_id: Option<i64>,
    pub(crate) fsm: String,
    pub(crate) fsm_version: i32,
    pub(crate) step: String,
    pub(crate) status: String,
    pub(crate) depth: i32,
}

pub(crate) async fn tree<'e>(
    db: impl PgExecutor<'e>,
    id: i64,
    max_depth: i32,
    limit: i64,
) -> Result<Vec<TreeRow>> {
    Ok(sqlx::query_as(TREE)
        .bind(id)
        .bind(max_depth)
        .bind(limit)
        .fetch_all(db)
        .await?)
}

/// The steps of FSM version `$1` (`name@version`) in their declared order, as the live
/// node seen last that runs it announces them (`gd_nodes.steps`): the restart form's
/// choices. A small table, one node's list.
pub(crate) const VERSION_STEPS: &str = r#"/* gd:dashboard */
SELECT s.step
  FROM (SELECT n.steps -> $1 AS list FROM gd_nodes n
         WHERE n.steps ? $1
           AND n.last_seen_at > now() - $2 * interval '1 millisecond'
         ORDER BY n.last_seen_at DESC
         LIMIT 1) n,
       jsonb_array_elements_text(n.list) WITH ORDINALITY s(step, k)
 ORDER BY s.k
"#;

/// [`VERSION_STEPS`] of `fsm` version `version`: empty when no live node announces it.
pub(crate) async fn version_steps<'e>(
    db: impl PgExecutor<'e>,
    fsm: &str,
    version: i64,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(VERSION_STEPS)
        .bind(format!("{fsm}@{version}"))
        .bind(super::admin::NODE_LIVE_WINDOW_MS)
        .fetch_all(db)
        .await?)
}

/// The (FSM, version) pairs present in a sample of the table, with their live and total
/// rows in it. No index has the FSM, so an exact answer would read every row; instead
/// `TABLESAMPLE SYSTEM ($1)` reads each page with probability `$1`% (the percentage
/// `counts::sample_percent` gives for about `counts::SAMPLE_PAGES` pages), and the page
/// scales the counts by `100 / $1`. At 100% (a table that small) they are exact. A version
/// with few rows may be missing from a sample: `gen_durable status` finds those (it
/// scans). `REPEATABLE`: the same pages on each call, so a refresh does not jitter.
const SAMPLE_BY_FSM: &str = r#"/* gd:dashboard */
SELECT fsm, fsm_version,
       count(*) FILTER (WHERE status NOT IN ('done', 'failed')) AS live,
       count(*) AS rows
  FROM gd_instances TABLESAMPLE SYSTEM ($1) REPEATABLE (0)
 GROUP BY fsm, fsm_version
 ORDER BY fsm, fsm_version
"#;

/// One (FSM, version) present in the sample: its sampled rows.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct FsmVersionRow {
    pub(crate) fsm: String,
    pub(crate) fsm_version: i32,
    pub(crate) live: i64,
    pub(crate) rows: i64,
}

pub(crate) async fn fsm_versions_sampled<'e>(
    db: impl PgExecutor<'e>,
    percent: f64,
) -> Result<Vec<FsmVersionRow>> {
    Ok(sqlx::query_as(SAMPLE_BY_FSM)
        .bind(percent as f32)
        .fetch_all(db)
        .await?)
}

/// Every statement a dashboard page runs, with the parameters of a typical first load,
/// under a name. `EXPLAIN (ANALYZE, BUFFERS)` of each is what docs/design/dashboard.md records
/// at 1M rows (`plans`); the queue counts are `counts`' (shared with the metrics), the
/// nodes, leases, schedules and inspection `status`'s and `inspect`'s, the flow control
/// `gate.rs`' and `rate_limit.rs`'. `sample` is the
/// percentage the pages sample the table with (`counts::sample_percent`).
fn page_statements(id: i64, sample: f64) -> Vec<(&'static str, &'static str, Vec<Param>)> {
    use super::admin;
    use gen_durable::backend::counts;
    let t = Param::Time;
    let cap = Param::Int(1_000);
    vec![
        (
            "overview: runnable lanes (counts)",
            counts::LANES,
            vec![cap, Param::NullTime],
        ),
        ("overview: executing (counts)", counts::EXECUTING, vec![cap]),
        (
            "overview: what waits, and why (counts)",
            counts::WAITING,
            vec![
                cap,
                Param::NullTime,
                Param::Texts(&["q0", "q1", "q2", "q3"]),
                Param::Int2s(&[0, 0, 0, 0]),
                Param::Texts(&["q0", "q1", "q2", "q3"]),
                Param::Int(60_000),
            ],
        ),
        (
            "overview, fsms: table pages (counts)",
            counts::TABLE_PAGES,
            vec![],
        ),
        (
            "overview: sample by queue (counts)",
            counts::SAMPLE_BY_QUEUE,
            vec![Param::Float4(sample), Param::NullTime],
        ),
        ("overview: throughput", THROUGHPUT, vec![t(30)]),
        (
            "overview: throughput over 7 days (rollup)",
            ROLLUP,
            vec![t(7 * 24 * 60), Param::Float8(4.0 * 3600.0)],
        ),
        ("overview: pauses", PAUSES, vec![]),
        (
            "instance: the version's steps (restart form)",
            VERSION_STEPS,
            vec![Param::Text("Checkout@1"), Param::Int(60_000)],
        ),
        ("overview: schedules", admin::SCHEDULES, vec![]),
        (
            "overview: expired leases",
            admin::EXPIRED_LEASES,
            vec![Param::NullTime, Param::Int4(10)],
        ),
        (
            "overview, fsms: nodes",
            admin::NODES,
            vec![Param::NullTime, Param::Int(60_000)],
        ),
        (
            "instances: first page, no filter",
            PAGE,
            vec![
                Param::Int(i64::MAX),
                Param::Int(10_000),
                Param::NullText,
                Param::NullText,
                Param::Texts(&[]),
                Param::NullTime,
                Param::NullTime,
                Param::Int(50),
                Param::NullText,
                Param::NullText,
            ],
        ),
        (
            "instances: first page, status=failed, queue=q1",
            PAGE,
            vec![
                Param::Int(i64::MAX),
                Param::Int(10_000),
                Param::Text("q1"),
                Param::NullText,
                Param::Texts(&["failed"]),
                Param::NullTime,
                Param::NullTime,
                Param::Int(50),
                Param::NullText,
                Param::NullText,
            ],
        ),
        (
            "instances: by key",
            PAGE_BY_KEY,
            vec![
                Param::Int(i64::MAX),
                Param::Text("order:500000"),
                Param::NullText,
                Param::NullText,
                Param::Texts(&[]),
                Param::NullTime,
                Param::NullTime,
                Param::Int(50),
                Param::NullText,
                Param::NullText,
            ],
        ),
        (
            "instances: one parent's children, error contains \"declined\"",
            PAGE_BY_PARENT,
            vec![
                Param::Int(i64::MAX),
                Param::Int(id),
                Param::NullText,
                Param::NullText,
                Param::Texts(&[]),
                Param::NullTime,
                Param::NullTime,
                Param::Int(50),
                Param::Text("%declined%"),
                Param::NullText,
            ],
        ),
        ("instances: queue and FSM names", NAMES, vec![]),
        (
            "instances: window end",
            WINDOW_END,
            vec![Param::Int(i64::MAX), Param::Int(10_000)],
        ),
        (
            "instance: inspect",
            admin::INSPECT,
            vec![Param::Int(id), Param::Int(100)],
        ),
        (
            "instance: tree",
            TREE,
            vec![Param::Int(id), Param::Int4(4), Param::Int(200)],
        ),
        (
            "fsms: versions in a sample",
            SAMPLE_BY_FSM,
            vec![Param::Float4(sample)],
        ),
        (
            "limits: gate keys in use (capped)",
            super::limits::USAGE_CAPPED,
            vec![cap, cap],
        ),
        (
            "limits: buckets (capped)",
            super::limits::BUCKETS_CAPPED,
            vec![Param::NullTime, cap],
        ),
    ]
}

/// A parameter of [`page_statements`].
#[derive(Debug, Clone, Copy)]
enum Param {
    NullText,
    NullTime,
    Int(i64),
    Int4(i32),
    Float4(f64),
    Float8(f64),
    Text(&'static str),
    /// An array of text (the list's statuses, the overview's queues).
    Texts(&'static [&'static str]),
    /// An array of smallint (the overview's lanes' priorities).
    Int2s(&'static [i16]),
    /// `now()` minus this many minutes.
    Time(i64),
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of every page statement, `id` standing for the instance
/// of the instance page: (name, plan). For docs/design/dashboard.md; runs each statement once.
pub(crate) async fn plans(pool: &sqlx::PgPool, id: i64) -> Result<Vec<(String, String)>> {
    use gen_durable::backend::counts;
    let sample = counts::sample_percent(counts::table_pages(pool).await?);
    let mut out = Vec::new();
    for (name, sql, params) in page_statements(id, sample) {
        let explain = format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {sql}");
        let mut q = sqlx::query_scalar::<_, String>(&explain);
        for p in params {
            q = match p {
                Param::NullText => q.bind(None::<String>),
                Param::NullTime => q.bind(None::<DateTime<Utc>>),
                Param::Int(n) => q.bind(n),
                Param::Int4(n) => q.bind(n),
                Param::Float4(p) => q.bind(p as f32),
                Param::Float8(p) => q.bind(p),
                Param::Text(s) => q.bind(s),
                Param::Texts(v) => q.bind(v.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
                Param::Int2s(v) => q.bind(v.to_vec()),
                Param::Time(m) => q.bind(Utc::now() - chrono::Duration::minutes(m)),
            };
        }
        let lines: Vec<String> = q.fetch_all(pool).await?;
        out.push((name.to_string(), lines.join("\n")));
    }
    Ok(out)
}
