//! What a wait reads (`gen_durable::store::pg::wait`): a row as a wait sees it, the row
//! a target names, and the newest row inserted with a key.

use gen_durable::backend::WaitRow;
use gen_durable::Target;

use super::{Row, Store};

impl Row {
    /// What a wait reads of the row.
    pub(crate) fn wait_row(&self) -> WaitRow {
        WaitRow {
            id: self.id,
            status: self.status,
            step: self.step.clone(),
            attempt: self.attempt,
            result: self.result.clone(),
            last_error: self.last_error.clone(),
            awaits: self.awaits.clone(),
            children_pending: self.children_pending,
        }
    }
}

impl Store {
    /// The row a target names: the id, if stored; for a key, the one row holding it
    /// (its guard: the key while the status is in the key's scope).
    pub(crate) fn resolve(&self, to: &Target) -> Option<i64> {
        match to {
            Target::Id(id) => self.rows.contains_key(id).then_some(*id),
            Target::Key(key) => self
                .rows
                .values()
                .find(|r| r.guard() == Some(key.as_str()))
                .map(|r| r.id),
        }
    }

    /// The newest row inserted with correlation key `key`, whatever its status.
    pub(crate) fn newest_with_key(&self, key: &str) -> Option<i64> {
        self.rows
            .values()
            .rev()
            .find(|r| r.unique_key.as_deref() == Some(key))
            .map(|r| r.id)
    }
}
