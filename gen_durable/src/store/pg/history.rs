//! Reading an instance's history, and keeping its partitions (`gd_history`, sql/history.sql).
//! The entries themselves are written by the statements that commit what they record:
//! the group commit, the reapers and the release.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::{Error, Result};
use crate::model::history::{HistoryEntry, HistoryPage};
use crate::store::pg::millis;

/// A page of instance `$1`'s entries after entry `$2`, oldest first: one probe of
/// `gd_history_instance` per partition.
const PAGE: &str = r#"/* gd:history */
SELECT h.entry, h.at, h.kind, h.step, h.attempt, h.started_at, h.next_step, h.node, h.error,
       coalesce(h.signals, '{}') AS signals, h.children, h.state, h.actor, h.detail
  FROM gd_history h
 WHERE h.instance_id = $1 AND h.entry > $2
 ORDER BY h.entry
 LIMIT $3
"#;

/// Whether instance `$1` exists, for a history with no entry (entries outlive their
/// instance: a collected one still has them).
const EXISTS: &str = r#"/* gd:history */
SELECT EXISTS (SELECT 1 FROM gd_instances WHERE id = $1)
"#;

/// Keeps the history's day partitions (`gd_history_keep`): creates the next days', drops
/// those older than the retention.
const KEEP: &str = r#"/* gd:collect */
SELECT created, dropped FROM gd_history_keep(coalesce($1, now()), $2 * interval '1 millisecond')
"#;

#[derive(sqlx::FromRow)]
struct EntryRow {
    entry: i64,
    at: DateTime<Utc>,
    kind: String,
    step: String,
    attempt: i32,
    started_at: Option<DateTime<Utc>>,
    next_step: Option<String>,
    node: Option<String>,
    error: Option<String>,
    signals: Vec<i64>,
    children: Option<i32>,
    state: Option<serde_json::Value>,
    actor: Option<String>,
    detail: Option<String>,
}

impl EntryRow {
    fn entry(self) -> Result<HistoryEntry> {
        Ok(HistoryEntry {
            entry: self.entry,
            at: self.at,
            kind: self
                .kind
                .parse()
                .map_err(|e: String| sqlx::Error::Decode(e.into()))?,
            step: self.step,
            attempt: self.attempt,
            started_at: self.started_at,
            next_step: self.next_step,
            node: self.node,
            error: self.error,
            signals: self.signals,
            children: self.children,
            state: self.state,
            actor: self.actor,
            detail: self.detail,
        })
    }
}

/// Up to `limit` entries of instance `id` after entry `after` (0: from the first).
/// [`Error::NotFound`] when the instance has no entry there and does not exist.
pub(crate) async fn page<'e>(
    db: impl PgExecutor<'e> + Copy,
    id: i64,
    after: i64,
    limit: usize,
) -> Result<HistoryPage> {
    let rows: Vec<EntryRow> = sqlx::query_as(PAGE)
        .bind(id)
        .bind(after)
        .bind(limit as i64)
        .fetch_all(db)
        .await?;
    if rows.is_empty() {
        let live: bool = sqlx::query_scalar(EXISTS).bind(id).fetch_one(db).await?;
        if !live && after == 0 {
            return Err(Error::NotFound { id });
        }
    }
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|r| r.entry))
        .flatten();
    let entries = rows
        .into_iter()
        .map(EntryRow::entry)
        .collect::<Result<Vec<_>>>()?;
    Ok(HistoryPage { entries, next })
}

/// Keeps the partitions: returns how many it created and dropped.
pub(crate) async fn keep<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
    retention: Duration,
) -> Result<(i32, i32)> {
    Ok(sqlx::query_as(KEEP)
        .bind(now)
        .bind(millis(retention))
        .fetch_one(db)
        .await?)
}
