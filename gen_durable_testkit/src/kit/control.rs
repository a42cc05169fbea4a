//! The operator actions on the kit's instances, as `Client`'s (cancel, retry, restart,
//! the bulk cancel and retry, queue pauses, instance migrations), and the simulated
//! workers: a row claimed and held (`claim`), a lease lost (`lose_lease`).

use std::future::{ready, Ready};

use gen_durable::backend::BulkAction;
use gen_durable::{
    BulkReport, Cancelled, Error, Filter, MigrateOptions, MigrationReport, QueuePause, Result,
    Status,
};
use serde_json::Value;

use super::TestKit;

impl TestKit {
    /// Cancels a live instance, like `Client::cancel`: it fails with "cancelled" at once
    /// (its inbox deleted, its parent counted down) and so does every live descendant.
    /// `NotFound` for an unknown id, `Finished` for a terminal one. No step runs between
    /// the kit's calls, so `after_current_step` is always 0.
    pub fn cancel(&mut self, id: i64) -> Ready<Result<Cancelled>> {
        let now = self.now();
        ready(self.store.cancel(id, now).answer(id))
    }

    /// Makes a failed instance run again at its step, now, with `attempt` 0 — awaiting its
    /// signals again if the step was woken by one — like `Client::retry`. `NotFound` for an unknown id, `WrongStatus` unless it is
    /// `failed`, `ParentMovedOn` for a child whose parent no longer waits for it,
    /// `Duplicate` if its unique key was taken since it failed.
    pub fn retry(&mut self, id: i64) -> Ready<Result<()>> {
        let now = self.now();
        ready(self.store.retry(id, now).answer(id))
    }

    /// Runs instance `id` again from step `step`, like `Client::restart`: an instance that
    /// is failed, done, or live but not executing becomes runnable now at `step`, attempt
    /// 0, nothing awaited. The step is checked against the kit's registry
    /// (`UnknownStep`; `UnknownSteps` if the kit does not know the row's FSM version).
    /// `NotFound`, `WrongStatus` with live children, `ParentMovedOn` for a finished child
    /// whose parent went on, `Duplicate` if its unique key is held by another instance.
    pub fn restart(&mut self, id: i64, step: &str) -> Ready<Result<()>> {
        let now = self.now();
        let checked = match self.store.row(id) {
            None => Err(Error::NotFound { id }),
            Some(r) => gen_durable::backend::check_restart_step(
                &self.registry,
                &r.fsm,
                r.version,
                step,
                None,
            ),
        };
        ready(checked.and_then(|()| self.store.restart(id, step, None, now).answer(id)))
    }

    /// Cancels every live instance `filter` matches, like `Client::cancel_where`: each as
    /// [`TestKit::cancel`] cancels one (its live descendants with it), in batches of at most
    /// [`gen_durable::BULK_BATCH`]. `dry_run`: counts the matches and changes nothing. The
    /// same [`Error::InvalidInput`] for a filter that names neither a queue nor an FSM, or a
    /// terminal status. No step runs between the kit's calls, so `after_current_step` and
    /// `skipped` are 0.
    pub fn cancel_where(&mut self, filter: &Filter, dry_run: bool) -> Ready<Result<BulkReport>> {
        let now = self.now();
        ready(filter.matcher(BulkAction::Cancel, now).map(|m| {
            if dry_run {
                self.store.dry_run(&m)
            } else {
                self.store.cancel_where(&m, now)
            }
        }))
    }

    /// Retries every failed instance `filter` matches, like `Client::retry_where`: each as
    /// [`TestKit::retry`] retries one, in batches of at most [`gen_durable::BULK_BATCH`]; one
    /// whose parent moved on or whose unique key another instance holds is counted in
    /// `skipped`. `dry_run`: counts the matches and changes nothing. The same
    /// [`Error::InvalidInput`] for a filter that names neither a queue nor an FSM, or a
    /// status other than `failed`.
    pub fn retry_where(&mut self, filter: &Filter, dry_run: bool) -> Ready<Result<BulkReport>> {
        let now = self.now();
        ready(filter.matcher(BulkAction::Retry, now).map(|m| {
            if dry_run {
                self.store.dry_run(&m)
            } else {
                self.store.retry_where(&m, now)
            }
        }))
    }

    /// Pauses `queue`, like `Client::pause_queue`: `run_until_idle` runs none of its rows
    /// until [`TestKit::resume_queue`]. True if it was not paused yet.
    pub fn pause_queue(&mut self, queue: &str, reason: Option<&str>) -> Ready<Result<bool>> {
        let now = self.now();
        ready(
            gen_durable::backend::check_queue(queue, reason)
                .map(|()| self.store.pause(queue, reason, now)),
        )
    }

    /// Resumes a paused `queue`, like `Client::resume_queue`. True if it was paused.
    pub fn resume_queue(&mut self, queue: &str) -> Ready<Result<bool>> {
        ready(gen_durable::backend::check_queue(queue, None).map(|()| self.store.resume(queue)))
    }

    /// The paused queues, by name, like `Client::paused_queues`.
    pub fn paused_queues(&self) -> Vec<QueuePause> {
        self.store.paused()
    }

    /// Simulates a worker (on node [`KIT_NODE`](crate::KIT_NODE)) that claimed runnable,
    /// due instance `id` and is still running its step: the row is `executing`, its
    /// partition key held (other rows of the key wait), with a lease of
    /// [`KIT_LEASE`](crate::KIT_LEASE) from now, until [`TestKit::lose_lease`] has the
    /// reaper take it back. `WrongStatus` unless it is runnable and due.
    pub fn claim(&mut self, id: i64) -> Result<()> {
        let status = self.status_of(id)?;
        let now = self.now();
        if self.store.claim(id, now) {
            Ok(())
        } else {
            Err(Error::WrongStatus {
                id,
                status,
                what: "only a runnable, due instance can be claimed",
            })
        }
    }

    /// Simulates a lost worker: runnable instance `id` is claimed by a worker that dies
    /// before its outcome commits, and the reaper takes the row back, as on PostgreSQL —
    /// runnable again with `attempt + 1` (`handle` is not called), or `failed` with
    /// "lease lost N times" at the FSM's `max_reaps`. A row [`TestKit::claim`] claimed
    /// loses its lease the same way. `WrongStatus` unless it is runnable and due, or
    /// claimed.
    pub fn lose_lease(&mut self, id: i64) -> Result<()> {
        let status = self.status_of(id)?;
        let now = self.now();
        if self.store.lose_lease(id, now) {
            Ok(())
        } else {
            Err(Error::WrongStatus {
                id,
                status,
                what: "only a runnable, due instance can be claimed and lose its lease",
            })
        }
    }

    fn status_of(&self, id: i64) -> Result<Status> {
        self.store
            .row(id)
            .map(|r| r.status)
            .ok_or(Error::NotFound { id })
    }

    /// Replaces an instance's stored state with raw JSON — to test a state written by an
    /// older type that no longer casts, as an `UPDATE gd_instances SET state = …` would.
    pub fn overwrite_state(&mut self, id: i64, state: Value) {
        self.store
            .row_mut(id)
            .unwrap_or_else(|| panic!("no instance {id}"))
            .state = state;
    }

    /// Moves the live rows of FSM `fsm` below version `to` to version `to` with the kit's
    /// migrations, as `Client::migrate_instances` does: every chain is checked first
    /// ([`Error::NoMigration`], and nothing changes, if a row's version has none or no
    /// migration ends at `to`); a row whose transform fails (or panics) stays on its
    /// version with the error in `last_error`, counted in `failed`; only the version, state
    /// and step of a moved row change (a parked row stays parked). No step runs between the
    /// kit's calls, so `executing` and `skipped` are 0. [`MigrateOptions::dry_run`] runs
    /// the transforms and reports, writing nothing.
    pub fn migrate_instances(
        &mut self,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
    ) -> Ready<Result<MigrationReport>> {
        let now = self.now();
        ready(
            self.store
                .migrate_instances(&self.registry, fsm, to, opts, now),
        )
    }
}
