//! The kit's CLAIM (`gen_durable::store::pg::claim`): the pick, one row at a time, in the
//! engine's order; a row claimed by a simulated worker that keeps it; the due rows no FSM
//! the kit knows can run. Admission against a gate is in `gate.rs`, against a rate limit
//! in `rate_limit.rs`.

use chrono::{DateTime, Utc};
use gen_durable::{Registry, Status};

use super::{Row, Store};

/// Whether the kit claims rows of `(fsm, version)`: the pick's filter of the engine
/// (`Registry::name_version_arrays`), i.e. a registered version, or one whose migration
/// chain ends at a registered version (moved there when claimed).
fn runs(registry: &Registry, fsm: &str, version: i32) -> bool {
    registry.get(fsm, version).is_some() || registry.upgrade_path(fsm, version).is_some()
}

impl Store {
    /// CLAIM, one row at a time: the first runnable, eligible row of a queue that is not
    /// paused, of an `(fsm, version)` this kit runs or migrates (see `runs`), by
    /// `(priority, eligible_at, id)`, whose partition has no executing row.
    pub(crate) fn pick(&self, now: DateTime<Utc>, registry: &Registry) -> Option<i64> {
        self.rows
            .values()
            .filter(|r| r.status == Status::Runnable && r.eligible_at <= now)
            .filter(|r| !self.paused.contains_key(&r.queue))
            .filter(|r| runs(registry, &r.fsm, r.version))
            .filter(|r| self.admits(r))
            .min_by_key(|r| (r.priority, r.eligible_at, r.id))
            .map(|r| r.id)
    }

    /// Runnable, eligible rows no registered FSM can run, nor any migration move: the
    /// kit reports them rather than waiting on them forever.
    pub(crate) fn unrunnable(&self, now: DateTime<Utc>, registry: &Registry) -> Vec<&Row> {
        self.rows
            .values()
            .filter(|r| r.status == Status::Runnable && r.eligible_at <= now)
            .filter(|r| !runs(registry, &r.fsm, r.version))
            .collect()
    }

    /// CLAIM of one row by a worker that keeps it: runnable, due row `id` becomes
    /// `executing` (its partition key held) until `lose_lease` gives it back. False
    /// unless it was runnable and due.
    pub(crate) fn claim(&mut self, id: i64, now: DateTime<Utc>) -> bool {
        match self.rows.get_mut(&id) {
            Some(row) if row.status == Status::Runnable && row.eligible_at <= now => {
                row.status = Status::Executing;
                row.claimed_at = Some(now);
                row.updated_at = now;
                true
            }
            _ => false,
        }
    }
}
