//! Inserting into the kit: `insert`, `insert_all`, `insert_json` and the type-erased
//! `insert_rows` they reduce to, refused as the database refuses a row naming an
//! undeclared gate or rate limit.

use std::future::{ready, Ready};

use gen_durable::backend::NewInstance;
use gen_durable::{Entry, Fsm, Result};
use serde_json::Value;

use super::TestKit;
use crate::builders::{KitInsert, KitInsertJson};

impl TestKit {
    /// Starts an insert of one instance of `F` (registering `F` if needed). Set options,
    /// then `.await` it: `Ok(id)` or [`Error::Duplicate`](gen_durable::Error::Duplicate).
    pub fn insert<F: Fsm>(&mut self, state: F::State) -> KitInsert<'_, F> {
        KitInsert::new(self, state)
    }

    /// Inserts many instances of `F` at once, each a [`gen_durable::Entry`] as for
    /// `Client::insert_all`; rows whose unique key is occupied (by a stored row or an
    /// earlier entry) are dropped. Returns the inserted ids, ascending.
    pub fn insert_all<F: Fsm>(
        &mut self,
        entries: impl IntoIterator<Item = Entry<F>>,
    ) -> Ready<Result<Vec<i64>>> {
        self.register_fsm::<F>();
        let rows = entries
            .into_iter()
            .map(Entry::into_new_instance)
            .collect::<Result<Vec<_>>>()
            .and_then(|rows| self.check_gates(&rows).map(|()| rows));
        ready(rows.map(|rows| self.insert_rows(rows)))
    }

    /// Starts an insert by FSM name and version, checked against the registry like
    /// `Client::insert_json`. Set options, then `.await` it.
    pub fn insert_json(
        &mut self,
        fsm: impl Into<String>,
        version: i32,
        state: Value,
    ) -> KitInsertJson<'_> {
        KitInsertJson::new(self, fsm.into(), version, state)
    }

    /// Inserts rows already type-erased (what `insert`, `insert_all` and
    /// `schedule_children` reduce to). Duplicates are dropped; returns the inserted ids.
    pub fn insert_rows(&mut self, rows: Vec<NewInstance>) -> Vec<i64> {
        let now = self.now();
        let rows = rows.into_iter().map(|r| (r, None)).collect();
        self.store
            .insert(rows, now)
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// `Error::UnknownGate` / `UnknownRateLimit` for the first row naming an undeclared
    /// gate or limit, as the foreign keys refuse it, or a weight above the burst, as the
    /// row's check does: nothing is written.
    fn check_gates(&self, rows: &[NewInstance]) -> Result<()> {
        match rows.iter().find_map(|r| self.store.refusal_of(r)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) fn insert_one(&mut self, row: NewInstance) -> Result<i64> {
        self.check_gates(std::slice::from_ref(&row))?;
        let key = row.unique_key.clone();
        let id = self.insert_rows(vec![row]).first().copied();
        gen_durable::backend::inserted(id, key.as_deref())
    }
}
