//! Concurrency gates (`gd_gates` in `gen_durable/sql/schema.sql`): declaring them and
//! reading their use. The claim (`claim::CLAIM`) enforces them.

use sqlx::PgExecutor;

use crate::model::error::Result;

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
pub struct UsageRow {
    /// The gate.
    pub name: String,
    /// Its limit.
    pub size: i32,
    /// The key, `None` for a gate with no key in use.
    pub key: Option<String>,
    /// Executing rows of the key.
    pub running: i64,
    /// Runnable rows of the key.
    pub waiting: i64,
}

/// Every declared gate with its keys in use (`USAGE`).
pub async fn usage<'e>(db: impl PgExecutor<'e>) -> Result<Vec<UsageRow>> {
    Ok(sqlx::query_as(USAGE).fetch_all(db).await?)
}
