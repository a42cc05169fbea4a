//! [`EngineBuilder`]: the engine's settings, checked and turned into running units.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::collector::Collector;
use crate::engine::committer::Committer;
use crate::engine::config::EngineConfig;
use crate::engine::handoff::Handoffs;
use crate::engine::heartbeat::Heartbeat;
use crate::engine::listener::{Listener, WakeListener};
use crate::engine::picker::{Picker, Queue};
use crate::engine::reaper::Reaper;
use crate::engine::scheduler::Scheduler;
use crate::engine::service;
use crate::engine::shared::{Claims, Db, Shared};
use crate::engine::timeouts::Timeouts;
use crate::engine::{Engine, QueueConfig};
use crate::flow::schedule::Schedule;
use crate::model::clock::Clock;
use crate::model::error::{Error, Result};
use crate::model::gate::Gate;
use crate::model::rate_limit::RateLimit;
use crate::runtime::fsm::Fsm;
use crate::runtime::instance_migration::Migration;
use crate::runtime::registry::Registry;
use crate::store::notify::Notifier;
use crate::store::pooler::Pooler;
use crate::telemetry::{Event, EventHandler, Telemetry};

impl EngineBuilder {
    pub(crate) fn new(pool: PgPool) -> Self {
        EngineBuilder {
            pool,
            queues: Vec::new(),
            cfg: EngineConfig::default(),
            clock: Clock::database(),
            registry: Registry::linked(),
            telemetry: Telemetry::default(),
            schedules: Vec::new(),
            gates: Vec::new(),
            rate_limits: Vec::new(),
        }
    }
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
    schedules: Vec<Schedule>,
    gates: Vec<(String, Gate)>,
    rate_limits: Vec<(String, RateLimit)>,
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
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.cfg.heartbeat.lease_ttl = ttl;
        self
    }

    /// How often leases are extended (default `lease_ttl / 3`).
    pub fn with_heartbeat_interval(mut self, every: Duration) -> Self {
        self.cfg.heartbeat.interval = Some(every);
        self
    }

    /// How often the reaper looks for expired leases (default 1 s).
    pub fn with_reaper_interval(mut self, every: Duration) -> Self {
        self.cfg.reaper.interval = every;
        self
    }

    /// The longest the await-timeout sweep sleeps (default 1 s).
    pub fn with_timeout_interval(mut self, every: Duration) -> Self {
        self.cfg.timeouts.interval = every;
        self
    }

    /// Turns the reaper on or off on this node (default on).
    pub fn with_reaper(mut self, on: bool) -> Self {
        self.cfg.reaper.enabled = on;
        self
    }

    /// Turns the await-timeout sweep on or off on this node (default on).
    pub fn with_await_timeouts(mut self, on: bool) -> Self {
        self.cfg.timeouts.enabled = on;
        self
    }

    /// Turns the collector of finished instances on or off on this node (default on).
    pub fn with_collector(mut self, on: bool) -> Self {
        self.cfg.collector.enabled = on;
        self
    }

    /// How long `done`/`failed` rows are kept before the collector deletes them
    /// (default 7 days, counted from their last update).
    pub fn with_retention(mut self, keep: Duration) -> Self {
        self.cfg.collector.retention = keep;
        self
    }

    /// How long the history's entries are kept (default 7 days): they are dropped a
    /// day at a time, once their whole day is older (`Client::history`).
    pub fn with_history_retention(mut self, keep: Duration) -> Self {
        self.cfg.collector.history_retention = keep;
        self
    }

    /// How often the collector runs (default 60 s) and how many rows one of its
    /// statements deletes at most (default 1,000).
    pub fn with_collector_schedule(mut self, every: Duration, batch: usize) -> Self {
        self.cfg.collector.interval = every;
        self.cfg.collector.batch = batch;
        self
    }

    /// Adds a periodic schedule, fired by this engine (and by every other engine that
    /// declares it: each fire time is inserted once across all of them). See [`Schedule`].
    /// Two schedules of one name are refused at `start`.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Declares gate `name`: at most `gate.limit()` steps of each of its keys run at once,
    /// across every node (see [`Gate`]). Written to the database at `start` (the last
    /// node to start with a different limit sets it; every node's next pick uses it).
    /// A name declared twice, or a limit out of range, is refused at `start`.
    pub fn gate(mut self, name: impl Into<String>, gate: Gate) -> Self {
        self.gates.push((name.into(), gate));
        self
    }

    /// Declares rate limit `name` (see [`RateLimit`]): rows inserted with
    /// `.rate_limit((name, key))` take tokens from the key's bucket each time their first
    /// step runs. Written to the database at `start` (the last node to start with a
    /// different limit sets it). A name declared twice, or a limit out of range, is
    /// refused at `start`.
    pub fn rate_limit(mut self, name: impl Into<String>, limit: RateLimit) -> Self {
        self.rate_limits.push((name.into(), limit));
        self
    }

    /// The longest the scheduler sleeps between checks (default 10 s). It sleeps until the
    /// next fire time when that comes sooner; this bounds how late it sees a schedule
    /// another node changed, or a manual clock moved.
    pub fn with_schedule_wait(mut self, wait: Duration) -> Self {
        self.cfg.scheduler.max_wait = wait;
        self
    }

    /// Sends at most one wake-up per queue per `window` for committed `next`/`replay`
    /// outcomes (default 20 ms; zero: one per commit). See `Client::with_notify_window`.
    pub fn with_notify_window(mut self, window: Duration) -> Self {
        self.cfg.notify_window = window;
        self
    }

    /// Most outcomes committed in one group commit (default 512).
    pub fn with_commit_batch(mut self, n: usize) -> Self {
        self.cfg.committer.batch = n;
        self
    }

    /// This node's id, recorded as `locked_by` (default: host, pid and a counter).
    pub fn with_node_id(mut self, id: impl Into<String>) -> Self {
        self.cfg.node_id = id.into();
        self
    }

    /// Registers FSM `T` explicitly (linked FSMs are known without it).
    pub fn register<T: Fsm>(mut self) -> Self {
        self.registry.register::<T>();
        self
    }

    /// Adds instance migration `M` (from `M::From` to `M`): rows of the old version this
    /// node claims are moved to the new one before their step runs, if this node has the
    /// new version registered. `#[durable_migration]` registers it on every node already.
    pub fn migration<M: Migration>(mut self) -> Self {
        self.registry.add_migration::<M>();
        self
    }

    /// Runs only the FSMs of `registry` instead of every linked one.
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Calls `handler` with every telemetry [`Event`].
    pub fn on_event(mut self, handler: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        let h: EventHandler = Arc::new(handler);
        self.telemetry.add(h);
        self
    }

    /// Where the engine LISTENs for wake-ups (default: a connection of its own from the
    /// pool's options). Behind PgBouncer in transaction mode, pass
    /// `WakeListener::direct(options of the database itself)`, or `WakeListener::Off` to
    /// poll only (see README "Behind a connection pooler").
    pub fn with_listener(mut self, listener: WakeListener) -> Self {
        self.cfg.listener.on = listener;
        self
    }

    /// Tells the engine what sits between it and Postgres (default [`Pooler::None`]).
    /// Behind PgBouncer in transaction mode without prepared-statement support, pass
    /// [`Pooler::Transaction`], and a listener that does not go through the pooler
    /// ([`Self::with_listener`]).
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.cfg.pooler = pooler;
        self
    }

    /// Uses `clock` for `$now` in every statement (tests only; see [`Clock`]).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Validates the configuration, checks the database's schema and starts every service.
    ///
    /// A database with no schema, or one that lacks a migration this version needs, is
    /// refused with [`Error::SchemaBehind`](crate::Error::SchemaBehind) (run
    /// [`migrate_schema`](crate::migrate_schema) first); one migrated by a later version,
    /// with [`Error::SchemaAhead`](crate::Error::SchemaAhead). Either way nothing is written.
    pub async fn start(self) -> Result<Engine> {
        self.validate()?;
        let EngineBuilder {
            pool,
            queues,
            cfg,
            clock,
            registry,
            telemetry,
            schedules,
            gates,
            rate_limits,
        } = self;
        let db = Db::new(pool.clone(), clock, cfg.pooler).await?;
        // Before the engine writes anything: a schema it cannot run on.
        crate::ops::schema::check(db.exec()).await?;
        // The history's partitions for today and the next days, before any step commits.
        crate::store::pg::history::keep(db.exec(), db.now(), cfg.collector.history_retention)
            .await?;
        // Checked before the engine writes anything: a schedule that would never fire.
        let scheduler = if schedules.is_empty() {
            None
        } else {
            let scheduler = Scheduler::new(
                schedules,
                cfg.scheduler.clone(),
                db.clone(),
                telemetry.clone(),
            );
            scheduler.check_ahead().await?;
            Some(scheduler)
        };
        if !gates.is_empty() {
            let gates: Vec<(String, i32)> = gates
                .into_iter()
                .map(|(name, g)| (name, g.limit() as i32))
                .collect();
            crate::store::pg::gate::declare(db.exec(), &gates, db.now()).await?;
        }
        if !rate_limits.is_empty() {
            let limits: Vec<(String, f64, f64)> = rate_limits
                .into_iter()
                .map(|(name, l)| (name, l.per_second(), l.capacity()))
                .collect();
            crate::store::pg::rate_limit::declare(db.exec(), &limits, db.now()).await?;
        }
        let (names, versions) = registry.name_version_arrays();
        let claims = Arc::new(Claims::default());
        let tracker = TaskTracker::new();
        let notifier = Notifier::new(pool.clone(), cfg.pooler, cfg.notify_window, tracker.clone());

        let handoffs = Arc::new(Handoffs::new(
            names.clone(),
            versions.clone(),
            crate::store::pg::millis(cfg.heartbeat.lease_ttl),
        ));
        let (committer, committer_service) = Committer {
            cfg: cfg.committer,
            db: db.clone(),
            node_id: cfg.node_id.clone(),
            telemetry: telemetry.clone(),
            notifier: notifier.clone(),
            handoffs: handoffs.clone(),
        }
        .start(&tracker);
        let timeouts_wake = Arc::new(Notify::new());
        let mut services = vec![service::start(
            Heartbeat {
                fsms: names
                    .iter()
                    .cloned()
                    .zip(versions.iter().copied())
                    .collect(),
                steps: crate::store::pg::admin::steps_by_tag(
                    registry.iter().map(|e| (e.name, e.version, e.steps)),
                ),
                queues: queues.iter().map(|(n, _)| n.clone()).collect(),
                cfg: cfg.heartbeat.clone(),
                db: db.clone(),
                telemetry: telemetry.clone(),
                node_id: cfg.node_id.clone(),
                claims: claims.clone(),
            },
            &tracker,
        )];
        if cfg.reaper.enabled {
            services.push(service::start(
                Reaper {
                    cfg: cfg.reaper,
                    lease_ttl: cfg.heartbeat.lease_ttl,
                    db: db.clone(),
                    telemetry: telemetry.clone(),
                },
                &tracker,
            ));
        }
        if cfg.timeouts.enabled {
            services.push(service::start(
                Timeouts {
                    cfg: cfg.timeouts,
                    db: db.clone(),
                    telemetry: telemetry.clone(),
                    wake: timeouts_wake.clone(),
                },
                &tracker,
            ));
        }
        if cfg.collector.enabled {
            services.push(service::start(
                Collector {
                    cfg: cfg.collector,
                    db: db.clone(),
                    telemetry: telemetry.clone(),
                },
                &tracker,
            ));
        }
        if let Some(scheduler) = scheduler {
            services.push(service::start(scheduler, &tracker));
        }
        let shared = Arc::new(Shared {
            db,
            node_id: cfg.node_id,
            lease_ttl: cfg.heartbeat.lease_ttl,
            registry,
            names,
            versions,
            telemetry: telemetry.clone(),
            claims: claims.clone(),
            committer,
            timeouts_wake,
            flow: std::sync::atomic::AtomicBool::new(true),
        });

        let stop_picking = CancellationToken::new();
        let (deadline_tx, deadline_rx) = watch::channel(None);
        let mut wakes = HashMap::new();
        let mut runners = Vec::new();
        for (name, cfg) in queues {
            let wake = Arc::new(Notify::new());
            wakes.insert(name.clone(), wake.clone());
            let name: Arc<str> = Arc::from(name.as_str());
            let handed = if cfg.gate_handoff {
                handoffs.open(&name)
            } else {
                Handoffs::closed()
            };
            let picker = Picker::new(
                Queue {
                    name,
                    cfg,
                    shared: shared.clone(),
                    wake,
                    draining: stop_picking.clone(),
                },
                handed,
            );
            runners.push(tracker.spawn(picker.run(stop_picking.clone(), deadline_rx.clone())));
        }
        if !matches!(cfg.listener.on, WakeListener::Off) {
            services.push(
                Listener {
                    cfg: cfg.listener,
                    pool,
                    telemetry,
                    claims,
                    queues: wakes.clone(),
                }
                .start(&tracker),
            );
        }
        tracker.close();
        Ok(Engine {
            shared,
            tracker,
            stop_picking,
            services,
            committer: committer_service,
            deadline: deadline_tx,
            runners,
            wakes,
        })
    }

    fn validate(&self) -> Result<()> {
        self.cfg.validate()?;
        self.registry.check_migrations()?;
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
        let mut seen = HashSet::new();
        for (name, q) in &self.queues {
            q.validate(name)?;
            if !seen.insert(name.clone()) {
                return Err(Error::InvalidConfig(format!(
                    "queue {name:?} is configured twice"
                )));
            }
        }
        let mut names = HashSet::new();
        for s in &self.schedules {
            if !names.insert(s.name()) {
                return Err(Error::InvalidConfig(format!(
                    "schedule {:?} is declared twice",
                    s.name()
                )));
            }
        }
        let mut gates = HashSet::new();
        for (name, gate) in &self.gates {
            gate.check(name)?;
            if !gates.insert(name.as_str()) {
                return Err(Error::InvalidConfig(format!(
                    "gate {name:?} is declared twice"
                )));
            }
        }
        let mut limits = HashSet::new();
        for (name, limit) in &self.rate_limits {
            limit.check(name)?;
            if !limits.insert(name.as_str()) {
                return Err(Error::InvalidConfig(format!(
                    "rate limit {name:?} is declared twice"
                )));
            }
        }
        if self.registry.iter().next().is_none() {
            return Err(Error::InvalidConfig(
                "no FSM to run: none is linked (#[durable_fsm] / #[durable_job]) and none was registered with .register::<T>()".into(),
            ));
        }
        Ok(())
    }
}
