//! The heartbeat: one statement per tick extends every lease this node holds, and learns
//! which of its steps were cancelled meanwhile; one more extends the log's batches it
//! holds and deletes those whose rows have all ended here. It also announces the node (its queues
//! and FSM versions) for `gen_durable status`.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::service::Service;
use crate::engine::shared::on_conn;
use crate::engine::shared::{Claims, Db};
use crate::model::error::{Error, Result};
use crate::store::pg::{admin, lease, log, millis};
use crate::telemetry::{Event, Telemetry};

/// The longest gap between two announcements, so a node with a slow heartbeat still
/// counts as live for `gen_durable status` (its window is 60 s).
const ANNOUNCE_AT_LEAST_EVERY: Duration = Duration::from_secs(20);

/// The heartbeat's settings.
#[derive(Debug, Clone)]
pub(crate) struct HeartbeatConfig {
    /// How long a claim holds a row without a heartbeat.
    pub(crate) lease_ttl: Duration,
    /// How often leases are extended (`None`: a third of `lease_ttl`).
    pub(crate) interval: Option<Duration>,
}

impl HeartbeatConfig {
    /// The interval in force.
    pub(crate) fn every(&self) -> Duration {
        self.interval.unwrap_or(self.lease_ttl / 3)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::InvalidConfig(why.to_string()));
        if self.lease_ttl < Duration::from_millis(100) {
            return bad("lease_ttl must be at least 100 ms");
        }
        if self.every() >= self.lease_ttl || self.every().is_zero() {
            return bad(
                "the heartbeat interval must be greater than zero and shorter than lease_ttl",
            );
        }
        Ok(())
    }
}

/// The heartbeat service.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    pub(crate) cfg: HeartbeatConfig,
    pub(crate) db: Db,
    pub(crate) telemetry: Telemetry,
    pub(crate) node_id: String,
    pub(crate) claims: Arc<Claims>,
    /// What the node announces: its queues, and the `(name, version)` of its FSMs.
    pub(crate) queues: Vec<String>,
    pub(crate) fsms: Vec<(String, i32)>,
    /// The step names of the versions it has registered, by `name@version`.
    pub(crate) steps: serde_json::Value,
}

/// What one beat did.
#[derive(Debug, Default)]
pub(crate) struct Beat {
    /// Leases held when it began.
    pub(crate) held: usize,
    /// Of those, leases extended (the others finished, were reaped, or were locked by
    /// another transaction: extended at the next beat).
    pub(crate) extended: usize,
    /// Instances whose cancellation it saw; their steps' `ctx.cancelled()` resolved.
    pub(crate) cancelled: Vec<i64>,
}

impl Service for Heartbeat {
    const NAME: &'static str = "heartbeat";
    type Report = Beat;

    async fn run_once(&self) -> Result<Beat> {
        let held = self.claims.leases();
        let mut beat = Beat {
            held: held.len(),
            ..Beat::default()
        };
        if !held.is_empty() {
            let ttl = millis(self.cfg.lease_ttl);
            let (node, now) = (self.node_id.as_str(), self.db.now());
            let held = &held;
            let rows = on_conn!(self.db, |c| lease::heartbeat(c, held, ttl, node, now));
            match rows {
                Ok(rows) => {
                    beat.extended = rows.len();
                    beat.cancelled = rows.iter().filter(|r| r.1).map(|r| r.0).collect();
                    for id in &beat.cancelled {
                        self.claims.cancel_step(*id);
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "gen_durable::lease", error = %e, "heartbeat failed")
                }
            }
        }
        let logged = self.claims.log_beat();
        if !logged.live.is_empty() || !logged.acked.is_empty() {
            beat.held += logged.rows.len();
            let ttl = millis(self.cfg.lease_ttl);
            let (node, now) = (self.node_id.as_str(), self.db.now());
            let logged = &logged;
            match on_conn!(self.db, |c| log::beat(c, logged, ttl, node, now)) {
                Ok(rows) => {
                    beat.extended += rows.len();
                    for (id, _) in rows.iter().filter(|r| r.1) {
                        self.claims.cancel_step(*id);
                        beat.cancelled.push(*id);
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "gen_durable::lease", error = %e, "heartbeat of the log's batches failed")
                }
            }
        }
        admin::announce(
            self.db.exec(),
            &self.node_id,
            &self.queues,
            &self.fsms,
            &self.steps,
            self.db.now(),
        )
        .await?;
        Ok(beat)
    }

    fn after(&self, beat: Beat) -> Duration {
        if beat.held > 0 {
            self.telemetry.emit(Event::LeasesExtended {
                held: beat.held,
                extended: beat.extended,
                cancelled: beat.cancelled,
            });
        }
        self.cfg.every().min(ANNOUNCE_AT_LEAST_EVERY)
    }

    fn after_error(&self) -> Duration {
        self.cfg.every().min(ANNOUNCE_AT_LEAST_EVERY)
    }
}
