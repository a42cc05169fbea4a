//! [`TestKit`]: the in-memory engine on a virtual clock — its settings and declarations
//! here, what it does in the files beside:
//!
//! - `mod.rs`: the kit, its settings, its declarations (FSMs, gates, rate limits,
//!   migrations, schedules) and its clock;
//! - `insert.rs`: `insert`, `insert_all`, `insert_json`, `insert_rows`;
//! - `signal.rs`: `signal`, and the signals a running step sends through a
//!   [`SignalSender`](crate::SignalSender);
//! - `control.rs`: the operator actions (`cancel`, `retry`, `restart`, the bulk ones,
//!   pauses, `migrate_instances`) and the simulated workers (`claim`, `lose_lease`);
//! - `reads.rs`: `wait`, `explain`, the events, the snapshots and the assertions on them;
//! - `history.rs`: `history`, `fork` and `restart_from` a past step, `assert_steps`;
//! - `run.rs`: `run_until_idle` — schedules fired, steps picked, run and committed.
//!
//! Its tables are the kit's store (`crate::store`), whose files mirror
//! `gen_durable::store::pg`'s.

use std::future::{ready, Ready};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use gen_durable::{
    Clock, Delivery, Event, Fsm, Gate, Migration, RateLimit, Registry, Result, Schedule,
};

use crate::builders::Outbox;
use crate::store::schedule::{self, KitSchedule};
use crate::store::Store;

mod control;
mod history;
mod insert;
mod reads;
mod run;
mod signal;

/// Where the virtual clock starts: 2030-01-01T00:00:00Z, so every run sees the same times.
pub fn epoch() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
        .single()
        .expect("a valid instant")
}

/// The default `max_steps` of one `run_until_idle`.
pub const DEFAULT_MAX_STEPS: usize = 10_000;

/// The in-memory engine: runs the same FSM and job types as the Postgres engine,
/// through the same step runner ([`FsmEntry::run`](gen_durable::FsmEntry::run)),
/// committing each outcome with the same effects, on a virtual clock that moves only
/// when the test calls [`TestKit::advance`]. Nothing sleeps, nothing runs on another
/// thread, and steps run one at a time in the pick's order `(priority, eligible_at, id)`,
/// so a test gives the same result every time.
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

    /// Declares gate `name`, as `EngineBuilder::gate` does (panics on a
    /// name or limit `start` would refuse).
    pub fn gate(mut self, name: &str, gate: Gate) -> Self {
        gate.check(name).expect("a valid gate");
        self.store.set_gate(name, gate.limit());
        self
    }

    /// Declares rate limit `name`, as `EngineBuilder::rate_limit` does (panics on a name
    /// or limit `start` would refuse). Buckets refill on the kit's virtual clock.
    pub fn rate_limit(mut self, name: &str, limit: RateLimit) -> Self {
        limit.check(name).expect("a valid rate limit");
        self.store
            .set_rate_limit(name, limit.per_second(), limit.capacity());
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gen_durable::{Gate, RateLimit};

    use super::TestKit;

    /// The builder's declarations are what `set_gate` and `set_rate_limit` would write:
    /// declaring the same again writes nothing, a different limit is written.
    #[test]
    fn gate_and_rate_limit_declare_what_the_setters_would_write() {
        let minute = Duration::from_secs(60);
        let mut kit = TestKit::new()
            .gate("stripe", Gate::new(2))
            .rate_limit("mail", RateLimit::per(100, minute).burst(10));
        assert_eq!(
            kit.set_gate("stripe", Gate::new(2)).into_inner().ok(),
            Some(false)
        );
        assert_eq!(
            kit.set_gate("stripe", Gate::new(3)).into_inner().ok(),
            Some(true)
        );
        let same = RateLimit::per(100, minute).burst(10);
        assert_eq!(
            kit.set_rate_limit("mail", same).into_inner().ok(),
            Some(false)
        );
        let other = RateLimit::per(50, minute);
        assert_eq!(
            kit.set_rate_limit("mail", other).into_inner().ok(),
            Some(true)
        );
    }
}
