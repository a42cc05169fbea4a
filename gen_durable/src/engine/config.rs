//! Engine and queue configuration, validated at `start`.

use std::time::Duration;

use crate::error::{Error, Result};

/// Per-queue settings (spec §7.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Steps run at once on this node.
    pub concurrency: usize,
    /// Claimed rows held ahead in a local buffer (default 0).
    pub prefetch: usize,
    /// Don't pick for fewer free slots than this (default 1).
    pub min_demand: usize,
    /// Poll this often when nothing wakes the picker (default 1 s)…
    pub poll_interval: Duration,
    /// …doubling while picks come back empty, up to this (default 5 s).
    pub max_poll_interval: Duration,
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
        }
    }

    /// Sets `prefetch`.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// Sets `min_demand`.
    pub fn min_demand(mut self, n: usize) -> Self {
        self.min_demand = n;
        self
    }

    /// Sets `poll_interval` (and raises `max_poll_interval` to it if lower).
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self.max_poll_interval = self.max_poll_interval.max(d);
        self
    }

    /// Sets `max_poll_interval`.
    pub fn max_poll_interval(mut self, d: Duration) -> Self {
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

/// Node-wide settings.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    pub(crate) node_id: String,
    pub(crate) lease_ttl: Duration,
    pub(crate) heartbeat_interval: Option<Duration>,
    pub(crate) reaper_interval: Duration,
    pub(crate) timeout_interval: Duration,
    pub(crate) reaper: bool,
    pub(crate) timeouts: bool,
    pub(crate) commit_batch: usize,
    pub(crate) collector: bool,
    pub(crate) retention: Duration,
    pub(crate) collector_interval: Duration,
    pub(crate) collector_batch: usize,
}

impl EngineConfig {
    pub(crate) fn heartbeat(&self) -> Duration {
        self.heartbeat_interval.unwrap_or(self.lease_ttl / 3)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::InvalidConfig(why.to_string()));
        if self.node_id.is_empty() {
            return bad("node_id must not be empty");
        }
        if self.lease_ttl < Duration::from_millis(100) {
            return bad("lease_ttl must be at least 100 ms");
        }
        if self.heartbeat() >= self.lease_ttl || self.heartbeat().is_zero() {
            return bad(
                "the heartbeat interval must be greater than zero and shorter than lease_ttl",
            );
        }
        if self.reaper_interval.is_zero() || self.timeout_interval.is_zero() {
            return bad("reaper and timeout intervals must be greater than zero");
        }
        if self.commit_batch == 0 {
            return bad("commit_batch must be at least 1");
        }
        if self.collector_interval.is_zero() || self.collector_batch == 0 {
            return bad("the collector's interval and batch must be greater than zero");
        }
        Ok(())
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
