//! The dashboard's `/limits` statements: the library's gate usage and rate-limit buckets
//! (`Client::gates`, `Client::rate_limits`, exact and on demand) at a bounded cost.

use chrono::{DateTime, Utc};
use gen_durable::Result;
use sqlx::PgExecutor;

/// The library's gate `USAGE` (`Client::gates`) at a bounded cost, for the dashboard's
/// `/limits`: `USAGE` reads every runnable gated row to count the waiting ones, and no
/// index gives them (the pick index has neither the gate nor the key), so on a large
/// backlog it scans the table. Here:
///
/// - `running`: at most `$1` executing gated rows in all, an index-only range of the gate
///   index `gd_instances_gate_executing (gate, partition_key, gate_slot) WHERE status =
///   'executing' AND gate IS NOT NULL` in (gate, key) order, stopped by the `LIMIT`. When
///   the range was cut (`cut`: the last (gate, key) read), counts are exact before it;
///   that key and every key after it are lower bounds (`running_capped`), and a gate at
///   or after it may have keys not listed (`keys_cut`).
/// - `waiting`: the gated rows among the first `$2` runnable rows with a key, a gate or a
///   limit in pick order (the pick index `gd_instances_pick`, whose predicate the
///   condition repeats so that the planner can use it, stopped by the `LIMIT`: the rows
///   the next picks of the index would reach first, read from the heap for their gate and
///   key; plain rows wait on the log and are never gated). Exact when fewer than `$2` rows are runnable in
///   all; lower bounds otherwise (`waiting_capped`), and a key whose waiting rows all lie
///   past the window shows none.
///
/// Its cost is `$1` index entries and `$2` runnable rows at most, whatever the table
/// holds. The caps are global rather than per gate (a `LATERAL` per gate) on purpose:
/// the planner guesses about a thousand rows for a small table autovacuum never analyzed
/// (`gd_gates` is rarely written), and that guess times a per-name cap crossed
/// `jit_above_cost`, so every load paid milliseconds of JIT compilation.
/// `Client::gates` and `gen_durable status` keep `USAGE`: exact, on demand.
pub(crate) const USAGE_CAPPED: &str = r#"/* gd:gate */
WITH read AS MATERIALIZED (
    SELECT gate, partition_key AS key FROM gd_instances
     WHERE status = 'executing' AND gate IS NOT NULL
     ORDER BY gate, partition_key, gate_slot
     LIMIT $1
), running AS (
    SELECT gate, key, count(*) AS running FROM read GROUP BY gate, key
), cut AS (
    SELECT gate, key FROM read
     WHERE (SELECT count(*) FROM read) >= $1
     ORDER BY gate DESC, key DESC
     LIMIT 1
), seen AS MATERIALIZED (
    SELECT i.gate, i.partition_key AS key FROM gd_instances i
     WHERE i.status = 'runnable'
       AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
     ORDER BY i.queue, i.priority, i.eligible_at, i.id
     LIMIT $2
), waiting AS (
    SELECT gate, key, count(*) AS waiting FROM seen WHERE gate IS NOT NULL GROUP BY gate, key
)
SELECT g.name, g.size, k.key, coalesce(k.running, 0) AS running,
       coalesce(k.waiting, 0) AS waiting,
       coalesce(g.name > c.gate OR (g.name = c.gate AND k.key >= c.key), false)
           AS running_capped,
       coalesce(g.name >= c.gate, false) AS keys_cut,
       (SELECT count(*) >= $2 FROM seen) AS waiting_capped
  FROM gd_gates g
  LEFT JOIN (SELECT * FROM running FULL JOIN waiting USING (gate, key)) k ON k.gate = g.name
  LEFT JOIN cut c ON true
 ORDER BY g.name, k.running DESC NULLS LAST, k.key
"#;

/// One gate key's use as [`USAGE_CAPPED`] counts it: `running_capped` and
/// `waiting_capped` say which counts are lower bounds, `keys_cut` that the gate may have
/// keys running that were not read.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct CappedUsageRow {
    pub(crate) name: String,
    pub(crate) size: i32,
    pub(crate) key: Option<String>,
    pub(crate) running: i64,
    pub(crate) waiting: i64,
    pub(crate) running_capped: bool,
    pub(crate) keys_cut: bool,
    pub(crate) waiting_capped: bool,
}

/// Every declared gate with its keys in use, reading at most `running_cap` executing gated
/// rows and `runnable_cap` runnable rows (see [`USAGE_CAPPED`]).
pub(crate) async fn usage_capped<'e>(
    db: impl PgExecutor<'e>,
    running_cap: i64,
    runnable_cap: i64,
) -> Result<Vec<CappedUsageRow>> {
    Ok(sqlx::query_as(USAGE_CAPPED)
        .bind(running_cap)
        .bind(runnable_cap)
        .fetch_all(db)
        .await?)
}

/// The library's `BUCKETS` (`Client::rate_limits`) with at most `$2` buckets in all, for
/// the dashboard's `/limits`: a range of the primary key `gd_buckets (name, key)` in
/// (limit, key) order, stopped by the `LIMIT`, joined to the limits. `gd_buckets` holds the keys in use (the collector deletes full
/// ones), but a limit keyed by tenant can have many. When the range was cut, `cut` marks
/// the limit of the last bucket read and the limits after it: they may have buckets not
/// shown. A global cap rather than one per limit, for the reason [`USAGE_CAPPED`]
/// gives (the planner's guess of a small table's rows times a per-limit cap brought JIT
/// compilation to every load).
pub(crate) const BUCKETS_CAPPED: &str = r#"/* gd:rate_limit */
WITH b AS MATERIALIZED (
    SELECT name, key, tokens, held, at FROM gd_buckets ORDER BY name, key LIMIT $2
), cut AS (
    SELECT name FROM b
     WHERE (SELECT count(*) FROM b) >= $2
     ORDER BY name DESC, key DESC
     LIMIT 1
)
SELECT l.name, l.per_second, l.burst, b.key,
       least(l.burst - b.held,
             b.tokens + extract(epoch FROM coalesce($1, now()) - b.at) * l.per_second) AS tokens,
       coalesce(l.name >= c.name, false) AS cut
  FROM gd_rate_limits l
  LEFT JOIN b ON b.name = l.name
  LEFT JOIN cut c ON true
 ORDER BY l.name, b.key
"#;

/// One bucket as [`BUCKETS_CAPPED`] reads it (see [`gen_durable::BucketUse`]); `cut`: the
/// limit may have buckets past the ones read.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct CappedBucketRow {
    pub(crate) name: String,
    pub(crate) per_second: f64,
    pub(crate) burst: f64,
    pub(crate) key: Option<String>,
    pub(crate) tokens: Option<f64>,
    pub(crate) cut: bool,
}

/// Every declared limit with its buckets, at most `cap` buckets in all, in (limit, key)
/// order (see [`BUCKETS_CAPPED`]).
pub(crate) async fn buckets_capped<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
    cap: i64,
) -> Result<Vec<CappedBucketRow>> {
    Ok(sqlx::query_as(BUCKETS_CAPPED)
        .bind(now)
        .bind(cap)
        .fetch_all(db)
        .await?)
}
