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

/// What starting again from entry `$2` of instance `$1` needs: the entry's kind, step and
/// state, and the instance's FSM, version and where it runs (NULL if it is gone).
const SOURCE: &str = r#"/* gd:history */
SELECT h.kind, h.step, h.state, i.fsm, i.fsm_version, i.queue, i.priority, i.partition_key,
       i.gate
  FROM gd_history h
  LEFT JOIN gd_instances i ON i.id = h.instance_id
 WHERE h.instance_id = $1 AND h.entry = $2
"#;

/// A fork's first entry: where it came from (`$3`, `$4`), at its first step, by `$5` (else
/// the role).
const FORKED: &str = r#"/* gd:history */
INSERT INTO gd_history (instance_id, at, kind, step, attempt, actor, detail)
VALUES ($1, coalesce($6, now()), 'forked', $2, 1, coalesce($5::text, session_user),
        format('from instance %s at entry %s', $3, $4))
"#;

/// A history entry to start again from, with the instance it belongs to.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Source {
    kind: String,
    /// The step the entry's step ran.
    pub(crate) step: String,
    /// The state it began with (level `full`).
    pub(crate) state: Option<serde_json::Value>,
    /// The instance's FSM and version now, and where it runs; `None` if it is gone.
    pub(crate) fsm: Option<String>,
    pub(crate) fsm_version: Option<i32>,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i16>,
    pub(crate) partition_key: Option<String>,
    pub(crate) gate: Option<String>,
}

impl Source {
    /// What the entry records.
    pub(crate) fn kind(&self) -> Result<crate::HistoryKind> {
        self.kind
            .parse()
            .map_err(|e: String| sqlx::Error::Decode(e.into()).into())
    }
}

/// Entry `entry` of instance `id`: [`Error::UnknownEntry`] if there is none,
/// [`Error::NotFound`] if the instance has neither the entry nor a row.
pub(crate) async fn source<'e>(
    db: impl PgExecutor<'e> + Copy,
    id: i64,
    entry: i64,
) -> Result<Source> {
    let found: Option<Source> = sqlx::query_as(SOURCE)
        .bind(id)
        .bind(entry)
        .fetch_optional(db)
        .await?;
    match found {
        Some(s) => Ok(s),
        None => {
            let live: bool = sqlx::query_scalar(EXISTS).bind(id).fetch_one(db).await?;
            Err(if live {
                Error::UnknownEntry { id, entry }
            } else {
                Error::NotFound { id }
            })
        }
    }
}

/// Records that instance `fork` started at `step` as a fork of entry `entry` of
/// instance `origin`, by `actor`.
pub(crate) async fn forked<'e>(
    db: impl PgExecutor<'e>,
    fork: i64,
    step: &str,
    (origin, entry): (i64, i64),
    actor: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<()> {
    sqlx::query(FORKED)
        .bind(fork)
        .bind(step)
        .bind(origin)
        .bind(entry)
        .bind(actor)
        .bind(now)
        .execute(db)
        .await?;
    Ok(())
}

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
