//! Rate limits (`gd_rate_limits`, `gd_buckets` in `gen_durable/sql/schema.sql`): declaring
//! them and reading their buckets. The claim (`claim::CLAIM`) admits rows against them.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;
use crate::model::rate_limit::BucketUse;

/// Declares rate limits `$1` with rates `$2` (tokens per second) and bursts `$3`
/// (parallel arrays): new names are added, a changed one is updated (the last declaration
/// wins), an unchanged one is not written. In name order, so two nodes declaring the same
/// limits at once cannot deadlock.
const DECLARE: &str = r#"/* gd:rate_limit */
WITH input AS (
    SELECT name, per_second, burst
      FROM unnest($1::text[], $2::float8[], $3::float8[]) AS t(name, per_second, burst)
     ORDER BY name
), up AS (
    INSERT INTO gd_rate_limits AS l (name, per_second, burst, updated_at)
    SELECT name, per_second, burst, coalesce($4, now()) FROM input
    ON CONFLICT (name) DO UPDATE
       SET per_second = excluded.per_second, burst = excluded.burst,
           updated_at = excluded.updated_at
     WHERE l.per_second <> excluded.per_second OR l.burst <> excluded.burst
    RETURNING l.name
)
SELECT count(*) FROM up
"#;

/// Declares `limits` (name, tokens per second, burst); the number added or changed.
pub(crate) async fn declare<'e>(
    db: impl PgExecutor<'e>,
    limits: &[(String, f64, f64)],
    now: Option<DateTime<Utc>>,
) -> Result<i64> {
    let names: Vec<&str> = limits.iter().map(|l| l.0.as_str()).collect();
    let rates: Vec<f64> = limits.iter().map(|l| l.1).collect();
    let bursts: Vec<f64> = limits.iter().map(|l| l.2).collect();
    Ok(sqlx::query_scalar(DECLARE)
        .bind(names)
        .bind(rates)
        .bind(bursts)
        .bind(now)
        .fetch_one(db)
        .await?)
}

/// Every declared limit with its buckets, tokens refilled to `$1` as an admission would
/// see them (without writing).
const BUCKETS: &str = r#"/* gd:rate_limit */
SELECT l.name, l.per_second, l.burst, b.key,
       least(l.burst - b.held,
             b.tokens + extract(epoch FROM coalesce($1, now()) - b.at) * l.per_second) AS tokens
  FROM gd_rate_limits l
  LEFT JOIN gd_buckets b ON b.name = l.name
 ORDER BY l.name, b.key
"#;

/// Every declared limit with its buckets (`BUCKETS`).
pub async fn buckets<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<BucketUse>> {
    Ok(sqlx::query_as(BUCKETS).bind(now).fetch_all(db).await?)
}

/// Deletes up to `$1` buckets that are full again: nothing reserved (`held`, migration
/// 0031), and idle long enough to have refilled. A missing bucket is a full one to the
/// claim (it mints it full), so this changes no admission; it keeps `gd_buckets` to the
/// keys in use. Buckets a claim holds are skipped.
const SWEEP: &str = r#"/* gd:rate_limit */
WITH idle AS MATERIALIZED (
    SELECT b.name, b.key
      FROM gd_buckets b
      JOIN gd_rate_limits l ON l.name = b.name
     WHERE b.held = 0
       AND b.tokens + extract(epoch FROM coalesce($2, now()) - b.at) * l.per_second >= l.burst
     LIMIT $1
       FOR UPDATE OF b SKIP LOCKED
)
DELETE FROM gd_buckets b USING idle i WHERE b.name = i.name AND b.key = i.key
"#;

/// Recounts what up to `$1` buckets hold for their reserved rows (`gd_recount_held`,
/// migration 0031): a write that missed `held` (a cancel by a node of an earlier version)
/// is corrected at the collector's next pass.
const RECOUNT: &str = "/* gd:rate_limit */ SELECT gd_recount_held($1)";

/// Recounts up to `limit` buckets' reservations; how many were corrected.
pub(crate) async fn recount<'e>(db: impl PgExecutor<'e>, limit: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(RECOUNT)
        .bind(limit)
        .fetch_one(db)
        .await?)
}

/// Deletes up to `limit` idle buckets; how many.
pub(crate) async fn sweep<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<u64> {
    Ok(sqlx::query(SWEEP)
        .bind(limit)
        .bind(now)
        .execute(db)
        .await?
        .rows_affected())
}
