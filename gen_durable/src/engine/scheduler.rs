//! The scheduler: fires the engine's [`Schedule`]s. One pass takes each schedule whose
//! fire time has come, in a transaction of its own (see [`crate::flow::schedule`] for why a fire
//! time is inserted exactly once across nodes), and sleeps until the earliest next fire
//! time — at most [`SchedulerConfig::max_wait`], so a clock that moves (a manual one, or a
//! schedule another node declared) is seen soon. A node's first pass declares each of its
//! schedules, replacing a different stored declaration; after that it fires by the stored
//! one (see `schedule/declaration.rs`).

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;

use crate::engine::service::Service;
use crate::engine::shared::Db;
use crate::flow::schedule::{CatchUp, Schedule};
use crate::model::error::{Error, Result};
use crate::runtime::panic_message;
use crate::store::pg::BEGIN_READ_COMMITTED;
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
    schedules: Vec<Schedule>,
    /// Whether this node has declared each of `schedules`. A node declares a schedule once,
    /// at its first pass that takes the schedule's row: its declaration replaces a different
    /// stored one. From then on it fires by the stored declaration, whichever node stored
    /// it (see `schedule/declaration.rs`).
    declared: Vec<AtomicBool>,
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
    pub(crate) fn new(
        schedules: Vec<Schedule>,
        cfg: SchedulerConfig,
        db: Db,
        telemetry: Telemetry,
    ) -> Scheduler {
        Scheduler {
            declared: schedules.iter().map(|_| AtomicBool::new(false)).collect(),
            schedules,
            cfg,
            db,
            telemetry,
        }
    }

    /// Refuses, before anything is written, a schedule with no fire time after the
    /// engine's now: a pattern with a year field whose years are past (one that matches no
    /// date at all is refused by [`Schedule::cron`]). Stored, it would have no next fire
    /// time and never run.
    pub(crate) async fn check_ahead(&self) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let now = sql::now(&mut conn.get(), self.db.now()).await?;
        conn.finish().await?;
        match self.schedules.iter().find(|s| s.next_after(now).is_none()) {
            Some(s) => Err(Error::InvalidInput {
                what: "schedule pattern",
                reason: format!(
                    "{:?} of schedule {:?} has no fire time after {now}: it would never fire",
                    s.pattern(),
                    s.name()
                ),
            }),
            None => Ok(()),
        }
    }

    /// Fires schedule `i` if it is due and no other node is firing it; at this node's
    /// first pass that takes its row, declares it first.
    async fn fire(&self, i: usize, out: &mut Fired) -> Result<()> {
        let s = &self.schedules[i];
        let mut tx = self.db.pool.begin_with(BEGIN_READ_COMMITTED).await?;
        let mut conn = self.db.pooler.on(&mut *tx);
        let now = sql::now(&mut conn, self.db.now()).await?;
        out.now = Some(now);
        let mine = s.declaration();
        sql::ensure(&mut conn, s.name(), &mine, s.next_after(now), now).await?;
        let Some(stored) = sql::take(&mut conn, s.name()).await? else {
            // Another node is firing it: this node reads (or declares) it at its next pass.
            tx.commit().await?;
            return Ok(());
        };
        let mut left_out = None;
        let declaring = !self.declared[i].load(Ordering::Relaxed);
        let (next_fire, by) = if declaring && s.redeclares(&stored) {
            let r = s.redeclare(&stored, now);
            sql::redeclare(&mut conn, s.name(), &mine, &r, now).await?;
            if r.skipped > 0 {
                left_out = Some((r.skipped, s.redeclared_reason(&stored.declaration)));
            }
            (r.next, Cow::Borrowed(s))
        } else if stored.declaration == mine {
            (stored.next_fire, Cow::Borrowed(s))
        } else {
            // A node that started after this one declared it otherwise: fire its times by
            // its policy (this node's entry), rather than write this declaration back.
            (
                stored.next_fire,
                Cow::Owned(s.following(&stored.declaration)?),
            )
        };
        // `None`: the stored pattern never fires again.
        let plan = next_fire
            .map(|next| by.plan(next, now))
            .filter(|p| !p.fires.is_empty() || p.skipped > 0);
        let Some(plan) = plan else {
            tx.commit().await?;
            self.declared[i].store(true, Ordering::Relaxed);
            if let Some((count, why)) = left_out {
                out.skipped.push((s.name().to_string(), count, why));
            }
            out.next = earliest(out.next, next_fire);
            return Ok(());
        };
        let built = by.build(&plan);
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
            s.name(),
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
        self.declared[i].store(true, Ordering::Relaxed);
        if let Some((count, why)) = left_out {
            out.skipped.push((s.name().to_string(), count, why));
        }
        for (fire, id) in inserted {
            out.fired.push((s.name().to_string(), fire, id));
        }
        if plan.skipped > 0 {
            out.skipped
                .push((s.name().to_string(), plan.skipped, by.policy_reason()));
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
        for (i, s) in self.schedules.iter().enumerate() {
            let failed = match AssertUnwindSafe(self.fire(i, &mut out))
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
