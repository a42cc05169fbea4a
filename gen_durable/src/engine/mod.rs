//! The engine: per-queue pickers, the executor, group commit, leases and the
//! background services that keep them honest (spec §7).
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> gen_durable::Result<()> {
//! use std::time::Duration;
//! use gen_durable::Engine;
//! let engine = Engine::builder(pool)
//!     .queue("default", 10)
//!     .queue("checkout", 5)
//!     .start()
//!     .await?;
//! let report = engine.shutdown(Duration::from_secs(30)).await; // graceful drain
//! # Ok(()) }
//! ```
//!
//! Each background service is a unit with a start and a stop: one runner per queue
//! (picker, buffer, steps), the committer, the heartbeat, the reaper, the await-timeout
//! sweep, the collector and the wake-up listener. They stop through cancellation tokens and one
//! `TaskTracker`.

mod collector;
mod committer;
mod config;
mod heartbeat;
mod listener;
mod queue;
mod reaper;
mod timeouts;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::QueueConfig;
pub use queue::QueueDrain;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::fsm::Fsm;
use crate::registry::Registry;
use crate::telemetry::{Event, EventHandler, Telemetry};
use config::EngineConfig;

/// What every service of one engine shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) cfg: EngineConfig,
    pub(crate) clock: Clock,
    pub(crate) registry: Registry,
    pub(crate) names: Vec<String>,
    pub(crate) versions: Vec<i32>,
    /// `(name, version)` of every FSM this node runs, and its queues: what it announces.
    pub(crate) fsms: Vec<(String, i32)>,
    pub(crate) queue_names: Vec<String>,
    pub(crate) telemetry: Telemetry,
    /// Every row this node holds a lease on (buffered or executing): id → the epoch of
    /// its newest claim here. Only that claim removes it (see [`Shared::unhold`]).
    pub(crate) leases: Mutex<HashMap<i64, i64>>,
    pub(crate) committer: mpsc::Sender<committer::CommitRequest>,
    pub(crate) timeouts_wake: Notify,
    /// Coalesces the wake-ups of outcome commits.
    pub(crate) notifier: Arc<crate::notify::Notifier>,
    /// The cancellation token of every step running on this node, by instance id, with
    /// the epoch of the claim it runs under.
    pub(crate) running: Mutex<HashMap<i64, (i64, CancellationToken)>>,
    /// The database's default isolation is not READ COMMITTED: run each engine statement
    /// in a transaction that sets it (see [`Shared::conn`]).
    pub(crate) set_isolation: bool,
}

impl Shared {
    /// Resolves `ctx.cancelled()` of the step running instance `id` here, if any.
    pub(crate) fn cancel_step(&self, id: i64) {
        if let Some((_, token)) = self.running.lock().expect("running table").get(&id) {
            token.cancel();
        }
    }

    /// Records the claim `(id, epoch)`: its lease is heartbeated from now on.
    pub(crate) fn hold(&self, id: i64, epoch: i64) {
        self.leases.lock().expect("lease table").insert(id, epoch);
    }

    /// Forgets the claim `(id, epoch)` — and only that claim: a stale run of a row that
    /// was reaped and claimed here again must not unregister the newer claim's lease (it
    /// would go unheartbeated and be reaped in turn) nor its cancellation token.
    pub(crate) fn unhold(&self, id: i64, epoch: i64) {
        let mut leases = self.leases.lock().expect("lease table");
        if leases.get(&id) == Some(&epoch) {
            leases.remove(&id);
        }
        drop(leases);
        let mut running = self.running.lock().expect("running table");
        if running.get(&id).is_some_and(|(e, _)| *e == epoch) {
            running.remove(&id);
        }
    }

    /// A connection for one engine statement, at READ COMMITTED whatever the database's
    /// default: every engine statement relies on it (each statement of the commit
    /// function sees what committed before it; a locking read follows a row's newest
    /// version instead of failing with a serialization error).
    pub(crate) async fn conn(&self) -> Result<StatementConn> {
        Ok(if self.set_isolation {
            StatementConn::Transaction(self.pool.begin_with(BEGIN_READ_COMMITTED).await?)
        } else {
            StatementConn::Plain(self.pool.acquire().await?)
        })
    }
}

/// Begins a READ COMMITTED transaction and takes its first snapshot, in one round trip.
/// The snapshot makes a later `SET TRANSACTION ISOLATION LEVEL` fail at once, with
/// PostgreSQL's "must be called before any query" (see `ctx.transaction()`).
pub(crate) const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT";

/// See [`Shared::conn`]; finish it with [`StatementConn::finish`].
#[derive(Debug)]
pub(crate) enum StatementConn {
    Plain(sqlx::pool::PoolConnection<sqlx::Postgres>),
    Transaction(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl StatementConn {
    pub(crate) fn get(&mut self) -> &mut sqlx::PgConnection {
        match self {
            StatementConn::Plain(c) => c,
            StatementConn::Transaction(t) => t,
        }
    }

    /// Commits the statement's transaction, if it has one.
    pub(crate) async fn finish(self) -> Result<()> {
        if let StatementConn::Transaction(t) = self {
            t.commit().await?;
        }
        Ok(())
    }
}

/// Whether new connections of `pool` start their transactions at another level than
/// READ COMMITTED (a database or role default).
async fn isolation_differs(pool: &PgPool) -> Result<bool> {
    let level: String =
        sqlx::query_scalar("SELECT current_setting('default_transaction_isolation')")
            .fetch_one(pool)
            .await?;
    Ok(level != "read committed")
}

/// Configures and starts an [`Engine`].
#[derive(Debug)]
#[must_use = "call .start() to run the engine"]
pub struct EngineBuilder {
    pool: PgPool,
    queues: Vec<(String, QueueConfig)>,
    cfg: EngineConfig,
    clock: Clock,
    registry: Registry,
    telemetry: Telemetry,
    notify_window: Duration,
}

impl EngineBuilder {
    /// Runs queue `name` with `concurrency` steps at once and the default queue settings.
    pub fn queue(self, name: impl Into<String>, concurrency: usize) -> Self {
        self.queue_with(name, QueueConfig::new(concurrency))
    }

    /// Runs queue `name` with the given settings.
    pub fn queue_with(mut self, name: impl Into<String>, cfg: QueueConfig) -> Self {
        self.queues.push((name.into(), cfg));
        self
    }

    /// How long a claim holds a row without a heartbeat (default 30 s).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.cfg.lease_ttl = ttl;
        self
    }

    /// How often leases are extended (default `lease_ttl / 3`).
    pub fn heartbeat_interval(mut self, every: Duration) -> Self {
        self.cfg.heartbeat_interval = Some(every);
        self
    }

    /// How often the reaper looks for expired leases (default 1 s).
    pub fn reaper_interval(mut self, every: Duration) -> Self {
        self.cfg.reaper_interval = every;
        self
    }

    /// The longest the await-timeout sweep sleeps (default 1 s).
    pub fn timeout_interval(mut self, every: Duration) -> Self {
        self.cfg.timeout_interval = every;
        self
    }

    /// Turns the reaper on or off on this node (default on).
    pub fn reaper(mut self, on: bool) -> Self {
        self.cfg.reaper = on;
        self
    }

    /// Turns the await-timeout sweep on or off on this node (default on).
    pub fn await_timeouts(mut self, on: bool) -> Self {
        self.cfg.timeouts = on;
        self
    }

    /// Turns the collector of finished instances on or off on this node (default on).
    pub fn collector(mut self, on: bool) -> Self {
        self.cfg.collector = on;
        self
    }

    /// How long `done`/`failed` rows are kept before the collector deletes them
    /// (default 7 days, counted from their last update).
    pub fn retention(mut self, keep: Duration) -> Self {
        self.cfg.retention = keep;
        self
    }

    /// How often the collector runs (default 60 s) and how many rows one of its
    /// statements deletes at most (default 1,000).
    pub fn collector_schedule(mut self, every: Duration, batch: usize) -> Self {
        self.cfg.collector_interval = every;
        self.cfg.collector_batch = batch;
        self
    }

    /// Sends at most one wake-up per queue per `window` for committed `next`/`replay`
    /// outcomes (default 20 ms; zero: one per commit). See `Client::notify_window`.
    pub fn notify_window(mut self, window: Duration) -> Self {
        self.notify_window = window;
        self
    }

    /// Most outcomes committed in one group commit (default 512).
    pub fn commit_batch(mut self, n: usize) -> Self {
        self.cfg.commit_batch = n;
        self
    }

    /// This node's id, recorded as `locked_by` (default: host, pid and a counter).
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.cfg.node_id = id.into();
        self
    }

    /// Registers FSM `T` explicitly (linked FSMs are known without it).
    pub fn fsm<T: Fsm>(mut self) -> Self {
        self.registry.register::<T>();
        self
    }

    /// Runs only the FSMs of `registry` instead of every linked one.
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Calls `handler` with every telemetry [`Event`].
    pub fn on_event(mut self, handler: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        let h: EventHandler = Arc::new(handler);
        self.telemetry.add(h);
        self
    }

    /// Uses `clock` for `$now` in every statement (tests only; see [`Clock`]).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Validates the configuration and starts every service.
    pub async fn start(self) -> Result<Engine> {
        self.cfg.validate()?;
        if self.pool.options().get_max_connections() < 2 {
            return Err(Error::InvalidConfig(
                "the engine's pool needs at least 2 connections: one stays on LISTEN for wake-ups"
                    .into(),
            ));
        }
        if self.queues.is_empty() {
            return Err(Error::InvalidConfig(
                "an engine needs at least one queue: .queue(name, concurrency)".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (name, q) in &self.queues {
            q.validate(name)?;
            if !seen.insert(name.clone()) {
                return Err(Error::InvalidConfig(format!(
                    "queue {name:?} is configured twice"
                )));
            }
        }
        if self.registry.iter().next().is_none() {
            return Err(Error::InvalidConfig(
                "no FSM to run: none is linked (#[durable_fsm] / #[durable_job]) and none was registered with .fsm::<T>()".into(),
            ));
        }
        let set_isolation = isolation_differs(&self.pool).await?;
        let (names, versions) = self.registry.name_version_arrays();
        let (commit_tx, commit_rx) = mpsc::channel(self.cfg.commit_batch * 4);
        let shared = Arc::new(Shared {
            pool: self.pool.clone(),
            cfg: self.cfg,
            clock: self.clock,
            registry: self.registry,
            fsms: names
                .iter()
                .cloned()
                .zip(versions.iter().copied())
                .collect(),
            queue_names: self.queues.iter().map(|(n, _)| n.clone()).collect(),
            names,
            versions,
            telemetry: self.telemetry,
            leases: Mutex::new(HashMap::new()),
            committer: commit_tx,
            timeouts_wake: Notify::new(),
            notifier: crate::notify::Notifier::new(self.pool.clone(), self.notify_window),
            running: Mutex::new(HashMap::new()),
            set_isolation,
        });

        let tracker = TaskTracker::new();
        let stop_picking = CancellationToken::new();
        let stop_services = CancellationToken::new();
        let stop_committer = CancellationToken::new();
        let (deadline_tx, deadline_rx) = watch::channel(None);

        tracker.spawn(committer::run(
            shared.clone(),
            commit_rx,
            stop_committer.clone(),
        ));
        tracker.spawn(heartbeat::run(shared.clone(), stop_services.clone()));
        if shared.cfg.reaper {
            tracker.spawn(reaper::run(shared.clone(), stop_services.clone()));
        }
        if shared.cfg.timeouts {
            tracker.spawn(timeouts::run(shared.clone(), stop_services.clone()));
        }
        if shared.cfg.collector {
            tracker.spawn(collector::run(shared.clone(), stop_services.clone()));
        }
        let mut wakes = HashMap::new();
        let mut runners = Vec::new();
        for (name, cfg) in self.queues {
            let wake = Arc::new(Notify::new());
            wakes.insert(name.clone(), wake.clone());
            let runner = queue::QueueRunner {
                queue: Arc::from(name.as_str()),
                name,
                cfg,
                shared: shared.clone(),
                wake,
                draining: stop_picking.clone(),
            };
            runners.push(tracker.spawn(runner.run(stop_picking.clone(), deadline_rx.clone())));
        }
        tracker.spawn(listener::run(
            shared.clone(),
            wakes.clone(),
            stop_services.clone(),
        ));
        tracker.close();
        Ok(Engine {
            shared,
            tracker,
            stop_picking,
            stop_services,
            stop_committer,
            deadline: deadline_tx,
            runners,
            wakes,
        })
    }
}

/// A running engine. Stop it with [`Engine::shutdown`]; dropping it without a drain
/// leaves its rows to be reaped when their leases expire, like a crash would.
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    tracker: TaskTracker,
    stop_picking: CancellationToken,
    stop_services: CancellationToken,
    stop_committer: CancellationToken,
    deadline: watch::Sender<Option<tokio::time::Instant>>,
    runners: Vec<JoinHandle<QueueDrain>>,
    wakes: HashMap<String, Arc<Notify>>,
}

/// What a graceful drain did, per queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainReport {
    /// One entry per queue.
    pub queues: Vec<QueueDrain>,
}

impl DrainReport {
    /// Buffered rows released, over all queues.
    pub fn released(&self) -> usize {
        self.queues.iter().map(|q| q.released).sum()
    }
    /// Steps running when the drain began, over all queues.
    pub fn in_flight(&self) -> usize {
        self.queues.iter().map(|q| q.in_flight).sum()
    }
    /// Steps cancelled at the deadline, over all queues.
    pub fn cancelled(&self) -> usize {
        self.queues.iter().map(|q| q.cancelled).sum()
    }
}

impl Engine {
    /// Starts configuring an engine on `pool`. Every FSM linked into the binary is known.
    pub fn builder(pool: PgPool) -> EngineBuilder {
        EngineBuilder {
            pool,
            queues: Vec::new(),
            cfg: EngineConfig {
                node_id: config::default_node_id(),
                lease_ttl: Duration::from_secs(30),
                heartbeat_interval: None,
                reaper_interval: Duration::from_secs(1),
                timeout_interval: Duration::from_secs(1),
                reaper: true,
                timeouts: true,
                commit_batch: 512,
                collector: true,
                retention: Duration::from_secs(7 * 24 * 3600),
                collector_interval: Duration::from_secs(60),
                collector_batch: crate::store::pg::admin::GC_BATCH as usize,
            },
            clock: Clock::database(),
            registry: Registry::linked(),
            telemetry: Telemetry::default(),
            notify_window: crate::notify::DEFAULT_WINDOW,
        }
    }

    /// This node's id (`locked_by` of the rows it holds).
    pub fn node_id(&self) -> &str {
        &self.shared.cfg.node_id
    }

    /// Picks on every queue and sweeps await timeouts now, instead of at the next poll.
    /// Useful after moving a manual [`Clock`]; production never needs it (NOTIFY and
    /// polling do this).
    pub fn wake(&self) {
        self.wakes.values().for_each(|w| w.notify_one());
        self.shared.timeouts_wake.notify_one();
    }

    /// Graceful drain (spec §7.5): stop picking; release every buffered row at once; let
    /// running steps finish until `timeout`; then cancel them and release their rows
    /// without counting an attempt. Emits `scheduler.drain` per queue.
    pub async fn shutdown(mut self, timeout: Duration) -> DrainReport {
        let _ = self
            .deadline
            .send(Some(tokio::time::Instant::now() + timeout));
        self.stop_picking.cancel();
        let mut report = DrainReport::default();
        for r in std::mem::take(&mut self.runners) {
            if let Ok(q) = r.await {
                report.queues.push(q);
            }
        }
        self.stop_services.cancel();
        self.stop_committer.cancel();
        self.tracker.wait().await;
        let _ = crate::store::pg::admin::forget(&self.shared.pool, &self.shared.cfg.node_id).await;
        report
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Dropped without shutdown: stop everything now, as a crash would, but without
        // leaving tasks running in the background.
        self.stop_picking.cancel();
        self.stop_services.cancel();
        self.stop_committer.cancel();
        for r in &self.runners {
            r.abort();
        }
    }
}
