//! [`TestKit`]: the in-memory engine on a virtual clock.

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use gen_durable::runtime::{NewInstance, StepInput, StepOutput};
use gen_durable::{
    BulkAction, BulkReport, Cancelled, Clock, Delivery, Entry, Error, Event, Filter, Fsm, FsmEntry,
    Gate, MigrateOptions, Migration, MigrationReport, OutcomeKind, QueuePause, RateLimit, Registry,
    Result, Schedule, Settled, Status, Target,
};
use gen_durable::{ExplainFacts, Explanation};
use serde_json::Value;

use crate::builders::{KitInsert, KitInsertJson, KitSignal, KitWait, Outbox, SignalSender};
use crate::instance::Instance;
use crate::store::schedule::{self, KitSchedule};
use crate::store::Store;
use crate::tally::Tally;

/// Where the virtual clock starts: 2030-01-01T00:00:00Z, so every run sees the same times.
pub fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .expect("a valid instant")
}

/// The default `max_steps` of one `run_until_idle`.
pub const DEFAULT_MAX_STEPS: usize = 10_000;

/// The in-memory engine: runs the same FSM and job types as the Postgres engine,
/// through the same step runner ([`FsmEntry::run`]), committing each outcome with the
/// same effects, on a virtual clock that moves only when the test calls
/// [`TestKit::advance`]. Nothing sleeps, nothing runs on another thread, and steps run
/// one at a time in the pick's order `(priority, eligible_at, id)`, so a test gives the
/// same result every time.
///
/// Differences from Postgres, by design: `ctx.transaction()` returns an error (there is
/// no database); partitions are trivially exclusive (one step runs at a time, so
/// `partition.contended` never fires); leases and drains do not exist — a lost worker and
/// the reaper taking its row back are simulated by [`TestKit::lose_lease`], a worker still
/// running a step by [`TestKit::claim`].
#[derive(Debug)]
pub struct TestKit {
    registry: Registry,
    clock: Clock,
    store: Store,
    events: Vec<Event>,
    max_steps: usize,
    max_signal_payload: usize,
    outbox: Outbox,
    /// Each declared schedule, as `gd_schedules` holds it.
    schedules: Vec<KitSchedule>,
    sent: Vec<(i64, String, Result<Delivery>)>,
}

impl Default for TestKit {
    fn default() -> Self {
        Self::new()
    }
}

impl TestKit {
    /// A kit knowing every FSM linked into the test binary (like `Engine::builder`),
    /// with its clock at [`epoch`].
    pub fn new() -> Self {
        TestKit {
            registry: Registry::linked(),
            clock: Clock::manual(epoch()),
            store: Store::default(),
            events: Vec::new(),
            max_steps: DEFAULT_MAX_STEPS,
            max_signal_payload: gen_durable::DEFAULT_MAX_SIGNAL_PAYLOAD,
            outbox: Outbox::default(),
            sent: Vec::new(),
            schedules: Vec::new(),
        }
    }

    /// Runs only the FSMs of `registry` (FSMs inserted with `insert::<F>` are added).
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Declares gate `name`, as `EngineBuilder::concurrency_limit` does (panics on a
    /// name or limit `start` would refuse).
    pub fn with_concurrency_limit(mut self, name: &str, gate: Gate) -> Self {
        gate.check(name).expect("a valid gate");
        self.store.set_gate(name, gate.limit());
        self
    }

    /// Declares gate `name` or changes its limit, like `Client::set_gate`: true if
    /// written. The next pick uses the new limit.
    pub fn set_gate(&mut self, name: &str, gate: Gate) -> Ready<Result<bool>> {
        ready(
            gate.check(name)
                .map(|()| self.store.set_gate(name, gate.limit())),
        )
    }

    /// Declares rate limit `name` or changes it, like `Client::set_rate_limit`: true if
    /// written. Buckets refill on the kit's virtual clock.
    pub fn set_rate_limit(&mut self, name: &str, limit: RateLimit) -> Ready<Result<bool>> {
        ready(limit.check(name).map(|()| {
            self.store
                .set_rate_limit(name, limit.per_second(), limit.capacity())
        }))
    }

    /// Registers FSM `F` (needed for FSMs only reached as children, when not linked).
    pub fn register<F: Fsm>(mut self) -> Self {
        self.registry.register::<F>();
        self
    }

    /// Adds instance migration `M` (from `M::From` to `M`), as `EngineBuilder::migration`
    /// does: a row of the old version the kit claims is moved to `M`'s version before its
    /// step runs, if the kit runs that version (linked, registered or inserted), and
    /// [`TestKit::migrate_instances`] applies it. `#[durable_migration]` ones are linked
    /// already (unless [`TestKit::with_registry`]).
    pub fn migration<M: Migration>(mut self) -> Self {
        self.registry.add_migration::<M>();
        self
    }

    /// Adds `F` to the FSMs this kit runs (an insert of `F` does it).
    pub(crate) fn register_fsm<F: Fsm>(&mut self) {
        self.registry.register::<F>();
    }

    /// Starts the clock at `at` instead of [`epoch`].
    pub fn with_start_time(self, at: DateTime<Utc>) -> Self {
        self.clock.set(at);
        self
    }

    /// Adds a periodic schedule, fired on the kit's virtual clock as an engine fires it on
    /// the database's: its first fire time is the first after the kit's now; each
    /// `run_until_idle` first inserts the fire times that have come, by the schedule's
    /// catch-up policy, keyed as the engine keys them (`gen_durable::fire_key`), and emits
    /// `schedule.fired` / `schedule.skipped`. A schedule of a name already added replaces
    /// it as a new release's engine does at its start: a new pattern or time zone fires
    /// from its first fire time after now (see the README, "Changing a schedule").
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        let now = self.now();
        if let Some(skipped) = schedule::declare(&mut self.schedules, schedule, now) {
            self.events.push(skipped);
        }
        self
    }

    /// The most steps one `run_until_idle` may commit before it panics (default 10 000).
    pub fn with_max_steps(mut self, n: usize) -> Self {
        self.max_steps = n;
        self
    }

    /// The largest signal payload accepted, in bytes of JSON (default 1 MiB, like `Client`).
    pub fn with_max_signal_payload(mut self, bytes: usize) -> Self {
        self.max_signal_payload = bytes;
        self
    }

    /// The FSMs this kit runs.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The virtual clock (a manual [`Clock`]; clones share its time).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The virtual time: what `ctx.now()` returns to a step claimed now.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now_param().expect("the kit's clock is manual")
    }

    /// Moves the virtual clock forward. Schedules, replay delays and await timeouts that
    /// fall due run at the next [`TestKit::run_until_idle`].
    pub fn advance(&mut self, by: Duration) {
        self.clock.advance(by);
    }

    /// Starts an insert of one instance of `F` (registering `F` if needed). Set options,
    /// then `.await` it: `Ok(id)` or [`Error::Duplicate`].
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

    /// Inserts the due fire times of every schedule (see [`TestKit::schedule`]).
    fn fire_schedules(&mut self) {
        let now = self.now();
        for i in 0..self.schedules.len() {
            let KitSchedule { schedule, next, .. } = &self.schedules[i];
            let Some(next) = *next else { continue };
            let plan = schedule.plan(next, now);
            let name = schedule.name().to_string();
            let policy = schedule.policy_reason();
            let built = schedule.build(&plan);
            self.schedules[i].next = plan.next;
            for (fire, row) in built.rows {
                let id = self.insert_rows(vec![row]).first().copied();
                if id.is_some() {
                    self.schedules[i].last_fire = Some(fire);
                }
                self.events.push(Event::ScheduleFired {
                    schedule: name.clone(),
                    fire_time: fire,
                    id,
                });
            }
            if plan.skipped > 0 {
                self.events.push(Event::ScheduleSkipped {
                    schedule: name.clone(),
                    count: plan.skipped,
                    reason: policy,
                });
            }
            if let Some(error) = built.error {
                self.events.push(Event::ScheduleSkipped {
                    schedule: name,
                    count: built.failed,
                    reason: error,
                });
            }
        }
    }

    pub(crate) fn insert_one(&mut self, row: NewInstance) -> Result<i64> {
        self.check_gates(std::slice::from_ref(&row))?;
        let key = row.unique_key.clone();
        let id = self.insert_rows(vec![row]).first().copied();
        gen_durable::inserted(id, key.as_deref())
    }

    /// Starts a signal delivery to instance `id`; `.dedup_key(k)` optional, then
    /// `.await` it. Errors exactly as `Client::signal`: `NotFound`, `Finished`, a bad
    /// name or an oversized payload, and nothing stored.
    pub fn signal(
        &mut self,
        to: impl Into<Target>,
        name: impl Into<String>,
        payload: Value,
    ) -> KitSignal<'_> {
        KitSignal::new(self, to.into(), name.into(), payload)
    }

    pub(crate) fn deliver(
        &mut self,
        to: &Target,
        name: &str,
        payload: Value,
        dedup_key: Option<String>,
    ) -> Result<Delivery> {
        gen_durable::check_target(to)?;
        gen_durable::check_signal(
            name,
            &payload,
            dedup_key.as_deref(),
            self.max_signal_payload,
        )?;
        let now = self.now();
        self.store
            .deliver(to, name, payload, dedup_key, now)
            .answer(to)
    }

    /// A handle a step (or anything else) can send signals through while the kit runs:
    /// they are delivered as soon as the running step returns, before its outcome
    /// commits — as a signal that arrives while a step runs does on Postgres. Results
    /// are kept in [`TestKit::sent`].
    pub fn sender(&self) -> SignalSender {
        SignalSender::new(self.outbox.clone())
    }

    /// The deliveries made through [`TestKit::sender`] so far: target, name, result.
    pub fn sent(&self) -> &[(i64, String, Result<Delivery>)] {
        &self.sent
    }

    fn deliver_deferred(&mut self) {
        for d in self.outbox.take() {
            let r = self.deliver(&Target::Id(d.id), &d.name, d.payload, d.dedup_key);
            self.sent.push((d.id, d.name, r));
        }
    }

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
            Some(r) => {
                gen_durable::check_restart_step(&self.registry, &r.fsm, r.version, step, None)
            }
        };
        ready(checked.and_then(|()| self.store.restart(id, step, now).answer(id)))
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
            gen_durable::check_queue(queue, reason).map(|()| self.store.pause(queue, reason, now)),
        )
    }

    /// Resumes a paused `queue`, like `Client::resume_queue`. True if it was paused.
    pub fn resume_queue(&mut self, queue: &str) -> Ready<Result<bool>> {
        ready(gen_durable::check_queue(queue, None).map(|()| self.store.resume(queue)))
    }

    /// The paused queues, by name, like `Client::paused_queues`.
    pub fn paused_queues(&self) -> Vec<QueuePause> {
        self.store.paused()
    }

    /// Starts a wait for an instance, named by id or by key, as `Client::wait` does; `.await`
    /// it. The kit answers at once from the in-memory row — no step runs meanwhile — so
    /// where the client would wait, the kit answers `Settled::Busy`.
    pub fn wait(&self, to: impl Into<Target>) -> KitWait<'_> {
        KitWait::new(self, to.into())
    }

    /// The answer of a wait on `to` now.
    pub(crate) fn wait_now(&self, to: &Target, until_terminal: bool) -> Result<Settled> {
        gen_durable::check_target(to)?;
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
    /// code (`gen_durable::ExplainFacts`), with the same bounds. The kit knows every
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
        gen_durable::check_target(to)?;
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
                status: status.to_string(),
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
                status: status.to_string(),
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

    /// Runs every step that is due, one at a time in the pick's order, until nothing is
    /// runnable at the current virtual time (rows of a paused queue are not picked);
    /// returns what was committed. Await timeouts
    /// that are due fire first. A claimed row of a version the kit migrates is moved first
    /// (see [`TestKit::migration`]; a failed migration is no step). Panics after
    /// `max_steps` steps, naming the instance that ran most, if a due instance belongs to
    /// an FSM the kit does not know, and if a migration's step map is invalid (where an
    /// engine fails to start: `Error::BadMigration`).
    pub async fn run_until_idle(&mut self) -> Tally {
        if let Err(e) = self.registry.check_migrations() {
            panic!("{e}");
        }
        let mut tally = Tally::default();
        let mut per_instance: HashMap<i64, usize> = HashMap::new();
        let mut last: Vec<(i64, String, OutcomeKind)> = Vec::new();
        self.fire_schedules();
        loop {
            self.deliver_deferred();
            let now = self.now();
            self.store.expire_awaits(now);
            let Some(id) = self.store.pick(now, &self.registry) else {
                break;
            };
            if !self.store.admit(id, now) {
                continue; // its tokens are not there yet: it reserved them and waits
            }
            if tally.steps >= self.max_steps {
                self.runaway(&per_instance, &last);
            }
            let Some((step, kind)) = self.run_one(id, now).await else {
                continue; // a failed migration: its row waits out its backoff
            };
            tally.record(kind);
            *per_instance.entry(id).or_default() += 1;
            last.push((id, step, kind));
            if last.len() > 8 {
                last.remove(0);
            }
        }
        let now = self.now();
        if let Some(r) = self.store.unrunnable(now, &self.registry).first() {
            panic!(
                "instance {} ({} v{}) is due at step {:?}, but this TestKit does not know {} v{}: \
                 register it with .register::<T>() or .with_registry(..)",
                r.id, r.fsm, r.version, r.step, r.fsm, r.version
            );
        }
        tally
    }

    fn runaway(&self, per_instance: &HashMap<i64, usize>, last: &[(i64, String, OutcomeKind)]) {
        let (id, n) = per_instance
            .iter()
            .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
            .map(|(id, n)| (*id, *n))
            .unwrap_or_default();
        let which = self
            .store
            .snapshot(id)
            .map_or_else(|| format!("instance {id}"), |i| i.describe());
        let recent: Vec<String> = last
            .iter()
            .map(|(i, s, k)| format!("{i}:{s}->{k}"))
            .collect();
        panic!(
            "run_until_idle: {} steps without going idle — a runaway loop? {n} of them by {which}. \
             Last steps: {}. Raise TestKit::with_max_steps if this is expected.",
            self.max_steps,
            recent.join(", ")
        );
    }

    /// Claims `id`, migrates it if the kit migrates its version, runs its step through the
    /// FSM's entry, delivers signals sent while it ran, and commits its outcome. Returns
    /// the step and the committed kind; `None` if its migration failed (nothing ran).
    async fn run_one(&mut self, id: i64, now: DateTime<Utc>) -> Option<(String, OutcomeKind)> {
        let row = self.store.row_mut(id).expect("picked row exists");
        (row.status, row.updated_at) = (Status::Executing, now);
        let entry = self.upgrade(id, now)?;
        let row = self.store.row(id).expect("picked row exists");
        let input = StepInput {
            attempt: row.attempt,
            awaits: row.awaits.clone(),
            ..StepInput::new(id, row.step.clone(), row.state.clone(), now)
        };
        let input = StepInput {
            inbox: self.store.inbox_of(id),
            children: self.store.child_infos(id),
            ..input
        };
        let step = input.step.clone();
        let output = entry.run(input).await;
        self.deliver_deferred();
        let kind = output.outcome.kind();
        self.store.apply(id, &output, now);
        self.events.push(Event::StepStop {
            duration: output.duration,
            id,
            fsm: entry.name,
            step: step.clone(),
            kind,
        });
        Some((step, kind))
    }

    /// The lazy instance migration of claimed row `id`, as the engine's (`engine::upgrade`):
    /// the entry to run it with — its own version's, or if the kit migrates that version,
    /// the chain's last, once the whole chain has moved the row there (version, state and
    /// step; `migration.applied`). If a transform fails or panics, the row stays on its
    /// version and its unchanged step is committed as a `replay` after
    /// `backoff(attempt)` with the error as `last_error` (`migration.failed`): `None`.
    fn upgrade(&mut self, id: i64, now: DateTime<Utc>) -> Option<FsmEntry> {
        let row = self.store.row_mut(id).expect("picked row exists");
        let from = row.version;
        let Some((to, migrated)) = self.registry.upgrade(&row.fsm, from, &row.state, &row.step)
        else {
            let entry = self.registry.get(&row.fsm, from);
            return Some(*entry.expect("pick only returns FSMs the kit runs or migrates"));
        };
        let entry = *self
            .registry
            .get(&row.fsm, to)
            .expect("a migration chain ends at a version the kit runs");
        let fsm = entry.name;
        match migrated {
            Ok(m) => {
                (row.version, row.state, row.step) = (m.version, m.state, m.step.to_string());
                self.events
                    .push(Event::InstanceMigrated { id, fsm, from, to });
                Some(entry)
            }
            Err(error) => {
                self.events.push(Event::MigrationFailed {
                    id,
                    fsm,
                    from,
                    to,
                    error: error.clone(),
                });
                let output = StepOutput::migration_failed(row.state.clone(), error, row.attempt);
                self.store.apply(id, &output, now);
                None
            }
        }
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
