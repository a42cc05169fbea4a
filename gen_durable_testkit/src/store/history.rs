//! The kit's `gd_history` (`gen_durable::store::pg::history`, and the entries the commit,
//! the reaper and the operator actions write beside their statements): every entry the
//! Postgres engine writes, on the virtual clock, read with the same paging.

use chrono::{DateTime, Utc};
use gen_durable::{Error, HistoryEntry, HistoryKind, HistoryPage, Result, HISTORY_PAGE_MAX};

use super::Store;

/// An entry's fields besides its id, instance, time, kind, step and attempt (all `None`
/// or empty by default).
#[derive(Debug, Default)]
pub(crate) struct Extra {
    pub(crate) started_at: Option<DateTime<Utc>>,
    pub(crate) next_step: Option<String>,
    pub(crate) node: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) signals: Vec<i64>,
    pub(crate) children: Option<i32>,
    pub(crate) state: Option<serde_json::Value>,
    /// An operator's action: recorded with the kit's actor.
    pub(crate) by_operator: bool,
    pub(crate) detail: Option<String>,
}

/// The actor of an operator's action when the kit was given none: it has no database role.
pub const KIT_ACTOR: &str = "testkit";

impl Store {
    /// Appends an entry for instance `id`.
    pub(crate) fn note(
        &mut self,
        id: i64,
        at: DateTime<Utc>,
        kind: HistoryKind,
        step: &str,
        attempt: i32,
        extra: Extra,
    ) {
        self.last_entry += 1;
        let actor = extra
            .by_operator
            .then(|| self.actor.clone().unwrap_or_else(|| KIT_ACTOR.to_string()));
        self.history.push((
            id,
            HistoryEntry {
                entry: self.last_entry,
                at,
                kind,
                step: step.to_string(),
                attempt,
                started_at: extra.started_at,
                next_step: extra.next_step,
                node: extra.node,
                error: extra.error,
                signals: extra.signals,
                children: extra.children,
                state: extra.state,
                actor,
                detail: extra.detail,
            },
        ));
    }

    /// PAGE: up to `limit` entries of `id` after `after`, oldest first; `NotFound` for an
    /// id with neither an entry there nor a row; `InvalidInput` for a limit outside 1 to
    /// [`HISTORY_PAGE_MAX`], as `Client::history` answers.
    pub(crate) fn history(&self, id: i64, after: Option<i64>, limit: usize) -> Result<HistoryPage> {
        if limit == 0 || limit > HISTORY_PAGE_MAX {
            return Err(Error::InvalidInput {
                what: "history page size",
                reason: format!("{limit} entries; a page holds 1 to {HISTORY_PAGE_MAX}"),
            });
        }
        let after = after.unwrap_or(0);
        let entries: Vec<HistoryEntry> = self
            .history
            .iter()
            .filter(|(i, e)| *i == id && e.entry > after)
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect();
        if entries.is_empty() && after == 0 && !self.rows.contains_key(&id) {
            return Err(Error::NotFound { id });
        }
        let next = (entries.len() == limit)
            .then(|| entries.last().map(|e| e.entry))
            .flatten();
        Ok(HistoryPage { entries, next })
    }

    /// SOURCE: entry `entry` of `id` — `UnknownEntry` if there is none, `NotFound` if
    /// the instance has neither it nor a row.
    pub(crate) fn entry(&self, id: i64, entry: i64) -> Result<HistoryEntry> {
        match self
            .history
            .iter()
            .find(|(i, e)| *i == id && e.entry == entry)
        {
            Some((_, e)) => Ok(e.clone()),
            None if self.rows.contains_key(&id) => Err(Error::UnknownEntry { id, entry }),
            None => Err(Error::NotFound { id }),
        }
    }
}
