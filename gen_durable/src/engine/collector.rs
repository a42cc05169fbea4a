//! The collector: deletes `done`/`failed` rows older than the retention, in bounded
//! batches (`SKIP LOCKED`, so several nodes collecting at once only share the work),
//! never a child whose parent is still live; and rate-limit buckets that are full again
//! (`rate_limit::sweep`), after recounting what buckets hold for reserved rows
//! (`rate_limit::recount`); and the history's day partitions (`history::keep`). First, it
//! rolls up the minutes that ended into `gd_minutes` (`minutes::roll`), before their rows
//! can be collected.

use std::time::Duration;

use crate::engine::service::Service;
use crate::engine::shared::on_conn;
use crate::engine::shared::Db;
use crate::model::error::{Error, Result};
use crate::store::pg::{admin, history, log, millis, minutes, rate_limit};
use crate::telemetry::{Event, Telemetry};

/// The collector's settings.
#[derive(Debug, Clone)]
pub(crate) struct CollectorConfig {
    /// Whether this node collects.
    pub(crate) enabled: bool,
    /// How long finished rows are kept, from their last update.
    pub(crate) retention: Duration,
    /// How long history entries are kept.
    pub(crate) history_retention: Duration,
    /// How often it runs.
    pub(crate) interval: Duration,
    /// Rows one statement deletes at most; a pass goes on while batches come back full.
    pub(crate) batch: usize,
}

impl CollectorConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.interval.is_zero() || self.batch == 0 {
            return Err(Error::InvalidConfig(
                "the collector's interval and batch must be greater than zero".into(),
            ));
        }
        Ok(())
    }
}

/// The collector service.
#[derive(Debug)]
pub(crate) struct Collector {
    pub(crate) cfg: CollectorConfig,
    pub(crate) db: Db,
    pub(crate) telemetry: Telemetry,
}

/// Batches one pass deletes at most, so that a stop is seen between passes.
const BATCHES_PER_PASS: usize = 100;

/// What one pass deleted.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) deleted: u64,
    /// Idle rate-limit buckets deleted (full again: the same as absent).
    pub(crate) buckets: usize,
    /// The pass stopped at its batch limit with rows left: the next one starts at once.
    pub(crate) more: bool,
}

impl Service for Collector {
    const NAME: &'static str = "collector";
    type Report = Collected;

    async fn run_once(&self) -> Result<Collected> {
        let retention = millis(self.cfg.retention);
        let batch = self.cfg.batch as i64;
        let mut collected = Collected::default();
        let now = self.db.now();
        let rolled = on_conn!(self.db, |c| minutes::roll(c, now))?;
        let keep = self.cfg.history_retention;
        on_conn!(self.db, |c| history::keep(c, now, keep))?;
        on_conn!(self.db, |c| rate_limit::recount(c, batch))?;
        collected.buckets = on_conn!(self.db, |c| rate_limit::sweep(c, batch, now))? as usize;
        // The log's dead entries, a pass's worth (more at once when it is behind).
        let trim = batch * BATCHES_PER_PASS as i64;
        let trimmed = on_conn!(self.db, |c| log::trim(c, trim))?;
        for _ in 0..BATCHES_PER_PASS {
            let now = self.db.now();
            let n = on_conn!(self.db, |c| admin::gc_batch(c, retention, batch, now))?;
            collected.deleted += n;
            if (n as i64) < batch {
                collected.more = trimmed == trim || rolled.behind;
                return Ok(collected);
            }
        }
        collected.more = true;
        Ok(collected)
    }

    fn after(&self, collected: Collected) -> Duration {
        if collected.deleted > 0 || collected.buckets > 0 {
            self.telemetry.emit(Event::CollectorDeleted {
                count: collected.deleted as usize,
                buckets: collected.buckets,
            });
        }
        if collected.more {
            Duration::ZERO
        } else {
            self.cfg.interval
        }
    }

    fn after_error(&self) -> Duration {
        self.cfg.interval
    }

    fn first_wait(&self) -> Duration {
        self.cfg.interval
    }
}
