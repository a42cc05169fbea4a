//! [`Schedule`]: periodic inserts declared on the engine — "every night at 02:00, Paris
//! time, insert a `Report`" — fired exactly once per fire time across every node.
//!
//! Each engine that declares a schedule checks it (the scheduler service,
//! `engine/scheduler.rs`). A fire is one transaction: the schedule's row in
//! `gd_schedules` is locked (`SKIP LOCKED`: one node at a time, the others skip), the
//! instances of the due fire times are inserted, and the row's next fire time is moved
//! past them. So a fire time is inserted once or not at all, whichever node takes it, and a
//! crash between the insert and the move rolls both back. Each instance also carries the key
//! `gd:schedule:<name>:<fire time>` (unless the entry sets its own), held in every status,
//! so that a fire time is never inserted twice even by a writer outside the engine.
//!
//! Times come from the database's clock (or the engine's manual clock in tests); the pattern
//! is read in the schedule's time zone, daylight saving included (a 02:30 fire on the night
//! the clocks skip 02:00–03:00 fires at 03:00; on the night they repeat 02:00–03:00, once).

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use chrono_tz::Tz;
use croner::Cron;

mod declaration;

#[doc(hidden)]
use crate::client::Entry;
use crate::model::error::{Error, Result};
use crate::model::insert::NewInstance;
use crate::model::validate::MAX_KEY_BYTES;
use crate::runtime::fsm::Fsm;
use crate::runtime::panic_message;

/// What a schedule does with fire times that passed while no engine ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Fire times older than [`CatchUp::SKIP_GRACE`] are skipped; the schedule waits for
    /// its next one.
    Skip,
    /// One instance, for the newest missed fire time (the default): work that only needs to
    /// have run recently — a report, a sync — runs once after a downtime, not once per
    /// missed period.
    #[default]
    RunOnce,
    /// One instance per missed fire time, oldest first, at most
    /// [`CatchUp::RUN_ALL_BATCH`] per transaction.
    RunAll,
}

impl CatchUp {
    /// How late a fire time may be handled and still count as on time under
    /// [`CatchUp::Skip`].
    pub const SKIP_GRACE: ChronoDuration = ChronoDuration::seconds(60);
    /// Fire times [`CatchUp::RunAll`] inserts in one transaction; the next pass goes on.
    pub const RUN_ALL_BATCH: usize = 500;

    /// Its name as stored in `gd_schedules.catch_up` and shown: `skip`, `run_once`,
    /// `run_all`.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::RunOnce => "run_once",
            CatchUp::RunAll => "run_all",
        }
    }
}

/// Builds the instance a fire time inserts (type-erased [`Entry`]).
type Make = Arc<dyn Fn(DateTime<Utc>) -> Result<NewInstance> + Send + Sync>;

/// A periodic insert: a name (unique per database), a cron pattern read in a time zone,
/// a catch-up policy, and the entry each fire time inserts. Add it to an engine with
/// [`crate::EngineBuilder::schedule`].
///
/// ```no_run
/// # use gen_durable::prelude::*;
/// # use gen_durable::{CatchUp, Entry, Schedule};
/// # #[derive(Debug, Clone, Serialize, Deserialize, DurableState)]
/// # struct ReportArgs { day: String }
/// # #[durable_job(queue = "reports")]
/// # async fn build_report(args: ReportArgs, _ctx: &mut JobCtx) -> JobResult { Ok(json!(null)) }
/// # fn f() -> gen_durable::Result<()> {
/// let nightly = Schedule::cron("nightly-report", "0 2 * * *", |fire| {
///     Entry::<BuildReport>::new(ReportArgs { day: fire.date_naive().to_string() })
/// })?
/// .with_timezone(gen_durable::Tz::Europe__Paris)
/// .with_catch_up(CatchUp::RunOnce);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Schedule {
    name: String,
    pattern: String,
    cron: Cron,
    tz: Tz,
    catch_up: CatchUp,
    make: Make,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("pattern", &self.pattern)
            .field("tz", &self.tz)
            .field("catch_up", &self.catch_up)
            .finish_non_exhaustive()
    }
}

impl Schedule {
    /// A schedule named `name` firing on the cron `pattern` — five fields (minute hour
    /// day-of-month month day-of-week), or six with seconds first — in UTC until
    /// [`Schedule::with_timezone`]. Each fire time `t` inserts `make(t)`.
    ///
    /// An empty or over-long name, a pattern that does not parse, or one that matches no
    /// date (`0 0 30 2 *`: 30 February) is [`Error::InvalidInput`]. (A pattern whose fire
    /// times are all past, with a year field, is refused when an engine starts with it.)
    pub fn cron<F: Fsm>(
        name: impl Into<String>,
        pattern: &str,
        make: impl Fn(DateTime<Utc>) -> Entry<F> + Send + Sync + 'static,
    ) -> Result<Schedule> {
        let (name, cron) = checked(name.into(), pattern)?;
        Ok(Schedule {
            name,
            pattern: pattern.to_string(),
            cron,
            tz: Tz::UTC,
            catch_up: CatchUp::default(),
            make: Arc::new(move |fire| make(fire).into_new_instance()),
        })
    }

    /// A schedule inserting a bare row of FSM `F` on queue `q` (keyed `own_key` if given),
    /// for the library's own tests, which have no [`Fsm`] type.
    #[cfg(test)]
    pub(crate) fn for_tests(
        name: &str,
        pattern: &str,
        c: CatchUp,
        own_key: Option<&str>,
    ) -> Schedule {
        let own_key = own_key.map(str::to_string);
        let (name, cron) = checked(name.into(), pattern).unwrap();
        Schedule {
            name,
            pattern: pattern.into(),
            cron,
            tz: Tz::UTC,
            catch_up: c,
            make: Arc::new(move |_| {
                Ok(NewInstance {
                    fsm: "F".into(),
                    version: 1,
                    step: "s".into(),
                    state: serde_json::json!({}),
                    queue: "q".into(),
                    priority: 0,
                    partition_key: None,
                    gate: None,
                    rate_limit: None,
                    rate_weight: 1.0,
                    unique_key: own_key.clone(),
                    unique_scope: own_key.as_ref().map(|_| crate::Status::ALL.to_vec()),
                    eligible_at: None,
                    delay: None,
                    max_reaps: 10,
                })
            }),
        }
    }

    /// Reads the pattern in `tz` (default UTC).
    pub fn with_timezone(mut self, tz: Tz) -> Self {
        self.tz = tz;
        self
    }

    /// What to do with fire times missed while no engine ran (default [`CatchUp::RunOnce`]).
    pub fn with_catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pattern, as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The time zone the pattern is read in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The catch-up policy.
    pub fn catch_up(&self) -> CatchUp {
        self.catch_up
    }

    /// The first fire time strictly after `t`; `None` if the pattern never fires again.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|f| f.with_timezone(&Utc))
    }

    /// The newest fire time at or before `t`.
    fn newest_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|f| f.with_timezone(&Utc))
    }

    /// What a pass does at `now` for a schedule whose earliest unhandled fire time is
    /// `next_fire`: the fire times to insert, and the next unhandled one after them. The
    /// engine's scheduler and the testkit's virtual clock both fire by it.
    #[doc(hidden)]
    pub fn plan(&self, next_fire: DateTime<Utc>, now: DateTime<Utc>) -> Plan {
        if next_fire > now {
            return Plan {
                fires: Vec::new(),
                skipped: 0,
                next: Some(next_fire),
            };
        }
        match self.catch_up {
            CatchUp::RunAll => {
                let mut fires = vec![next_fire];
                let mut at = next_fire;
                let next = loop {
                    match self.next_after(at) {
                        Some(f) if f <= now && fires.len() < CatchUp::RUN_ALL_BATCH => {
                            fires.push(f);
                            at = f;
                        }
                        other => break other,
                    }
                };
                Plan {
                    fires,
                    skipped: 0,
                    next,
                }
            }
            CatchUp::RunOnce | CatchUp::Skip => {
                let newest = self.newest_until(now).filter(|f| *f >= next_fire);
                let newest = newest.unwrap_or(next_fire);
                let due = self.count_between(next_fire, newest);
                let on_time = now - newest <= CatchUp::SKIP_GRACE;
                let run = self.catch_up == CatchUp::RunOnce || on_time;
                Plan {
                    fires: if run { vec![newest] } else { Vec::new() },
                    skipped: due - usize::from(run),
                    next: self.next_after(now.max(newest)),
                }
            }
        }
    }

    /// Fire times in `[from, to]` (both fire times), counted up to a bound: a report
    /// figure, not a loop over years of seconds.
    fn count_between(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
        const BOUND: usize = 100_000;
        let mut n = 1;
        let mut at = from;
        while let Some(f) = self.next_after(at).filter(|f| *f <= to) {
            n += 1;
            at = f;
            if n == BOUND {
                break;
            }
        }
        n
    }

    /// The row fire time `fire` inserts: the entry `make` builds, keyed by the schedule and
    /// the fire time unless it has a key of its own.
    #[doc(hidden)]
    pub fn instance(&self, fire: DateTime<Utc>) -> Result<NewInstance> {
        let mut row = (self.make)(fire)?;
        if row.unique_key.is_none() {
            row.unique_key = Some(fire_key(&self.name, fire));
            row.unique_scope = Some(crate::Status::ALL.to_vec());
        }
        Ok(row)
    }
}

impl Schedule {
    /// The rows `plan`'s fire times insert (see [`Schedule::instance`]); a fire time whose
    /// entry cannot be built, or whose closure panics, is counted and its error kept
    /// instead. The engine's scheduler and the testkit both insert by it.
    #[doc(hidden)]
    pub fn build(&self, plan: &Plan) -> Built {
        let mut built = Built {
            rows: Vec::with_capacity(plan.fires.len()),
            failed: 0,
            error: None,
        };
        for &fire in &plan.fires {
            // The closure is the user's code: a panic in it (an `unwrap` on a date, say)
            // fails this fire time as an `Err` does, instead of unwinding through the
            // scheduler that fires every schedule of the node. The fire time is handled
            // all the same (skipped), so a catch-up never meets it again.
            let made = std::panic::catch_unwind(AssertUnwindSafe(|| self.instance(fire)));
            let error = match made {
                Ok(Ok(row)) => {
                    built.rows.push((fire, row));
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("the entry closure panicked: {}", panic_message(panic)),
            };
            built.failed += 1;
            built.error = Some(format!("fire time {fire}: {error}"));
        }
        built
    }

    /// The reason `schedule.skipped` gives for fire times the catch-up policy left out.
    #[doc(hidden)]
    pub fn policy_reason(&self) -> String {
        format!("catch-up policy {}", self.catch_up.as_str())
    }
}

/// The rows of one plan (see [`Schedule::build`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct Built {
    /// Each fire time with its row, oldest first.
    pub rows: Vec<(DateTime<Utc>, NewInstance)>,
    /// Fire times whose entry could not be built.
    pub failed: usize,
    /// The last of their errors.
    pub error: Option<String>,
}

/// A schedule's name and parsed pattern, or what is wrong with them.
fn checked(name: String, pattern: &str) -> Result<(String, Cron)> {
    if name.is_empty() || name.contains('\0') || name.len() > MAX_KEY_BYTES / 2 {
        return Err(Error::InvalidInput {
            what: "schedule name",
            reason: format!(
                "{name:?} must be 1 to {} bytes with no NUL",
                MAX_KEY_BYTES / 2
            ),
        });
    }
    let cron = Cron::from_str(pattern).map_err(|e| Error::InvalidInput {
        what: "schedule pattern",
        reason: format!("{pattern:?} of schedule {name:?} does not parse: {e}"),
    })?;
    // A pattern can parse and match no date: day 30 of February, day 31 of a 30-day month.
    // Stored, it would have no next fire time and the schedule would never run, with
    // nothing said. croner searches up to the year 5000: far past the 400 years after which
    // any pattern without a year field repeats.
    if cron
        .find_next_occurrence(&DateTime::UNIX_EPOCH, true)
        .is_err()
    {
        return Err(Error::InvalidInput {
            what: "schedule pattern",
            reason: format!(
                "{pattern:?} of schedule {name:?} matches no date from 1970 on: it would never fire"
            ),
        });
    }
    Ok((name, cron))
}

/// The key of the instance a schedule inserts for a fire time.
pub fn fire_key(name: &str, fire: DateTime<Utc>) -> String {
    format!(
        "gd:schedule:{name}:{}",
        fire.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

/// One pass's decision for one schedule.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Fire times to insert, oldest first.
    pub fires: Vec<DateTime<Utc>>,
    /// Due fire times the policy leaves out.
    pub skipped: usize,
    /// The earliest fire time left unhandled (`None`: the pattern is over).
    pub next: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, m, s).unwrap()
    }

    fn every_5_min(c: CatchUp) -> Schedule {
        Schedule::for_tests("s", "*/5 * * * *", c, None)
    }

    #[test]
    fn a_pass_before_the_fire_time_does_nothing() {
        let s = every_5_min(CatchUp::RunAll);
        let p = s.plan(at(0, 5, 0), at(0, 4, 59));
        assert!(p.fires.is_empty());
        assert_eq!(p.next, Some(at(0, 5, 0)));
    }

    #[test]
    fn on_time_every_policy_fires_once() {
        for c in [CatchUp::Skip, CatchUp::RunOnce, CatchUp::RunAll] {
            let p = every_5_min(c).plan(at(0, 5, 0), at(0, 5, 1));
            assert_eq!(p.fires, vec![at(0, 5, 0)], "{c:?}");
            assert_eq!((p.skipped, p.next), (0, Some(at(0, 10, 0))), "{c:?}");
        }
    }

    #[test]
    fn after_a_downtime_each_policy_catches_up_its_way() {
        // Down from before 00:05 to 00:33:30: 00:05, 00:10, …, 00:30 were missed.
        let (next, now) = (at(0, 5, 0), at(0, 33, 30));
        let all = every_5_min(CatchUp::RunAll).plan(next, now);
        assert_eq!(
            all.fires,
            (1..=6).map(|i| at(0, 5 * i, 0)).collect::<Vec<_>>()
        );
        assert_eq!(all.next, Some(at(0, 35, 0)));
        let once = every_5_min(CatchUp::RunOnce).plan(next, now);
        assert_eq!((once.fires, once.skipped), (vec![at(0, 30, 0)], 5));
        assert_eq!(once.next, Some(at(0, 35, 0)));
        let skip = every_5_min(CatchUp::Skip).plan(next, now);
        assert!(skip.fires.is_empty());
        assert_eq!(skip.skipped, 6);
        assert_eq!(skip.next, Some(at(0, 35, 0)));
    }

    #[test]
    fn run_all_inserts_a_bounded_batch_and_goes_on_from_there() {
        let s = Schedule::for_tests("s", "* * * * * *", CatchUp::RunAll, None);
        let p = s.plan(at(0, 0, 0), at(1, 0, 0));
        assert_eq!(p.fires.len(), CatchUp::RUN_ALL_BATCH);
        let last = *p.fires.last().unwrap();
        assert_eq!(p.next, Some(last + ChronoDuration::seconds(1)));
    }

    #[test]
    fn a_pattern_is_read_in_its_time_zone_across_daylight_saving() {
        // Paris: 2026-03-29 the clocks go from 02:00 to 03:00 (01:00 UTC).
        let s = Schedule::for_tests("s", "30 2 * * *", CatchUp::RunOnce, None)
            .with_timezone(chrono_tz::Europe::Paris);
        let before = Utc.with_ymd_and_hms(2026, 3, 27, 12, 0, 0).unwrap();
        let fires: Vec<_> = std::iter::successors(s.next_after(before), |t| s.next_after(*t))
            .take(3)
            .collect();
        // 02:30 CET = 01:30 UTC; the 29th has no 02:30: the first minute after the gap;
        // from the 30th, 02:30 CEST = 00:30 UTC.
        assert_eq!(
            fires[0],
            Utc.with_ymd_and_hms(2026, 3, 28, 1, 30, 0).unwrap()
        );
        assert_eq!(
            fires[1],
            Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap(),
            "03:00 CEST"
        );
        assert_eq!(
            fires[2],
            Utc.with_ymd_and_hms(2026, 3, 30, 0, 30, 0).unwrap()
        );
        assert_eq!(fires.len(), 3);
        // 2026-10-25 the clocks go back from 03:00 to 02:00 (01:00 UTC): 02:30 happens twice,
        // and fires once, at its first occurrence (02:30 CEST = 00:30 UTC).
        let before = Utc.with_ymd_and_hms(2026, 10, 24, 12, 0, 0).unwrap();
        let first = s.next_after(before).unwrap();
        assert_eq!(first, Utc.with_ymd_and_hms(2026, 10, 25, 0, 30, 0).unwrap());
        assert_eq!(
            s.next_after(first),
            Some(Utc.with_ymd_and_hms(2026, 10, 26, 1, 30, 0).unwrap()),
            "not again at 02:30 CET"
        );
    }

    #[test]
    fn bad_names_and_patterns_are_typed_errors() {
        for (name, pattern, what) in [
            ("", "* * * * *", "schedule name"),
            ("a\0b", "* * * * *", "schedule name"),
            ("ok", "61 * * * *", "schedule pattern"),
            ("ok", "every day", "schedule pattern"),
            ("ok", "0 0 30 2 *", "schedule pattern"),
            ("ok", "0 0 31 4,6,9,11 *", "schedule pattern"),
            ("ok", "0 0 0 1 1 * 1969", "schedule pattern"),
        ] {
            match checked(name.into(), pattern) {
                Err(Error::InvalidInput { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{name:?} {pattern:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_rare_date_is_a_fire_time() {
        let leap_day = checked("ok".into(), "0 0 29 2 *").unwrap().1;
        let from = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let next = leap_day.find_next_occurrence(&from, false).unwrap();
        assert_eq!(next, Utc.with_ymd_and_hms(2028, 2, 29, 0, 0, 0).unwrap());
    }

    #[test]
    fn a_fire_is_keyed_by_schedule_and_time_unless_the_entry_has_a_key() {
        let s = every_5_min(CatchUp::RunOnce);
        let row = s.instance(at(2, 0, 0)).unwrap();
        assert_eq!(
            row.unique_key.as_deref(),
            Some("gd:schedule:s:2026-01-01T02:00:00Z")
        );
        assert_eq!(row.unique_scope.as_deref(), Some(&crate::Status::ALL[..]));
        let own = Schedule::for_tests("s", "* * * * *", CatchUp::RunOnce, Some("mine"));
        assert_eq!(
            own.instance(at(2, 0, 0)).unwrap().unique_key.as_deref(),
            Some("mine")
        );
    }
}
