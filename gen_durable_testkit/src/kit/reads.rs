//! What a test reads of the kit: a wait's answer, an explanation, the events emitted, the
//! snapshots of instances and the assertions on them.

use std::future::{ready, Ready};

use gen_durable::backend::ExplainFacts;
use gen_durable::{Error, Event, Explanation, OutcomeKind, Result, Settled, Status, Target};
use serde_json::Value;

use super::TestKit;
use crate::builders::KitWait;
use crate::instance::Instance;

impl TestKit {
    /// Starts a wait for an instance, named by id or by key, as `Client::wait` does; `.await`
    /// it. The kit answers at once from the in-memory row — no step runs meanwhile — so
    /// where the client would wait, the kit answers `Settled::Busy`.
    pub fn wait(&self, to: impl Into<Target>) -> KitWait<'_> {
        KitWait::new(self, to.into())
    }

    /// The answer of a wait on `to` now.
    pub(crate) fn wait_now(&self, to: &Target, until_terminal: bool) -> Result<Settled> {
        gen_durable::backend::check_target(to)?;
        let id = match to {
            Target::Id(id) => *id,
            Target::Key(key) => self
                .store
                .resolve(to)
                .or_else(|| self.store.newest_with_key(key))
                .ok_or_else(|| Error::KeyNotFound { key: key.clone() })?,
        };
        Ok(match self.store.row(id) {
            None => Settled::Gone,
            Some(row) => {
                let row = row.wait_row();
                row.settled(until_terminal).unwrap_or_else(|| row.busy())
            }
        })
    }

    /// Why `to` (an id or a [`Key`](gen_durable::Key)) is not running, or what it is
    /// doing, as `Client::explain` answers — from the same facts, decided by the same
    /// code (`gen_durable::backend::ExplainFacts`), with the same bounds. The kit knows every
    /// reason but the nodes' (it runs every FSM it knows), so it never answers
    /// [`Reason::NoNodeForQueue`](gen_durable::Reason::NoNodeForQueue) or
    /// [`Reason::NoNodeForVersion`](gen_durable::Reason::NoNodeForVersion). A row is
    /// executing only between [`TestKit::claim`] and [`TestKit::lose_lease`]. `NotFound`
    /// for an unknown id, `KeyNotFound` for a key no instance ever had.
    pub fn explain(&self, to: impl Into<Target>) -> Ready<Result<Explanation>> {
        let to = to.into();
        ready(self.explain_now(&to))
    }

    fn explain_now(&self, to: &Target) -> Result<Explanation> {
        gen_durable::backend::check_target(to)?;
        let id = match to {
            Target::Id(id) => *id,
            Target::Key(key) => self
                .store
                .resolve(to)
                .or_else(|| self.store.newest_with_key(key))
                .ok_or_else(|| Error::KeyNotFound { key: key.clone() })?,
        };
        self.store
            .explain_facts(id, self.now())
            .map(ExplainFacts::explain)
            .ok_or(Error::NotFound { id })
    }

    /// The telemetry events the kit emitted, in order: `step.stop` with the committed
    /// kind for every step, `schedule.fired` / `schedule.skipped`, and `migration.applied`
    /// / `migration.failed` for each claimed row it migrated or failed to.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The kinds committed for instance `id`, in order, from the `step.stop` events.
    pub fn kinds(&self, id: i64) -> Vec<OutcomeKind> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::StepStop { id: i, kind, .. } if *i == id => Some(*kind),
                _ => None,
            })
            .collect()
    }

    /// A snapshot of instance `id`: row, inbox and children. Panics if there is none.
    #[track_caller]
    pub fn instance(&self, id: i64) -> Instance {
        self.get(id).unwrap_or_else(|| {
            panic!(
                "no instance {id} in this TestKit (ids: {:?})",
                self.store.ids().collect::<Vec<_>>()
            )
        })
    }

    /// A snapshot of the instance `key` names: its holder, or once none holds it, the
    /// newest instance inserted with it (so a finished instance can still be asserted on
    /// by key). Panics if no instance ever had the key.
    #[track_caller]
    pub fn instance_by_key(&self, key: &str) -> Instance {
        let id = self
            .store
            .resolve(&Target::Key(key.to_string()))
            .or_else(|| self.store.newest_with_key(key))
            .unwrap_or_else(|| panic!("no instance in this TestKit has the key {key:?}"));
        self.instance(id)
    }

    /// A snapshot of instance `id`, if it exists.
    pub fn get(&self, id: i64) -> Option<Instance> {
        self.store.snapshot(id)
    }

    /// Snapshots of every instance, by id.
    pub fn instances(&self) -> Vec<Instance> {
        self.store
            .ids()
            .filter_map(|id| self.store.snapshot(id))
            .collect()
    }

    /// A snapshot of the instance `to` names: by id, or by key as [`TestKit::instance_by_key`].
    /// Panics if there is none.
    #[track_caller]
    pub fn instance_of(&self, to: impl Into<Target>) -> Instance {
        match to.into() {
            Target::Id(id) => self.instance(id),
            Target::Key(key) => self.instance_by_key(&key),
        }
    }

    /// Panics unless `to` (an id or a [`Key`](gen_durable::Key)) is `done` with exactly
    /// `result`; the message shows its status, step and last error.
    #[track_caller]
    pub fn assert_done(&self, to: impl Into<Target>, result: impl Into<Value>) -> Instance {
        let i = self.instance_of(to);
        i.assert_done(result);
        i
    }

    /// Panics unless `to` is `failed` with a `last_error` containing `message`.
    #[track_caller]
    pub fn assert_failed(&self, to: impl Into<Target>, message: &str) -> Instance {
        let i = self.instance_of(to);
        i.assert_failed(message);
        i
    }

    /// Panics unless `to` is parked in `awaiting_signal` on exactly `names`.
    #[track_caller]
    pub fn assert_awaiting<I, S>(&self, to: impl Into<Target>, names: I) -> Instance
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let i = self.instance_of(to);
        i.assert_awaiting(names);
        i
    }

    /// Panics unless `to` is at step `step`.
    #[track_caller]
    pub fn assert_step(&self, to: impl Into<Target>, step: &str) -> Instance {
        let i = self.instance_of(to);
        i.assert_step(step);
        i
    }

    /// Panics unless `to` is in `status`.
    #[track_caller]
    pub fn assert_status(&self, to: impl Into<Target>, status: Status) -> Instance {
        let i = self.instance_of(to);
        i.assert_status(status);
        i
    }
}
