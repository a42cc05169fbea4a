//! The await-timeout sweep: parked rows past their deadline become runnable with nothing
//! awaited. It sleeps until the earliest deadline it knows of, at most its interval, and
//! is woken early when this node parks a row with a timeout.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::engine::service::Service;
use crate::engine::shared::on_conn;
use crate::engine::shared::Db;
use crate::model::error::{Error, Result};
use crate::store::pg::lease;
use crate::telemetry::{Event, Telemetry};

/// The sweep's settings.
#[derive(Debug, Clone)]
pub(crate) struct TimeoutsConfig {
    /// Whether this node sweeps.
    pub(crate) enabled: bool,
    /// The longest it sleeps between sweeps.
    pub(crate) interval: Duration,
    /// Rows woken per statement; a full batch sweeps again at once.
    pub(crate) batch: i64,
}

impl TimeoutsConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.interval.is_zero() || self.batch < 1 {
            return Err(Error::InvalidConfig(
                "the await-timeout interval and batch must be greater than zero".into(),
            ));
        }
        Ok(())
    }
}

/// The await-timeout service.
#[derive(Debug)]
pub(crate) struct Timeouts {
    pub(crate) cfg: TimeoutsConfig,
    pub(crate) db: Db,
    pub(crate) telemetry: Telemetry,
    /// Notified when a step of this node parks with a timeout.
    pub(crate) wake: Arc<Notify>,
}

/// What one sweep did.
#[derive(Debug, Default)]
pub(crate) struct Swept {
    /// Rows whose await timed out, now runnable.
    pub(crate) fired: i64,
    /// Time until the earliest deadline still ahead, when the sweep looked (it does not
    /// look after a full batch: it sweeps again at once).
    pub(crate) next_in: Option<Duration>,
}

impl Service for Timeouts {
    const NAME: &'static str = "timeouts";
    type Report = Swept;

    async fn run_once(&self) -> Result<Swept> {
        let (batch, now) = (self.cfg.batch, self.db.now());
        let fired = on_conn!(self.db, |c| lease::expire_awaits(c, batch, now))?;
        let mut next_in = None;
        if fired < batch {
            // Not knowing the next deadline only costs a sweep at the interval.
            if let Ok(Some(ms)) = lease::next_deadline_ms(self.db.exec(), self.db.now()).await {
                next_in = Some(Duration::from_millis(ms.max(0) as u64 + 1));
            }
        }
        Ok(Swept { fired, next_in })
    }

    fn after(&self, swept: Swept) -> Duration {
        if swept.fired > 0 {
            self.telemetry.emit(Event::AwaitTimedOut {
                count: swept.fired as usize,
            });
        }
        if swept.fired == self.cfg.batch {
            return Duration::ZERO;
        }
        swept
            .next_in
            .map_or(self.cfg.interval, |d| d.min(self.cfg.interval))
    }

    fn after_error(&self) -> Duration {
        self.cfg.interval
    }

    fn woken(&self) -> Option<&Notify> {
        Some(&self.wake)
    }
}
