//! The scheduler: fires the engine's [`Schedule`]s. One pass takes each schedule whose
//! fire time has come, in a transaction of its own (see [`crate::schedule`] for why a fire
//! time is inserted exactly once across nodes), and sleeps until the earliest next fire
//! time — at most [`SchedulerConfig::max_wait`], so a clock that moves (a manual one, or a
//! schedule another node declared) is seen soon.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;

use crate::engine::service::Service;
use crate::engine::shared::{Db, BEGIN_READ_COMMITTED};
use crate::error::{Error, Result};
use crate::runtime::panic_message;
use crate::schedule::{CatchUp, Schedule};
use crate::store::pg::{insert, schedule as sql};
use crate::telemetry::{Event, Telemetry};

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub(crate) struct SchedulerConfig {
    /// The longest wait between passes.
    pub(crate) max_wait: Duration,
}

impl SchedulerConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_wait.is_zero() {
            return Err(Error::InvalidConfig(
                "the scheduler's wait must be greater than zero".into(),
            ));
        }
        Ok(())
    }
}

/// The scheduler service.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub(crate) schedules: Vec<Schedule>,
    pub(crate) cfg: SchedulerConfig,
    pub(crate) db: Db,
    pub(crate) telemetry: Telemetry,
}

/// What one pass did.
#[derive(Debug, Default)]
pub(crate) struct Fired {
    /// Each fire time inserted: schedule, fire time, the instance (`None`: its key was
    /// already taken, so it had been inserted before).
    pub(crate) fired: Vec<(String, DateTime<Utc>, Option<i64>)>,
    /// Each fire time left out: schedule, fire time count, why.
    pub(crate) skipped: Vec<(String, usize, String)>,
    /// Each schedule whose fire failed (a database error, a bug): schedule, why. Its
    /// transaction was rolled back; the next pass tries again.
    pub(crate) failed: Vec<(String, String)>,
    /// The earliest next fire time of the schedules this pass saw, and the pass's time.
    pub(crate) next: Option<DateTime<Utc>>,
    pub(crate) now: Option<DateTime<Utc>>,
}

impl Scheduler {
    /// Fires `s` if it is due and no other node is firing it.
    async fn fire(&self, s: &Schedule, out: &mut Fired) -> Result<()> {
        let mut tx = self.db.pool.begin_with(BEGIN_READ_COMMITTED).await?;
        let mut conn = self.db.pooler.on(&mut *tx);
        let now = sql::now(&mut conn, self.db.now()).await?;
        out.now = Some(now);
        let declared = sql::Declared {
            name: s.name(),
            pattern: s.pattern(),
            timezone: s.timezone().name(),
            catch_up: s.catch_up().as_str(),
        };
        sql::ensure(&mut conn, &declared, s.next_after(now), now).await?;
        // `None`: another node is firing it (its next fire time is read at the next pass);
        // `Some(None)`: the pattern never fires again.
        let taken = sql::take(&mut conn, s.name()).await?;
        let plan = match taken {
            Some(Some(next_fire)) => s.plan(next_fire, now),
            _ => {
                tx.commit().await?; // The declaration, if this pass made it.
                return Ok(());
            }
        };
        if plan.fires.is_empty() && plan.skipped == 0 {
            tx.commit().await?;
            out.next = earliest(out.next, plan.next);
            return Ok(());
        }
        let built = s.build(&plan);
        // One statement per fire time: a fire inserts one row, a catch-up at most a batch.
        let mut inserted = Vec::with_capacity(built.rows.len());
        for (fire, row) in &built.rows {
            let id = insert::insert_one(conn.again(), row, true, self.db.now()).await?;
            inserted.push((*fire, id));
        }
        let last = inserted
            .iter()
            .rev()
            .find_map(|(f, id)| id.map(|id| (*f, id)));
        sql::advance(
            &mut conn,
            &declared,
            &sql::Advance {
                next: plan.next,
                last_fire: last.map(|(f, _)| f),
                last_id: last.map(|(_, id)| id),
                skipped: (plan.skipped + built.failed) as i64,
                error: built.error.clone(),
            },
            now,
        )
        .await?;
        tx.commit().await?;
        for (fire, id) in inserted {
            out.fired.push((s.name().to_string(), fire, id));
        }
        if plan.skipped > 0 {
            out.skipped
                .push((s.name().to_string(), plan.skipped, s.policy_reason()));
        }
        if let Some(e) = built.error {
            out.skipped.push((s.name().to_string(), built.failed, e));
        }
        out.next = earliest(out.next, plan.next);
        Ok(())
    }
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Service for Scheduler {
    const NAME: &'static str = "scheduler";
    type Report = Fired;

    async fn run_once(&self) -> Result<Fired> {
        let mut out = Fired::default();
        // Each schedule on its own: a database error or a bug met firing one (its
        // transaction rolled back) is said and waits for the next pass, and the schedules
        // after it in this pass are fired all the same.
        for s in &self.schedules {
            let failed = match AssertUnwindSafe(self.fire(s, &mut out))
                .catch_unwind()
                .await
            {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("panicked: {}", panic_message(panic)),
            };
            out.failed.push((s.name().to_string(), failed));
        }
        Ok(out)
    }

    fn after(&self, out: Fired) -> Duration {
        for (schedule, error) in &out.failed {
            tracing::warn!(target: "gen_durable::scheduler", schedule, error, "schedule pass failed");
        }
        let more = out.fired.len() >= CatchUp::RUN_ALL_BATCH;
        for (schedule, fire_time, id) in out.fired {
            self.telemetry.emit(Event::ScheduleFired {
                schedule,
                fire_time,
                id,
            });
        }
        for (schedule, count, reason) in out.skipped {
            self.telemetry.emit(Event::ScheduleSkipped {
                schedule,
                count,
                reason,
            });
        }
        if more {
            return Duration::ZERO;
        }
        match (out.next, out.now) {
            // The database's clock: sleep until the next fire time (a millisecond late, so
            // that the pass finds it due).
            (Some(next), Some(now)) if !self.db.clock.is_manual() => (next - now)
                .to_std()
                .map(|d| d + Duration::from_millis(1))
                .unwrap_or(Duration::ZERO)
                .min(self.cfg.max_wait),
            _ => self.cfg.max_wait,
        }
    }

    fn after_error(&self) -> Duration {
        self.cfg.max_wait
    }
}
