//! What `Client::wait` reads: one row, a key's instance, and the probe over every id a
//! client's callers wait on.

use sqlx::PgExecutor;

use crate::error::Result;
use crate::wait::WaitRow;
use crate::Status;

/// The columns a wait answers from.
pub(super) const READ: &str = r#"/* gd:wait */
SELECT id, status::text AS status, step, attempt, result, last_error, awaits, children_pending
  FROM gd_instances WHERE id = $1
"#;

/// A key's instance for a wait: its holder (through the guard's unique index), else the
/// newest row inserted with it — the holder that finished and freed it. The fallback
/// scans `unique_key`, which has no index of its own: it runs only for a key no live
/// instance holds.
pub(super) const ID_BY_KEY: &str = r#"/* gd:wait */
SELECT coalesce(
    (SELECT id FROM gd_instances WHERE unique_guard = $1),
    (SELECT max(id) FROM gd_instances WHERE unique_key = $1))
"#;

/// One tick of a client's probe: the status of every id waited on (a missing id is gone).
pub(super) const PROBE: &str = r#"/* gd:wait */
SELECT id, status::text FROM gd_instances WHERE id = ANY ($1)
"#;

pub(crate) async fn read<'e>(db: impl PgExecutor<'e>, id: i64) -> Result<Option<WaitRow>> {
    Ok(sqlx::query_as(READ).bind(id).fetch_optional(db).await?)
}

pub(crate) async fn id_by_key<'e>(db: impl PgExecutor<'e>, key: &str) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(ID_BY_KEY)
        .bind(key)
        .fetch_one(db)
        .await?)
}

pub(crate) async fn probe<'e>(db: impl PgExecutor<'e>, ids: &[i64]) -> Result<Vec<(i64, Status)>> {
    Ok(sqlx::query_as(PROBE).bind(ids).fetch_all(db).await?)
}
