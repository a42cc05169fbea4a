//! [`TestKit`]: the in-memory engine on a virtual clock.

use std::collections::HashMap;
use std::future::{ready, IntoFuture, Ready};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use gen_durable::runtime::{NewInstance, StepInput};
use gen_durable::{
    Clock, Delivery, Entry, Error, Event, Fsm, FsmEntry, InsertOptions, OutcomeKind, Registry,
    Result, Status,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::instance::Instance;
use crate::store::Store;
use crate::tally::Tally;

/// Where the virtual clock starts: 2030-01-01T00:00:00Z, so every run sees the same times.
pub fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .expect("a valid instant")
}

/// What a cancel did; the same fields as the `Cancelled` that `Client::cancel` returns
/// (which `gen_durable` does not re-export yet, so the kit cannot name it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled {
    /// Instances (the target and live descendants) failed at once.
    pub failed: usize,
    /// Executing instances that will fail after their current step: always 0 in the
    /// kit, where no step runs between calls.
    pub after_current_step: usize,
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
/// the reaper taking its row back are simulated by [`TestKit::lose_lease`].
#[derive(Debug)]
pub struct TestKit {
    registry: Registry,
    clock: Clock,
    store: Store,
    events: Vec<Event>,
    max_steps: usize,
    max_signal_payload: usize,
    outbox: Arc<Mutex<Vec<Deferred>>>,
    sent: Vec<(i64, String, Result<Delivery>)>,
}

#[derive(Debug)]
struct Deferred {
    id: i64,
    name: String,
    payload: Value,
    dedup_key: Option<String>,
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
            outbox: Arc::default(),
            sent: Vec::new(),
        }
    }

    /// Runs only the FSMs of `registry` (FSMs inserted with `insert::<F>` are added).
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Registers FSM `F` (needed for FSMs only reached as children, when not linked).
    pub fn register<F: Fsm>(mut self) -> Self {
        self.registry.register::<F>();
        self
    }

    /// Starts the clock at `at` instead of [`epoch`].
    pub fn starting_at(self, at: DateTime<Utc>) -> Self {
        self.clock.set(at);
        self
    }

    /// The most steps one `run_until_idle` may commit before it panics (default 10 000).
    pub fn max_steps(mut self, n: usize) -> Self {
        self.max_steps = n;
        self
    }

    /// The largest signal payload accepted, in bytes of JSON (default 1 MiB, like `Client`).
    pub fn max_signal_payload(mut self, bytes: usize) -> Self {
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
        KitInsert {
            kit: self,
            entry: Entry::new(state),
        }
    }

    /// Inserts many instances of `F` at once, each a [`gen_durable::Entry`] as for
    /// `Client::insert_all`; rows whose unique key is occupied (by a stored row or an
    /// earlier entry) are dropped. Returns the inserted ids, ascending.
    pub fn insert_all<F: Fsm>(
        &mut self,
        entries: impl IntoIterator<Item = Entry<F>>,
    ) -> Ready<Result<Vec<i64>>> {
        self.registry.register::<F>();
        let rows = entries
            .into_iter()
            .map(Entry::into_new_instance)
            .collect::<Result<Vec<_>>>();
        ready(rows.map(|rows| self.insert_rows(rows)))
    }

    /// Inserts an instance by FSM name and version, checked against the registry like
    /// `Client::insert_json` (starting at `step`, or the initial step if `None`).
    pub fn insert_json(
        &mut self,
        fsm: &str,
        version: i32,
        step: Option<&str>,
        state: Value,
    ) -> Result<i64> {
        let entry = *self.registry.resolve(fsm, version)?;
        if let Some(step) = step {
            entry.check_step(step)?;
        }
        entry.check_state(&state)?;
        let mut row = NewInstance::from_parts(
            entry.name,
            entry.version,
            entry.initial(),
            entry.queue,
            entry.max_reaps,
            state,
            InsertOptions::default(),
        );
        if let Some(step) = step {
            row.step = step.to_string();
        }
        self.insert_one(row)
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

    fn insert_one(&mut self, row: NewInstance) -> Result<i64> {
        let key = row.unique_key.clone();
        self.insert_rows(vec![row])
            .first()
            .copied()
            .ok_or_else(|| Error::Duplicate {
                key: key.unwrap_or_default(),
            })
    }

    /// Starts a signal delivery to instance `id`; `.dedup_key(k)` optional, then
    /// `.await` it. Errors exactly as `Client::signal`: `NotFound`, `Finished`, a bad
    /// name or an oversized payload, and nothing stored.
    pub fn signal(&mut self, id: i64, name: impl Into<String>, payload: Value) -> KitSignal<'_> {
        KitSignal {
            kit: self,
            id,
            name: name.into(),
            payload,
            dedup_key: None,
        }
    }

    fn deliver(
        &mut self,
        id: i64,
        name: &str,
        payload: Value,
        dedup_key: Option<String>,
    ) -> Result<Delivery> {
        gen_durable::check_signal(
            name,
            &payload,
            dedup_key.as_deref(),
            self.max_signal_payload,
        )?;
        let now = self.now();
        let d = self.store.deliver(id, name, payload, dedup_key, now);
        match d.status {
            None => Err(Error::NotFound { id }),
            Some(st) if st.is_terminal() => Err(Error::Finished {
                id,
                status: st.to_string(),
            }),
            Some(_) => Ok(Delivery {
                signal_id: d.signal_id,
                woke: d.woke,
            }),
        }
    }

    /// A handle a step (or anything else) can send signals through while the kit runs:
    /// they are delivered as soon as the running step returns, before its outcome
    /// commits — as a signal that arrives while a step runs does on Postgres. Results
    /// are kept in [`TestKit::sent`].
    pub fn sender(&self) -> SignalSender {
        SignalSender {
            outbox: self.outbox.clone(),
        }
    }

    /// The deliveries made through [`TestKit::sender`] so far: target, name, result.
    pub fn sent(&self) -> &[(i64, String, Result<Delivery>)] {
        &self.sent
    }

    fn deliver_deferred(&mut self) {
        let pending: Vec<Deferred> = std::mem::take(&mut *self.outbox.lock().expect("outbox"));
        for d in pending {
            let r = self.deliver(d.id, &d.name, d.payload, d.dedup_key);
            self.sent.push((d.id, d.name, r));
        }
    }

    /// Cancels a live instance, like `Client::cancel`: it fails with "cancelled" at once
    /// (its inbox deleted, its parent counted down) and so does every live descendant.
    /// `NotFound` for an unknown id, `Finished` for a terminal one. No step runs between
    /// the kit's calls, so `after_current_step` is always 0.
    pub fn cancel(&mut self, id: i64) -> Ready<Result<Cancelled>> {
        ready(self.cancel_now(id))
    }

    fn cancel_now(&mut self, id: i64) -> Result<Cancelled> {
        let status = self.status_of(id)?;
        if status.is_terminal() {
            return Err(Error::Finished {
                id,
                status: status.to_string(),
            });
        }
        let now = self.now();
        Ok(Cancelled {
            failed: self.store.cancel(id, now),
            after_current_step: 0,
        })
    }

    /// Makes a failed instance runnable again at its step, now, with `attempt` 0, like
    /// `Client::retry`. `NotFound` for an unknown id, `WrongStatus` unless it is
    /// `failed`, `ParentMovedOn` for a child whose parent no longer waits for it,
    /// `Duplicate` if its unique key was taken since it failed.
    pub fn retry(&mut self, id: i64) -> Ready<Result<()>> {
        ready(self.retry_now(id))
    }

    fn retry_now(&mut self, id: i64) -> Result<()> {
        let status = self.status_of(id)?;
        if status != Status::Failed {
            return Err(Error::WrongStatus {
                id,
                status: status.to_string(),
                what: "only a failed instance can be retried",
            });
        }
        // As `Client::retry`: a child only while its parent waits for its children.
        let parent = self.store.row(id).and_then(|r| r.parent_id);
        let rearm = match parent.and_then(|p| self.store.row(p)) {
            Some(p) if p.status == Status::AwaitingChildren => Some(p.id),
            Some(p) => {
                return Err(Error::ParentMovedOn {
                    id,
                    parent: p.id,
                    status: p.status.to_string(),
                })
            }
            None => None,
        };
        let now = self.now();
        self.store
            .retry(id, now, rearm)
            .map_err(|()| Error::Duplicate {
                key: format!("(the unique key of instance {id})"),
            })
    }

    /// Simulates a lost worker: runnable instance `id` is claimed by a worker that dies
    /// before its outcome commits, and the reaper takes the row back, as on PostgreSQL —
    /// runnable again with `attempt + 1` (`handle` is not called), or `failed` with
    /// "lease lost N times" at the FSM's `max_reaps`. `WrongStatus` unless it is runnable
    /// and due.
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

    /// Runs every step that is due, one at a time in the pick's order, until nothing is
    /// runnable at the current virtual time; returns what was committed. Await timeouts
    /// that are due fire first. Panics after `max_steps` steps, naming the instance that
    /// ran most, and if a due instance belongs to an FSM the kit does not know.
    pub async fn run_until_idle(&mut self) -> Tally {
        let mut tally = Tally::default();
        let mut per_instance: HashMap<i64, usize> = HashMap::new();
        let mut last: Vec<(i64, String, OutcomeKind)> = Vec::new();
        loop {
            self.deliver_deferred();
            let now = self.now();
            self.store.expire_awaits(now);
            let Some(id) = self.store.pick(now, &self.registry) else {
                break;
            };
            if tally.steps >= self.max_steps {
                self.runaway(&per_instance, &last);
            }
            let (step, kind) = self.run_one(id, now).await;
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
             Last steps: {}. Raise TestKit::max_steps if this is expected.",
            self.max_steps,
            recent.join(", ")
        );
    }

    /// Claims `id`, runs its step through the FSM's entry, delivers signals sent while it
    /// ran, and commits its outcome. Returns the step and the committed kind.
    async fn run_one(&mut self, id: i64, now: DateTime<Utc>) -> (String, OutcomeKind) {
        let row = self.store.row_mut(id).expect("picked row exists");
        row.status = Status::Executing;
        let (fsm, version) = (row.fsm.clone(), row.version);
        let input = StepInput {
            id,
            step: row.step.clone(),
            state: row.state.clone(),
            attempt: row.attempt,
            awaits: row.awaits.clone(),
            inbox: Vec::new(),
            children: Vec::new(),
            now,
            cancel: CancellationToken::new(),
            pool: None,
        };
        let input = StepInput {
            inbox: self.store.inbox_of(id),
            children: self.store.child_infos(id),
            ..input
        };
        let step = input.step.clone();
        let entry: FsmEntry = *self
            .registry
            .get(&fsm, version)
            .expect("pick only returns registered FSMs");
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
        (step, kind)
    }

    /// The telemetry events the kit emitted, in order (`step.stop` with the committed
    /// kind for every step).
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

    /// Panics unless `id` is `done` with exactly `result`; the message shows its status,
    /// step and last error.
    #[track_caller]
    pub fn assert_done(&self, id: i64, result: impl Into<Value>) -> Instance {
        let i = self.instance(id);
        i.assert_done(result);
        i
    }

    /// Panics unless `id` is `failed` with a `last_error` containing `message`.
    #[track_caller]
    pub fn assert_failed(&self, id: i64, message: &str) -> Instance {
        let i = self.instance(id);
        i.assert_failed(message);
        i
    }

    /// Panics unless `id` is parked in `awaiting_signal` on exactly `names`.
    #[track_caller]
    pub fn assert_awaiting<I, S>(&self, id: i64, names: I) -> Instance
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let i = self.instance(id);
        i.assert_awaiting(names);
        i
    }

    /// Panics unless `id` is at step `step`.
    #[track_caller]
    pub fn assert_step(&self, id: i64, step: &str) -> Instance {
        let i = self.instance(id);
        i.assert_step(step);
        i
    }

    /// Panics unless `id` is in `status`.
    #[track_caller]
    pub fn assert_status(&self, id: i64, status: Status) -> Instance {
        let i = self.instance(id);
        i.assert_status(status);
        i
    }
}

/// Sends signals into a running [`TestKit`]; see [`TestKit::sender`]. Cheap to clone,
/// `Send + Sync`.
#[derive(Debug, Clone)]
pub struct SignalSender {
    outbox: Arc<Mutex<Vec<Deferred>>>,
}

impl SignalSender {
    /// Queues a signal for delivery when the running step returns.
    pub fn send(&self, id: i64, name: impl Into<String>, payload: Value) {
        self.push(id, name.into(), payload, None);
    }

    /// Like [`SignalSender::send`], with a dedup key.
    pub fn send_dedup(
        &self,
        id: i64,
        name: impl Into<String>,
        payload: Value,
        key: impl Into<String>,
    ) {
        self.push(id, name.into(), payload, Some(key.into()));
    }

    fn push(&self, id: i64, name: String, payload: Value, dedup_key: Option<String>) {
        self.outbox.lock().expect("outbox").push(Deferred {
            id,
            name,
            payload,
            dedup_key,
        });
    }
}

/// A pending insert into a [`TestKit`]: a [`gen_durable::Entry`] and the kit it goes
/// into. Set options (as on `Client::insert`), then `.await` it.
#[derive(Debug)]
#[must_use = "an insert does nothing until awaited"]
pub struct KitInsert<'k, F: Fsm> {
    kit: &'k mut TestKit,
    entry: Entry<F>,
}

/// Generates setters that forward to the [`Entry`] setter of the same name.
macro_rules! forward_to_entry {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty);)*) => {
        $(
            $(#[$doc])*
            pub fn $name(self, $arg: $ty) -> Self {
                KitInsert {
                    entry: self.entry.$name($arg),
                    ..self
                }
            }
        )*
    };
}

impl<F: Fsm> KitInsert<'_, F> {
    forward_to_entry! {
        /// Starts at this step (its stored name) instead of the FSM's initial step.
        step(step: impl Into<String>);
        /// Runs on this queue instead of the FSM's.
        queue(queue: impl Into<String>);
        /// Lower runs first; default 0.
        priority(priority: i16);
        /// Instances sharing a partition key never run steps at the same time.
        partition_key(key: impl Into<String>);
        /// At most one instance holds this key while its status is in the unique scope.
        unique_key(key: impl Into<String>);
        /// The statuses in which the unique key is occupied; default: every non-terminal status.
        unique_scope(scope: impl IntoIterator<Item = Status>);
        /// Runnable from this instant on. Takes precedence over `schedule_at` and `schedule_in`.
        eligible_at(at: DateTime<Utc>);
        /// Sugar for `eligible_at`; takes precedence over `schedule_in`.
        schedule_at(at: DateTime<Utc>);
        /// Runnable this long after the kit's virtual now.
        schedule_in(delay: Duration);
    }
}

impl<F: Fsm> IntoFuture for KitInsert<'_, F> {
    type Output = Result<i64>;
    type IntoFuture = Ready<Result<i64>>;
    fn into_future(self) -> Self::IntoFuture {
        self.kit.registry.register::<F>();
        ready(
            self.entry
                .into_new_instance()
                .and_then(|row| self.kit.insert_one(row)),
        )
    }
}

/// A pending signal delivery into a [`TestKit`]; `.await` it.
#[derive(Debug)]
#[must_use = "a signal is not sent until awaited"]
pub struct KitSignal<'k> {
    kit: &'k mut TestKit,
    id: i64,
    name: String,
    payload: Value,
    dedup_key: Option<String>,
}

impl KitSignal<'_> {
    /// A redelivery with the same key to the same instance stores nothing and succeeds,
    /// while the first is stored.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }
}

impl IntoFuture for KitSignal<'_> {
    type Output = Result<Delivery>;
    type IntoFuture = Ready<Result<Delivery>>;
    fn into_future(self) -> Self::IntoFuture {
        ready(
            self.kit
                .deliver(self.id, &self.name, self.payload, self.dedup_key),
        )
    }
}
