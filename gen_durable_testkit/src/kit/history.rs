//! The kit's history, as `Client`'s: `history` (paged), `fork` and `restart_from` a past
//! step, the actor its operator actions are recorded as, and `assert_steps`.

use std::future::{ready, Ready};

use gen_durable::backend::{check_restart_step, fork_row, ForkOf};
use gen_durable::{Error, HistoryEntry, HistoryKind, HistoryPage, Result, HISTORY_PAGE_MAX};
use serde_json::Value;

use super::TestKit;
use crate::store::history::Extra;

/// The state entry `entry` of `id` began its step with, or why there is none.
fn state_of(id: i64, e: &HistoryEntry) -> Result<Value> {
    e.state.clone().ok_or(Error::EntryWithoutState {
        id,
        entry: e.entry,
        kind: e.kind,
    })
}

impl TestKit {
    /// Records this kit's operator actions (cancel, retry, restart, fork, an instance
    /// migration) as done by `actor`, like `Client::with_actor`; without it, by
    /// [`KIT_ACTOR`](crate::KIT_ACTOR) (the kit has no database role).
    pub fn with_actor(mut self, actor: impl Into<String>) -> Self {
        self.store.actor = Some(actor.into());
        self
    }

    /// A page of instance `id`'s history, like `Client::history`: up to `limit` (1 to
    /// [`HISTORY_PAGE_MAX`]) entries after entry `after`, oldest first. The kit writes the
    /// entries the Postgres engine writes, on its virtual clock: its steps take no time,
    /// so a step's entry starts when it commits, and its node is
    /// [`KIT_NODE`](crate::KIT_NODE).
    pub fn history(&self, id: i64, after: Option<i64>, limit: usize) -> Ready<Result<HistoryPage>> {
        ready(self.store.history(id, after, limit))
    }

    /// Every entry of instance `id`'s history, oldest first (empty for an unknown id).
    pub fn entries(&self, id: i64) -> Vec<HistoryEntry> {
        let mut all = Vec::new();
        let mut after = None;
        while let Ok(page) = self.store.history(id, after, HISTORY_PAGE_MAX) {
            all.extend(page.entries);
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        all
    }

    /// Panics unless the steps instance `id` committed an outcome in, in order, are
    /// `steps`: each entry of a step's outcome counts, except a retry (the step runs again
    /// and its next outcome counts). Lost leases and operators' actions are not steps.
    /// Needs a history level other than `off`.
    #[track_caller]
    pub fn assert_steps<I, S>(&self, id: i64, steps: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        use HistoryKind::*;
        let got: Vec<String> = self
            .entries(id)
            .into_iter()
            .filter(|e| matches!(e.kind, Next | Await | Children | Done | Failed | Cancelled))
            .filter(|e| e.kind != Cancelled || e.actor.is_none())
            .map(|e| e.step)
            .collect();
        let want: Vec<String> = steps.into_iter().map(|s| s.as_ref().to_string()).collect();
        assert_eq!(got, want, "the steps instance {id} committed");
    }

    /// Starts a new instance from a past step of instance `id`, like `Client::fork`: at
    /// the step entry `entry` ran, with the state that step began with (`history =
    /// "full"`), on the instance's FSM version, queue, priority and concurrency key; its
    /// history begins with a `forked` entry. The same refusals, with nothing written.
    pub fn fork(&mut self, id: i64, entry: i64) -> Ready<Result<i64>> {
        ready(self.fork_now(id, entry))
    }

    fn fork_now(&mut self, id: i64, entry: i64) -> Result<i64> {
        let now = self.now();
        let e = self.store.entry(id, entry)?;
        let state = state_of(id, &e)?;
        let row = self.store.row(id).ok_or(Error::NotFound { id })?;
        let of = ForkOf {
            fsm: &row.fsm,
            version: row.version,
            queue: &row.queue,
            priority: row.priority,
            partition_key: row.partition_key.as_deref(),
            gate: row.gate.as_deref(),
        };
        let new = fork_row(&self.registry, of, &e.step, state)?;
        let fork = self.insert_one(new)?;
        self.store.note(
            fork,
            now,
            HistoryKind::Forked,
            &e.step,
            1,
            Extra {
                by_operator: true,
                detail: Some(format!("from instance {id} at entry {entry}")),
                ..Extra::default()
            },
        );
        Ok(fork)
    }

    /// Restarts instance `id` from a past step, like `Client::restart_from`: as
    /// [`TestKit::restart`] at the step entry `entry` ran, in the state that step began
    /// with. The same refusals, with nothing written.
    pub fn restart_from(&mut self, id: i64, entry: i64) -> Ready<Result<()>> {
        let now = self.now();
        let checked = self.store.entry(id, entry).and_then(|e| {
            let state = state_of(id, &e)?;
            let row = self.store.row(id).ok_or(Error::NotFound { id })?;
            check_restart_step(&self.registry, &row.fsm, row.version, &e.step, None)?;
            if let Some(known) = self.registry.get(&row.fsm, row.version) {
                known.check_state(&state)?;
            }
            Ok((e.step, state))
        });
        ready(checked.and_then(|(step, state)| {
            self.store
                .restart(id, &step, Some((entry, &state)), now)
                .answer(id)
        }))
    }
}
