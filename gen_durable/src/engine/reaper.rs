//! The reaper: takes back rows whose lease expired. A row under its reap limit goes back
//! to `runnable` (its step runs again, counted as a reap); one past it fails. A lease that
//! ran out while the database was down is not counted (migration 0029). Any number of
//! nodes may reap at once: the statement locks with `SKIP LOCKED`.

use std::time::Duration;

use crate::engine::service::Service;
use crate::engine::shared::on_conn;
use crate::engine::shared::Db;
use crate::model::error::{Error, Result};
use crate::store::pg::{lease, log, millis};
use crate::telemetry::{Event, Telemetry};

/// The reaper's settings.
#[derive(Debug, Clone)]
pub(crate) struct ReaperConfig {
    /// Whether this node reaps.
    pub(crate) enabled: bool,
    /// How often it looks for expired leases.
    pub(crate) interval: Duration,
    /// Rows reaped per statement; a pass goes on while batches come back full.
    pub(crate) batch: i64,
}

impl ReaperConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.interval.is_zero() || self.batch < 1 {
            return Err(Error::InvalidConfig(
                "the reaper's interval and batch must be greater than zero".into(),
            ));
        }
        Ok(())
    }
}

/// The reaper service.
#[derive(Debug)]
pub(crate) struct Reaper {
    pub(crate) cfg: ReaperConfig,
    /// The node's lease TTL: a lease of a row claimed before the database started that
    /// expired less than this after the start was last extended before the server went
    /// down, and its reap is not counted.
    pub(crate) lease_ttl: Duration,
    pub(crate) db: Db,
    pub(crate) telemetry: Telemetry,
}

/// What one pass reaped: `(id, failed)` per row, `failed` for a row past its reap limit.
#[derive(Debug, Default)]
pub(crate) struct Reaped {
    pub(crate) rows: Vec<(i64, bool)>,
}

impl Service for Reaper {
    const NAME: &'static str = "reaper";
    type Report = Reaped;

    async fn run_once(&self) -> Result<Reaped> {
        let mut reaped = Reaped::default();
        loop {
            let rows = match self.reap().await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(target: "gen_durable::reaper", error = %e, "reap failed; reaping row by row");
                    self.one_by_one().await
                }
            };
            let full = rows.len() as i64 == self.cfg.batch;
            reaped.rows.extend(rows);
            if !full {
                return Ok(reaped);
            }
        }
    }

    fn after(&self, reaped: Reaped) -> Duration {
        if !reaped.rows.is_empty() {
            let ids: Vec<i64> = reaped.rows.iter().map(|(id, _)| *id).collect();
            self.telemetry.emit(Event::ReaperReaped {
                count: ids.len(),
                ids,
            });
        }
        self.cfg.interval
    }

    fn after_error(&self) -> Duration {
        self.cfg.interval
    }

    fn first_wait(&self) -> Duration {
        self.cfg.interval
    }
}

impl Reaper {
    /// Reaps expired leases of rows claimed by themselves, then expired batches of the
    /// log (each counts as one toward the limit of a pass's statement).
    async fn reap(&self) -> Result<Vec<(i64, bool)>> {
        let (batch, now, ttl) = (self.cfg.batch, self.db.now(), millis(self.lease_ttl));
        let mut rows = on_conn!(self.db, |c| lease::reap(c, batch, now, ttl))?;
        if (rows.len() as i64) < batch {
            rows.extend(on_conn!(self.db, |c| log::reap(c, batch, now, ttl))?);
        }
        Ok(rows)
    }

    /// When a batch fails, one row must not stop the reaper (its row stays first in the
    /// reaper's order): reap each expired row alone, and leave the ones that fail — logged
    /// with their id — for an operator.
    async fn one_by_one(&self) -> Vec<(i64, bool)> {
        let (now, ttl) = (self.db.now(), millis(self.lease_ttl));
        let ids = match lease::expired(self.db.exec(), self.cfg.batch, now).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(target: "gen_durable::reaper", error = %e, "listing expired leases failed");
                return Vec::new();
            }
        };
        let mut reaped = Vec::new();
        for id in ids {
            match on_conn!(self.db, |c| lease::reap_one(c, id, now, ttl)) {
                Ok(rows) => reaped.extend(rows),
                Err(e) => {
                    tracing::error!(target: "gen_durable::reaper", id, error = %e, "this row cannot be reaped")
                }
            }
        }
        reaped
    }
}
