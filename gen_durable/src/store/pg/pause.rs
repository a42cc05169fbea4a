//! Queues paused cluster-wide by an operator (`gd_queue_pauses` in `gen_durable/sql/schema.sql`).
//! The pick (`claim::CLAIM`) skips a paused queue; these statements pause, resume and list.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;
use crate::model::rows::QueuePause;

/// Pauses queue `$1`. A queue already paused keeps its first `paused_at` and reason (a
/// pause is idempotent, and the first operator's reason is the one that explains it);
/// the row comes back only when this statement inserted it.
const PAUSE: &str = r#"/* gd:pause */
INSERT INTO gd_queue_pauses (queue, paused_at, reason)
VALUES ($1, coalesce($3, now()), $2)
ON CONFLICT (queue) DO NOTHING
RETURNING queue
"#;

/// Resumes queue `$1`, and wakes its pickers in the same transaction (delivered at
/// commit): a node polling with a backed-off interval picks at once. Nothing is sent when
/// the queue was not paused.
const RESUME: &str = r#"/* gd:pause */
WITH gone AS (
    DELETE FROM gd_queue_pauses WHERE queue = $1 RETURNING queue
)
SELECT count(pg_notify('gd_wake', queue)) FROM gone
"#;

/// Every paused queue, by name (a small table: one row per paused queue).
const PAUSED: &str = r#"/* gd:pause */
SELECT queue, paused_at, reason FROM gd_queue_pauses ORDER BY queue
"#;

/// Pauses `queue`; true if it was not paused yet.
pub(crate) async fn pause<'e>(
    db: impl PgExecutor<'e>,
    queue: &str,
    reason: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<bool> {
    let row: Option<String> = sqlx::query_scalar(PAUSE)
        .bind(queue)
        .bind(reason)
        .bind(now)
        .fetch_optional(db)
        .await?;
    Ok(row.is_some())
}

/// Resumes `queue`; true if it was paused.
pub(crate) async fn resume<'e>(db: impl PgExecutor<'e>, queue: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar(RESUME).bind(queue).fetch_one(db).await?;
    Ok(n > 0)
}

/// The paused queues, by name.
pub async fn paused<'e>(db: impl PgExecutor<'e>) -> Result<Vec<QueuePause>> {
    Ok(sqlx::query_as(PAUSED).fetch_all(db).await?)
}
