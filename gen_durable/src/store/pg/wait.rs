//! What `Client::wait` reads: one row, a key's instance, and the probe over every id a
//! client's callers wait on.

use sqlx::PgExecutor;

use crate::model::error::Result;
use crate::model::rows::WaitRow;
use crate::Status;

/// The columns a wait answers from.
pub(super) const READ: &str = r#"/* gd:wait */
SELECT id, status::text AS status, step, attempt, result, last_error, awaits, children_pending
  FROM gd_instances WHERE id = $1
"#;

/// A key's instance for a wait: its holder (through the guard's unique index), else the
/// newest row inserted with it — the holder that finished and freed it (through
/// `gd_instances_key`, migration 0007).
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

/// The id of the instance holding correlation key `key`, if any.
pub async fn id_by_key<'e>(db: impl PgExecutor<'e>, key: &str) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(ID_BY_KEY)
        .bind(key)
        .fetch_one(db)
        .await?)
}

pub(crate) async fn probe<'e>(db: impl PgExecutor<'e>, ids: &[i64]) -> Result<Vec<(i64, Status)>> {
    Ok(sqlx::query_as(PROBE).bind(ids).fetch_all(db).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both lookups of `ID_BY_KEY` go through an index, whatever the table's size: with
    /// sequential scans priced out, a plan still shows one only where no index serves.
    #[tokio::test]
    async fn a_key_is_found_through_an_index_held_or_finished() {
        let db = gen_durable_testkit::TestDb::new().await;
        let mut conn = db.pool().acquire().await.unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status,
                                       unique_key, unique_scope)
             SELECT 'F', 1, 's', '{}', 'q', 'done', 'k' || g,
                    '{runnable,executing,awaiting_signal,awaiting_children}'
               FROM generate_series(1, 2000) g",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        sqlx::query("ANALYZE gd_instances")
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<String> =
            sqlx::query_scalar(&format!("EXPLAIN {}", ID_BY_KEY.replace("$1", "'k7'")))
                .fetch_all(&mut *conn)
                .await
                .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{plan}");
        assert!(plan.contains("gd_instances_key"), "{plan}");
        assert_eq!(id_by_key(&mut *conn, "k7").await.unwrap(), Some(7));
    }
}
