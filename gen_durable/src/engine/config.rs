//! Engine and queue configuration, validated at `start`.

use std::time::Duration;

use crate::engine::collector::CollectorConfig;
use crate::engine::committer::CommitterConfig;
use crate::engine::heartbeat::HeartbeatConfig;
use crate::engine::listener::{ListenerConfig, WakeListener};
use crate::engine::reaper::ReaperConfig;
use crate::engine::scheduler::SchedulerConfig;
use crate::engine::timeouts::TimeoutsConfig;
use crate::model::error::{Error, Result};
use crate::store::pooler::Pooler;

/// Per-queue settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Steps run at once on this node.
    pub concurrency: usize,
    /// Claimed rows held ahead in a local buffer (default 0). While it holds rows, it is
    /// refilled only once a quarter of it (or `min_demand`, if more) is free: one claim
    /// per batch rather than one per few rows.
    pub prefetch: usize,
    /// Don't pick for fewer free slots than this (default 1).
    pub min_demand: usize,
    /// Poll this often when nothing wakes the picker (default 1 s)…
    pub poll_interval: Duration,
    /// …doubling while picks come back empty, up to this (default 5 s).
    pub max_poll_interval: Duration,
    /// A commit that frees a gate key's slot claims the key's next row into it for this
    /// queue (default on; README, "Flow control"). Off: freed slots wait for the next
    /// claim, and rows of one priority run in the pick's order across keys.
    pub gate_handoff: bool,
}

impl QueueConfig {
    /// A queue running `concurrency` steps at once, with the defaults otherwise.
    pub fn new(concurrency: usize) -> Self {
        QueueConfig {
            concurrency,
            prefetch: 0,
            min_demand: 1,
            poll_interval: Duration::from_secs(1),
            max_poll_interval: Duration::from_secs(5),
            gate_handoff: true,
        }
    }

    /// Sets `gate_handoff`.
    pub fn with_gate_handoff(mut self, on: bool) -> Self {
        self.gate_handoff = on;
        self
    }

    /// Sets `prefetch`.
    pub fn with_prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// Sets `min_demand`.
    pub fn with_min_demand(mut self, n: usize) -> Self {
        self.min_demand = n;
        self
    }

    /// Sets `poll_interval` (and raises `max_poll_interval` to it if lower).
    pub fn with_poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self.max_poll_interval = self.max_poll_interval.max(d);
        self
    }

    /// Sets `max_poll_interval`.
    pub fn with_max_poll_interval(mut self, d: Duration) -> Self {
        self.max_poll_interval = d;
        self
    }

    pub(crate) fn validate(&self, name: &str) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidConfig(format!("queue {name:?}: {why}")));
        if name.is_empty() {
            return Err(Error::InvalidConfig(
                "a queue name must not be empty".into(),
            ));
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".into());
        }
        if self.min_demand == 0 || self.min_demand > self.concurrency + self.prefetch {
            return bad(format!(
                "min_demand must be between 1 and concurrency + prefetch ({}), got {}",
                self.concurrency + self.prefetch,
                self.min_demand
            ));
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval must be greater than zero".into());
        }
        if self.max_poll_interval < self.poll_interval {
            return bad("max_poll_interval must be at least poll_interval".into());
        }
        Ok(())
    }
}

/// Node-wide settings: the node, and each service's own. [`EngineConfig::default`] is
/// the one home of every default; [`EngineConfig::validate`] checks them all at `start`.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    pub(crate) node_id: String,
    /// Sends at most one wake-up per queue per window for committed outcomes.
    pub(crate) notify_window: Duration,
    pub(crate) committer: CommitterConfig,
    pub(crate) heartbeat: HeartbeatConfig,
    pub(crate) reaper: ReaperConfig,
    pub(crate) timeouts: TimeoutsConfig,
    pub(crate) collector: CollectorConfig,
    pub(crate) scheduler: SchedulerConfig,
    pub(crate) listener: ListenerConfig,
    /// What sits between the engine and Postgres.
    pub(crate) pooler: Pooler,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            node_id: default_node_id(),
            notify_window: crate::store::notify::DEFAULT_WINDOW,
            committer: CommitterConfig { batch: 512 },
            heartbeat: HeartbeatConfig {
                lease_ttl: Duration::from_secs(30),
                interval: None,
            },
            reaper: ReaperConfig {
                enabled: true,
                interval: Duration::from_secs(1),
                batch: 500,
            },
            timeouts: TimeoutsConfig {
                enabled: true,
                interval: Duration::from_secs(1),
                batch: 1000,
            },
            collector: CollectorConfig {
                enabled: true,
                retention: Duration::from_secs(7 * 24 * 3600),
                history_retention: Duration::from_secs(7 * 24 * 3600),
                interval: Duration::from_secs(60),
                batch: crate::store::pg::admin::GC_BATCH as usize,
            },
            scheduler: SchedulerConfig {
                max_wait: Duration::from_secs(10),
            },
            listener: ListenerConfig {
                on: WakeListener::Pool,
                backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
            },
            pooler: Pooler::None,
        }
    }
}

impl EngineConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.node_id.is_empty() {
            return Err(Error::InvalidConfig("node_id must not be empty".into()));
        }
        if self.pooler == Pooler::Transaction && matches!(self.listener.on, WakeListener::Pool) {
            return Err(Error::InvalidConfig(
                "with_pooler(Pooler::Transaction) needs with_listener(WakeListener::direct(..)) \
                 or WakeListener::Off: a LISTEN through a transaction-mode pooler is lost"
                    .into(),
            ));
        }
        self.committer.validate()?;
        self.heartbeat.validate()?;
        self.reaper.validate()?;
        self.timeouts.validate()?;
        self.collector.validate()?;
        self.scheduler.validate()
    }
}

/// A node id unique to this engine: host, process and a counter.
pub(crate) fn default_node_id() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{host}-{}-{}-{:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}
