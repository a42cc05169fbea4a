//! The two backends every scenario runs on, behind one trait: the in-memory
//! [`TestKit`] and the Postgres engine on a manual clock.
//!
//! Both run steps only inside `run()`: the Postgres backend starts an engine for each
//! `run()` and drains it once nothing is due, so between runs nothing moves on either
//! backend and a scenario sees the same states on both. `advance` moves a manual clock;
//! due schedules, replays and await timeouts fire at the next `run()` (the engine's
//! pickers and timeout sweep act at start, on the clock's `$now`).
//!
//! `deploy` swaps the FSMs and instance migrations both sides run (the nodes, the client
//! and the kit), as a deploy of new code does: rows written under the old code stay as
//! they are until a claim or a bulk `migrate_instances` moves them.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gen_durable::{
    BulkReport, Cancelled, Explanation, Filter, MigrateOptions, MigrationReport, Registry,
    Schedule, Settled, Target,
};
use gen_durable::{
    Client, Clock, Delivery, Engine, Entry, Event, Fsm, OutcomeKind, QueueConfig, Result,
};
use gen_durable_testkit::{
    epoch, Instance, SignalSender, Tally, TestDb, TestKit, KIT_LEASE, KIT_NODE,
};
use serde_json::Value;

/// Insert options a scenario may set: the library's own, applied to either backend's
/// builder with `.options(o)`.
pub use gen_durable::InsertOptions as Opts;

/// How a step sends a signal while it runs (to test signals arriving mid-step).
#[derive(Debug, Clone)]
pub enum Mailer {
    Kit(SignalSender),
    Pg(Client),
}

impl Mailer {
    pub async fn send(&self, id: i64, name: &str, payload: Value) {
        match self {
            Mailer::Kit(s) => s.send(id, name, payload),
            Mailer::Pg(c) => {
                c.signal(id, name, payload)
                    .await
                    .expect("a signal sent from a step");
            }
        }
    }
}

/// Mailers by scenario tag: steps are static code and find theirs through the state's tag.
static MAILERS: LazyLock<Mutex<HashMap<String, Mailer>>> = LazyLock::new(Default::default);

pub fn mailer(tag: &str) -> Mailer {
    MAILERS
        .lock()
        .unwrap()
        .get(tag)
        .cloned()
        .unwrap_or_else(|| panic!("no mailer for {tag}"))
}

/// Who both backends' operator actions are recorded as.
pub const ACTOR: &str = "conformance";

/// What a scenario can do, on either backend.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// Unique per scenario and backend: keys global logs and unique keys.
    fn tag(&self) -> &str;
    /// The clock's now.
    fn now(&self) -> DateTime<Utc>;
    async fn insert<F: Fsm>(&mut self, state: F::State, o: Opts) -> Result<i64>;
    async fn insert_all<F: Fsm>(&mut self, rows: Vec<(F::State, Opts)>) -> Result<Vec<i64>>;
    async fn signal(
        &mut self,
        to: impl Into<Target> + Send,
        name: &str,
        payload: Value,
    ) -> Result<Delivery>;
    async fn signal_dedup(
        &mut self,
        to: impl Into<Target> + Send,
        name: &str,
        payload: Value,
        key: &str,
    ) -> Result<Delivery>;
    /// A wait that answers now (the Postgres one with a zero timeout).
    async fn wait(&mut self, to: impl Into<Target> + Send, until_terminal: bool)
        -> Result<Settled>;
    async fn cancel(&mut self, id: i64) -> Result<Cancelled>;
    async fn retry(&mut self, id: i64) -> Result<()>;
    /// `Client::restart` / `TestKit::restart`.
    async fn restart(&mut self, id: i64, step: &str) -> Result<()>;
    /// `Client::history` / `TestKit::history`: every entry of `id`, oldest first.
    async fn history(&mut self, id: i64) -> Vec<gen_durable::HistoryEntry>;
    /// `Client::fork` / `TestKit::fork`.
    async fn fork(&mut self, id: i64, entry: i64) -> Result<i64>;
    /// `Client::restart_from` / `TestKit::restart_from`.
    async fn restart_from(&mut self, id: i64, entry: i64) -> Result<()>;
    /// `set_gate`: true if the gate is new or its limit changed.
    async fn set_gate(&mut self, name: &str, gate: gen_durable::Gate) -> Result<bool>;
    /// `set_rate_limit`: true if the limit is new or changed.
    async fn set_rate_limit(&mut self, name: &str, limit: gen_durable::RateLimit) -> Result<bool>;
    /// `cancel_where`: every live instance `filter` matches (`dry_run`: only counted).
    async fn cancel_where(&mut self, filter: &Filter, dry_run: bool) -> Result<BulkReport>;
    /// `retry_where`: every failed instance `filter` matches (`dry_run`: only counted).
    async fn retry_where(&mut self, filter: &Filter, dry_run: bool) -> Result<BulkReport>;
    /// `pause_queue`: true if newly paused.
    async fn pause_queue(&mut self, queue: &str, reason: Option<&str>) -> Result<bool>;
    /// `resume_queue`: true if it was paused.
    async fn resume_queue(&mut self, queue: &str) -> Result<bool>;
    /// `paused_queues`: (queue, reason), by name.
    async fn paused_queues(&mut self) -> Vec<(String, Option<String>)>;
    /// A worker claims runnable instance `id` and dies before committing; then one
    /// reaper pass (see `TestKit::lose_lease`).
    async fn lose_lease(&mut self, id: i64) -> Result<()>;
    /// A worker of node `KIT_NODE` claims runnable, due instance `id` and keeps running
    /// its step (see `TestKit::claim`) until `lose_lease(id)`. Call `lose_lease` before
    /// the next `run()`: the Postgres backend's `run()` waits for no executing row.
    async fn claim(&mut self, id: i64) -> Result<()>;
    /// `Client::explain` / `TestKit::explain`. The Postgres backend first announces node
    /// `KIT_NODE`, picking from the scenarios' queues and running the registry's FSMs, as a
    /// node running now would: the kit has no nodes and runs everything it knows.
    async fn explain(&mut self, to: impl Into<Target> + Send) -> Result<Explanation>;
    async fn advance(&mut self, by: Duration);
    /// Runs every due step until nothing is due; what was committed.
    async fn run(&mut self) -> Tally;
    async fn get(&mut self, id: i64) -> Instance;
    /// The instance holding `key`, or once none does the newest one inserted with it.
    async fn get_by_key(&mut self, key: &str) -> Instance;
    /// Overwrites the stored state with raw JSON (a state an older type wrote).
    async fn overwrite_state(&mut self, id: i64, state: Value);
    /// The committed kinds of `id`, from the `step.stop` events.
    fn kinds(&self, id: i64) -> Vec<OutcomeKind>;
    /// Every event emitted so far, in order, other than `step.stop` (which `kinds` reads)
    /// and the Postgres engine's own (node, listener, lease, wait, …): the kinds both
    /// backends emit — schedules and instance migrations.
    fn events(&self) -> Vec<Event>;
    /// From now on the nodes, the client and the kit run `registry`: its FSM versions and
    /// instance migrations (a deploy of new code).
    async fn deploy(&mut self, registry: Registry);
    /// `Client::migrate_instances` / `TestKit::migrate_instances`.
    async fn migrate_instances(
        &mut self,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
    ) -> Result<MigrationReport>;
    /// Adds a periodic schedule, its first fire time the first after the clock's now (the
    /// Postgres engine declares it at the next `run()`: call `run()` before `advance`). A
    /// schedule of a name already added replaces it, as a new release redeclares it.
    async fn schedule(&mut self, schedule: Schedule);
    async fn close(self);
}

/// The events both backends emit, as `Backend::events` returns them.
fn shared_events(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::ScheduleFired { .. }
                    | Event::ScheduleSkipped { .. }
                    | Event::InstanceMigrated { .. }
                    | Event::MigrationFailed { .. }
            )
        })
        .cloned()
        .collect()
}

fn kinds_of(events: &[Event], id: i64) -> Vec<OutcomeKind> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::StepStop { id: i, kind, .. } if *i == id => Some(*kind),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The in-memory kit.

pub struct Kit {
    kit: TestKit,
    tag: String,
}

impl Kit {
    pub fn new(scenario: &str) -> Kit {
        let kit = TestKit::new()
            .with_registry(crate::fsms::registry())
            .with_actor(ACTOR)
            .with_max_steps(2_000);
        let tag = format!("kit:{scenario}");
        MAILERS
            .lock()
            .unwrap()
            .insert(tag.clone(), Mailer::Kit(kit.sender()));
        Kit { kit, tag }
    }
}

impl Backend for Kit {
    fn tag(&self) -> &str {
        &self.tag
    }
    fn now(&self) -> DateTime<Utc> {
        self.kit.now()
    }
    async fn insert<F: Fsm>(&mut self, state: F::State, o: Opts) -> Result<i64> {
        self.kit.insert::<F>(state).options(o).await
    }
    async fn insert_all<F: Fsm>(&mut self, rows: Vec<(F::State, Opts)>) -> Result<Vec<i64>> {
        let entries = rows.into_iter().map(|(s, o)| Entry::<F>::new(s).options(o));
        self.kit.insert_all(entries).await
    }
    async fn signal(
        &mut self,
        to: impl Into<Target> + Send,
        name: &str,
        payload: Value,
    ) -> Result<Delivery> {
        self.kit.signal(to, name, payload).await
    }
    async fn signal_dedup(
        &mut self,
        to: impl Into<Target> + Send,
        name: &str,
        payload: Value,
        key: &str,
    ) -> Result<Delivery> {
        self.kit.signal(to, name, payload).dedup_key(key).await
    }
    async fn wait(
        &mut self,
        to: impl Into<Target> + Send,
        until_terminal: bool,
    ) -> Result<Settled> {
        let w = self.kit.wait(to);
        if until_terminal {
            w.until_terminal().await
        } else {
            w.await
        }
    }
    async fn cancel(&mut self, id: i64) -> Result<Cancelled> {
        self.kit.cancel(id).await
    }
    async fn retry(&mut self, id: i64) -> Result<()> {
        self.kit.retry(id).await
    }
    async fn restart(&mut self, id: i64, step: &str) -> Result<()> {
        self.kit.restart(id, step).await
    }
    async fn history(&mut self, id: i64) -> Vec<gen_durable::HistoryEntry> {
        self.kit.entries(id)
    }
    async fn fork(&mut self, id: i64, entry: i64) -> Result<i64> {
        self.kit.fork(id, entry).await
    }
    async fn restart_from(&mut self, id: i64, entry: i64) -> Result<()> {
        self.kit.restart_from(id, entry).await
    }
    async fn set_gate(&mut self, name: &str, gate: gen_durable::Gate) -> Result<bool> {
        self.kit.set_gate(name, gate).await
    }
    async fn set_rate_limit(&mut self, name: &str, limit: gen_durable::RateLimit) -> Result<bool> {
        self.kit.set_rate_limit(name, limit).await
    }
    async fn cancel_where(&mut self, filter: &Filter, dry_run: bool) -> Result<BulkReport> {
        self.kit.cancel_where(filter, dry_run).await
    }
    async fn retry_where(&mut self, filter: &Filter, dry_run: bool) -> Result<BulkReport> {
        self.kit.retry_where(filter, dry_run).await
    }
    async fn pause_queue(&mut self, queue: &str, reason: Option<&str>) -> Result<bool> {
        self.kit.pause_queue(queue, reason).await
    }
    async fn resume_queue(&mut self, queue: &str) -> Result<bool> {
        self.kit.resume_queue(queue).await
    }
    async fn paused_queues(&mut self) -> Vec<(String, Option<String>)> {
        let paused = self.kit.paused_queues().into_iter();
        paused.map(|p| (p.queue, p.reason)).collect()
    }
    async fn lose_lease(&mut self, id: i64) -> Result<()> {
        self.kit.lose_lease(id)
    }
    async fn claim(&mut self, id: i64) -> Result<()> {
        self.kit.claim(id)
    }
    async fn explain(&mut self, to: impl Into<Target> + Send) -> Result<Explanation> {
        self.kit.explain(to).await
    }
    async fn advance(&mut self, by: Duration) {
        self.kit.advance(by);
    }
    async fn run(&mut self) -> Tally {
        self.kit.run_until_idle().await
    }
    async fn get_by_key(&mut self, key: &str) -> Instance {
        self.kit.instance_by_key(key)
    }
    async fn get(&mut self, id: i64) -> Instance {
        self.kit.instance(id)
    }
    async fn overwrite_state(&mut self, id: i64, state: Value) {
        self.kit.overwrite_state(id, state);
    }
    fn kinds(&self, id: i64) -> Vec<OutcomeKind> {
        self.kit.kinds(id)
    }
    fn events(&self) -> Vec<Event> {
        shared_events(self.kit.events())
    }
    async fn deploy(&mut self, registry: Registry) {
        self.kit = std::mem::take(&mut self.kit).with_registry(registry);
    }
    async fn migrate_instances(
        &mut self,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
    ) -> Result<MigrationReport> {
        self.kit.migrate_instances(fsm, to, opts).await
    }
    async fn schedule(&mut self, schedule: Schedule) {
        self.kit = std::mem::take(&mut self.kit).schedule(schedule);
    }
    async fn close(self) {
        MAILERS.lock().unwrap().remove(&self.tag);
    }
}

// ---------------------------------------------------------------------------------------
// Postgres: a fresh database, a client and engines on one manual clock.

pub struct Pg {
    db: TestDb,
    client: Client,
    clock: Clock,
    events: Arc<Mutex<Vec<Event>>>,
    tag: String,
    max_steps: usize,
    /// What each `run()`'s engine runs.
    registry: Registry,
    schedules: Vec<Schedule>,
}

/// How long one `run()` may take before the scenario fails.
const RUN_DEADLINE: Duration = Duration::from_secs(30);

impl Pg {
    pub async fn new(scenario: &str) -> Pg {
        let db = TestDb::with_pool_size(8).await;
        let clock = Clock::manual(epoch());
        let client = Client::new(db.pool().clone())
            .with_pooler(db.pooler())
            .with_clock(clock.clone())
            .with_actor(ACTOR)
            .with_registry(crate::fsms::registry());
        let tag = format!("pg:{scenario}");
        MAILERS
            .lock()
            .unwrap()
            .insert(tag.clone(), Mailer::Pg(client.clone()));
        Pg {
            db,
            client,
            clock,
            events: Arc::default(),
            tag,
            max_steps: 2_000,
            registry: crate::fsms::registry(),
            schedules: Vec::new(),
        }
    }

    /// The database, for the scenario's own checks (straight to the server when the
    /// client and the engines go through a pooler).
    pub fn pool(&self) -> &sqlx::PgPool {
        self.db.direct()
    }

    async fn engine(&self) -> Engine {
        let fast = |n| {
            QueueConfig::new(n)
                .with_poll_interval(Duration::from_millis(20))
                .with_max_poll_interval(Duration::from_millis(20))
        };
        let events = self.events.clone();
        let builder = self
            .schedules
            .iter()
            .fold(Engine::builder(self.db.pool().clone()), |b, s| {
                b.schedule(s.clone())
            });
        builder
            .with_pooler(self.db.pooler())
            .with_listener(self.db.listener())
            .with_registry(self.registry.clone())
            .with_clock(self.clock.clone())
            // One step at a time on "conf", in the pick's order, like the kit.
            .queue_with("conf", fast(1))
            .queue_with("par", fast(4))
            .with_timeout_interval(Duration::from_millis(20))
            .on_event(move |e| events.lock().unwrap().push(e.clone()))
            .start()
            .await
            .expect("engine starts")
    }

    /// Whether the engine's scheduler has made its pass at the clock's time: every
    /// schedule is declared and its next fire time is after now (or it never fires
    /// again). The fire times it inserted are committed with that pass.
    async fn scheduled(&self) -> bool {
        let names: Vec<&str> = self.schedules.iter().map(Schedule::name).collect();
        let passed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM gd_schedules
              WHERE name = ANY ($1) AND (next_fire IS NULL OR next_fire > $2)",
        )
        .bind(&names)
        .bind(self.now())
        .fetch_one(self.db.direct())
        .await
        .expect("schedules query");
        passed == names.len() as i64
    }

    /// Nothing executing, nothing due: no runnable row of a queue that is not paused
    /// eligible by the clock, and no parked row past its deadline.
    async fn idle(&self) -> bool {
        sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM gd_instances
                                 WHERE status = 'executing'
                                    OR (status = 'runnable' AND eligible_at <= $1
                                        AND queue NOT IN (SELECT queue FROM gd_queue_pauses))
                                    OR (status = 'awaiting_signal' AND await_deadline <= $1))",
        )
        .bind(self.now())
        .fetch_one(self.db.direct())
        .await
        .expect("idle query")
    }

    fn step_stops(&self, from: usize) -> Vec<(i64, OutcomeKind)> {
        self.events.lock().unwrap()[from..]
            .iter()
            .filter_map(|e| match e {
                Event::StepStop { id, kind, .. } => Some((*id, *kind)),
                _ => None,
            })
            .collect()
    }
}

impl Backend for Pg {
    fn tag(&self) -> &str {
        &self.tag
    }
    fn now(&self) -> DateTime<Utc> {
        self.clock.now_param().expect("manual clock")
    }
    async fn insert<F: Fsm>(&mut self, state: F::State, o: Opts) -> Result<i64> {
        self.client.insert::<F>(state).options(o).await
    }
    async fn insert_all<F: Fsm>(&mut self, rows: Vec<(F::State, Opts)>) -> Result<Vec<i64>> {
        let entries = rows.into_iter().map(|(s, o)| Entry::<F>::new(s).options(o));
        self.client.insert_all(entries).await
    }
    async fn signal(
        &mut self,
        to: impl Into<Target> + Send,
        name: &str,
        payload: Value,
    ) -> Result<Delivery> {
        self.client.signal(to, name, payload).await
    }
    async fn signal_dedup(
        &mut self,
        to: impl Into<Target> + Send,
        name: &str,
        payload: Value,
        key: &str,
    ) -> Result<Delivery> {
        self.client.signal(to, name, payload).dedup_key(key).await
    }
    async fn wait(
        &mut self,
        to: impl Into<Target> + Send,
        until_terminal: bool,
    ) -> Result<Settled> {
        let w = self.client.wait(to).timeout(Duration::ZERO);
        if until_terminal {
            w.until_terminal().await
        } else {
            w.await
        }
    }
    async fn cancel(&mut self, id: i64) -> Result<Cancelled> {
        let c = self.client.cancel(id).await?;
        Ok(Cancelled {
            failed: c.failed,
            after_current_step: c.after_current_step,
        })
    }
    async fn retry(&mut self, id: i64) -> Result<()> {
        self.client.retry(id).await
    }
    async fn restart(&mut self, id: i64, step: &str) -> Result<()> {
        self.client.restart(id, step).await
    }
    async fn history(&mut self, id: i64) -> Vec<gen_durable::HistoryEntry> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .client
                .history(id, after, gen_durable::HISTORY_PAGE_MAX)
                .await
                .unwrap();
            all.extend(page.entries);
            match page.next {
                Some(n) => after = Some(n),
                None => return all,
            }
        }
    }
    async fn fork(&mut self, id: i64, entry: i64) -> Result<i64> {
        self.client.fork(id, entry).await
    }
    async fn restart_from(&mut self, id: i64, entry: i64) -> Result<()> {
        self.client.restart_from(id, entry).await
    }
    async fn set_gate(&mut self, name: &str, gate: gen_durable::Gate) -> Result<bool> {
        self.client.set_gate(name, gate).await
    }
    async fn set_rate_limit(&mut self, name: &str, limit: gen_durable::RateLimit) -> Result<bool> {
        self.client.set_rate_limit(name, limit).await
    }
    async fn cancel_where(&mut self, filter: &Filter, dry_run: bool) -> Result<BulkReport> {
        self.client.cancel_where(filter, dry_run).await
    }
    async fn retry_where(&mut self, filter: &Filter, dry_run: bool) -> Result<BulkReport> {
        self.client.retry_where(filter, dry_run).await
    }
    async fn pause_queue(&mut self, queue: &str, reason: Option<&str>) -> Result<bool> {
        self.client.pause_queue(queue, reason).await
    }
    async fn resume_queue(&mut self, queue: &str) -> Result<bool> {
        self.client.resume_queue(queue).await
    }
    async fn paused_queues(&mut self) -> Vec<(String, Option<String>)> {
        let paused = self.client.paused_queues().await.expect("paused queues");
        paused.into_iter().map(|p| (p.queue, p.reason)).collect()
    }
    async fn lose_lease(&mut self, id: i64) -> Result<()> {
        // Claimed by a node that dies at once: its lease has expired by the clock. Then
        // one pass of the engine's reaper statement.
        // A row `claim` claimed: its lease ends now.
        let pool = self.db.direct();
        let claimed = sqlx::query(
            "UPDATE gd_instances
                SET status = 'executing', locked_by = coalesce(locked_by, 'lost-node'),
                    lease_epoch = lease_epoch + 1, lease_expires_at = $2 - interval '1 second'
              WHERE id = $1 AND (status = 'runnable' AND eligible_at <= $2
                                 OR status = 'executing' AND locked_by = $3)",
        )
        .bind(id)
        .bind(self.now())
        .bind(KIT_NODE)
        .execute(pool)
        .await?
        .rows_affected();
        if claimed == 0 {
            let status = self.get(id).await.status;
            return Err(gen_durable::Error::WrongStatus {
                id,
                status,
                what: "only a runnable, due instance can be claimed and lose its lease",
            });
        }
        sqlx::query("SELECT * FROM gd_reap(500, $1)")
            .bind(self.now())
            .fetch_all(pool)
            .await?;
        Ok(())
    }
    async fn claim(&mut self, id: i64) -> Result<()> {
        // What the engine's claim writes, by a node that keeps the row.
        let claimed = sqlx::query(
            "UPDATE gd_instances SET status = 'executing', locked_by = $3,
                    lease_epoch = lease_epoch + 1,
                    lease_expires_at = $2 + $4 * interval '1 millisecond', updated_at = $2
              WHERE id = $1 AND status = 'runnable' AND eligible_at <= $2",
        )
        .bind(id)
        .bind(self.now())
        .bind(KIT_NODE)
        .bind(KIT_LEASE.as_millis() as i64)
        .execute(self.db.direct())
        .await?
        .rows_affected();
        if claimed == 0 {
            let status = self.get(id).await.status;
            return Err(gen_durable::Error::WrongStatus {
                id,
                status,
                what: "only a runnable, due instance can be claimed",
            });
        }
        Ok(())
    }
    async fn explain(&mut self, to: impl Into<Target> + Send) -> Result<Explanation> {
        let fsms: Vec<String> = self
            .registry
            .iter()
            .map(|e| format!("{}@{}", e.name, e.version))
            .collect();
        sqlx::query(
            "INSERT INTO gd_nodes (node_id, queues, fsms, started_at, last_seen_at)
             VALUES ($1, '{conf,par}', $2, $3, $3)
             ON CONFLICT (node_id) DO UPDATE SET fsms = $2, last_seen_at = $3",
        )
        .bind(KIT_NODE)
        .bind(fsms)
        .bind(self.now())
        .execute(self.db.direct())
        .await?;
        self.client.explain(to).await
    }
    async fn advance(&mut self, by: Duration) {
        self.clock.advance(by);
    }
    async fn run(&mut self) -> Tally {
        let from = self.events.lock().unwrap().len();
        let engine = self.engine().await;
        let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
        loop {
            if self.scheduled().await && self.idle().await {
                break;
            }
            let stops = self.step_stops(from);
            if stops.len() > self.max_steps {
                let mut per: HashMap<i64, usize> = HashMap::new();
                for (id, _) in &stops {
                    *per.entry(*id).or_default() += 1;
                }
                let (id, n) = per.into_iter().max_by_key(|(_, n)| *n).unwrap();
                let i = Instance::load(self.pool(), id).await.unwrap().unwrap();
                panic!(
                    "{} steps without going idle: {n} by {}",
                    stops.len(),
                    i.describe()
                );
            }
            if tokio::time::Instant::now() > deadline {
                panic!("not idle after {RUN_DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Drained, every committed step has reported its `step.stop`.
        engine.shutdown(Duration::from_secs(10)).await;
        let mut tally = Tally::default();
        for (_, kind) in self.step_stops(from) {
            tally.record(kind);
        }
        tally
    }
    async fn get_by_key(&mut self, key: &str) -> Instance {
        Instance::load_by_key(self.db.direct(), key)
            .await
            .expect("load instance by key")
            .unwrap_or_else(|| panic!("no instance with the key {key:?}"))
    }
    async fn get(&mut self, id: i64) -> Instance {
        Instance::load(self.db.direct(), id)
            .await
            .expect("load instance")
            .unwrap_or_else(|| panic!("no instance {id}"))
    }
    async fn overwrite_state(&mut self, id: i64, state: Value) {
        sqlx::query("UPDATE gd_instances SET state = $2 WHERE id = $1")
            .bind(id)
            .bind(state)
            .execute(self.db.direct())
            .await
            .expect("overwrite state");
    }
    fn kinds(&self, id: i64) -> Vec<OutcomeKind> {
        kinds_of(&self.events.lock().unwrap(), id)
    }
    fn events(&self) -> Vec<Event> {
        shared_events(&self.events.lock().unwrap())
    }
    async fn deploy(&mut self, registry: Registry) {
        self.client = self.client.clone().with_registry(registry.clone());
        self.registry = registry;
    }
    async fn migrate_instances(
        &mut self,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
    ) -> Result<MigrationReport> {
        self.client.migrate_instances(fsm, to, opts).await
    }
    async fn schedule(&mut self, schedule: Schedule) {
        // Each `run()` starts a node with these: the next one declares the replacement.
        self.schedules.retain(|s| s.name() != schedule.name());
        self.schedules.push(schedule);
    }
    async fn close(self) {
        MAILERS.lock().unwrap().remove(&self.tag);
        self.db.close().await;
    }
}
