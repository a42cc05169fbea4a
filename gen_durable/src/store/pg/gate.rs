//! Concurrency gates (`gd_gates` in `gen_durable/sql/schema.sql`): declaring them and
//! reading their use. The claim (`claim::CLAIM`) enforces them.

use sqlx::PgExecutor;

use crate::error::Result;

/// Declares gates `$1` with limits `$2` (parallel arrays): new names are added, a changed
/// limit is updated (the last declaration wins), an unchanged one is not written. Rows
/// are written in name order, so two nodes declaring the same gates at once cannot
/// deadlock.
const DECLARE: &str = r#"/* gd:gate */
WITH input AS (
    SELECT name, size FROM unnest($1::text[], $2::int4[]) AS t(name, size) ORDER BY name
), up AS (
    INSERT INTO gd_gates AS g (name, size, updated_at)
    SELECT name, size, coalesce($3, now()) FROM input
    ON CONFLICT (name) DO UPDATE SET size = excluded.size, updated_at = excluded.updated_at
     WHERE g.size <> excluded.size
    RETURNING g.name
)
SELECT count(*) FROM up
"#;

/// Declares `gates` (name, limit); the number of rows added or changed.
pub(crate) async fn declare<'e>(
    db: impl PgExecutor<'e>,
    gates: &[(String, i32)],
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<i64> {
    let names: Vec<&str> = gates.iter().map(|(n, _)| n.as_str()).collect();
    let sizes: Vec<i32> = gates.iter().map(|(_, s)| *s).collect();
    Ok(sqlx::query_scalar(DECLARE)
        .bind(names)
        .bind(sizes)
        .bind(now)
        .fetch_one(db)
        .await?)
}

/// Every declared gate with its keys in use: per key, the executing rows and the
/// runnable ones waiting (through the gate index for the executing rows; the waiting
/// count reads the runnable gated rows, the operator's price for an exact figure).
const USAGE: &str = r#"/* gd:gate */
SELECT g.name, g.size, k.key, coalesce(k.running, 0) AS running, coalesce(k.waiting, 0) AS waiting
  FROM gd_gates g
  LEFT JOIN (
      SELECT gate, partition_key AS key,
             count(*) FILTER (WHERE status = 'executing') AS running,
             count(*) FILTER (WHERE status = 'runnable') AS waiting
        FROM gd_instances
       WHERE gate IS NOT NULL AND status IN ('executing', 'runnable')
       GROUP BY gate, partition_key
  ) k ON k.gate = g.name
 ORDER BY g.name, k.running DESC NULLS LAST, k.key
"#;

/// One gate key's use (or a gate with no key in use: `key` None).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct UsageRow {
    pub(crate) name: String,
    pub(crate) size: i32,
    pub(crate) key: Option<String>,
    pub(crate) running: i64,
    pub(crate) waiting: i64,
}

pub(crate) async fn usage<'e>(db: impl PgExecutor<'e>) -> Result<Vec<UsageRow>> {
    Ok(sqlx::query_as(USAGE).fetch_all(db).await?)
}

/// [`USAGE`] at a bounded cost, for the dashboard's `/limits`: [`USAGE`] reads every
/// runnable gated row to count the waiting ones, and no index gives them (the pick index
/// has neither the gate nor the key), so on a large backlog it scans the table. Here:
///
/// - `running`: at most `$1` executing gated rows in all, an index-only range of the gate
///   index `gd_instances_gate_executing (gate, partition_key, gate_slot) WHERE status =
///   'executing' AND gate IS NOT NULL` in (gate, key) order, stopped by the `LIMIT`. When
///   the range was cut (`cut`: the last (gate, key) read), counts are exact before it;
///   that key and every key after it are lower bounds (`running_capped`), and a gate at
///   or after it may have keys not listed (`keys_cut`).
/// - `waiting`: the gated rows among the first `$2` runnable rows in pick order (the pick
///   index, stopped by the `LIMIT`: the rows the next picks would reach first, read from
///   the heap for their gate and key). Exact when fewer than `$2` rows are runnable in
///   all; lower bounds otherwise (`waiting_capped`), and a key whose waiting rows all lie
///   past the window shows none.
///
/// Its cost is `$1` index entries and `$2` runnable rows at most, whatever the table
/// holds. The caps are global rather than per gate (a `LATERAL` per gate) on purpose:
/// the planner guesses about a thousand rows for a small table autovacuum never analyzed
/// (`gd_gates` is rarely written), and that guess times a per-name cap crossed
/// `jit_above_cost`, so every load paid milliseconds of JIT compilation.
/// `Client::gates` and `gen_durable status` keep [`USAGE`]: exact, on demand.
#[cfg(feature = "dashboard")]
pub(super) const USAGE_CAPPED: &str = r#"/* gd:gate */
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
#[cfg(feature = "dashboard")]
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
#[cfg(feature = "dashboard")]
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
