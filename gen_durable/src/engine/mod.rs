//! The engine: per-queue pickers, the executor, group commit, leases and the background
//! services that keep them honest.
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
//! # The path of a step, and the file of each stage
//!
//! ```text
//!  Client::insert ─────────────► gd_instances row `runnable`        client/insert.rs, store/pg/insert.rs
//!        its entry in the ready log at commit (a plain row)         sql/log.sql (gd_append)
//!        (NOTIFY gd_wake, coalesced)                                notify.rs
//!             │
//!  listener ──┤ wakes the queue's picker; polling backs it up       engine/listener.rs
//!             ▼
//!  picker: a plain row by a range of its lane's entries (one        engine/picker.rs, store/pg/log.rs,
//!        batch per lane, nothing written per row); a row with a     sql/log.sql (gd_advance, gd_read),
//!        key, gate or limit by itself (SKIP LOCKED, lease + epoch)  store/pg/claim/, sql/claim.sql
//!        → local buffer → a free slot
//!             ▼
//!  executor: run the step outside any transaction                   engine/executor.rs, runtime.rs, ctx.rs
//!        (run-ahead: go on with the next `next` under the claim)
//!             ▼
//!  committer: group commit, fenced by the row's entry and batch     engine/committer/{batching,group,own}.rs
//!        (or its lease), or the step's own transaction; one:        store/pg/outcome.rs,
//!        gd_commit_outcomes                                         sql/commit.sql
//!             │
//!             ├─ schedule_children: fence, insert the children,       store/pg/outcome.rs (spawn_children),
//!             │  then the commit, in one transaction                store/pg/insert.rs
//!             └─ a child's end counts its parent down (fan-in)      gd_fan_in (sql/commit.sql)
//! ```
//!
//! Beside the path, each background service is a unit with its own validated config, a
//! `run_once()` and a stop ([`service`]): the heartbeat extends the node's leases
//! ([`heartbeat`]), the reaper takes back expired ones ([`reaper`]), the await-timeout
//! sweep wakes parked rows past their deadline ([`timeouts`]), the collector deletes old
//! finished rows ([`collector`]), the scheduler fires periodic schedules ([`scheduler`]). [`builder`] checks the settings ([`config`] holds every
//! default) and starts them all on one `TaskTracker`; [`Engine::shutdown`] drains the
//! pickers, stops the services, then the committer once every outcome is answered.

mod builder;
mod collector;
mod committer;
mod config;
mod executor;
mod handoff;
mod heartbeat;
mod listener;
mod picker;
mod reaper;
mod scheduler;
mod service;
mod shared;
mod timeouts;
mod upgrade;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use builder::EngineBuilder;
pub use config::QueueConfig;
pub use listener::WakeListener;
pub use picker::QueueDrain;

use service::ServiceHandle;
use shared::Shared;

/// A running engine. Stop it with [`Engine::shutdown`]; dropping it without a drain
/// leaves its rows to be reaped when their leases expire, like a crash would.
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
    tracker: TaskTracker,
    stop_picking: CancellationToken,
    /// The background services but the committer, which stops last.
    services: Vec<ServiceHandle>,
    committer: ServiceHandle,
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
        EngineBuilder::new(pool)
    }

    /// This node's id (`locked_by` of the rows it holds).
    pub fn node_id(&self) -> &str {
        &self.shared.node_id
    }

    /// Picks on every queue and sweeps await timeouts now, instead of at the next poll.
    /// Useful after moving a manual [`Clock`](crate::Clock); production never needs it (NOTIFY and
    /// polling do this).
    pub fn wake(&self) {
        self.wakes.values().for_each(|w| w.notify_one());
        self.shared.timeouts_wake.notify_one();
    }

    /// Graceful drain: stop picking; release every buffered row at once; let
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
        self.services.iter().for_each(ServiceHandle::stop);
        self.committer.stop();
        self.tracker.wait().await;
        let _ = crate::store::pg::admin::forget(self.shared.db.exec(), &self.shared.node_id).await;
        report
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Dropped without shutdown: stop everything now, as a crash would, but without
        // leaving tasks running in the background.
        self.stop_picking.cancel();
        self.services.iter().for_each(ServiceHandle::stop);
        self.committer.stop();
        for r in &self.runners {
            r.abort();
        }
    }
}
