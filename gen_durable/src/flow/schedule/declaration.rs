//! A schedule's declaration (pattern, time zone, catch-up policy) against the one stored in
//! `gd_schedules`: when a node's declaration replaces the stored one, where the replacement
//! starts, and how a node fires by a declaration that another node stored.
//!
//! The rule (README, "Changing a schedule"): a node declares each of its schedules once, at
//! its start, and a declaration that differs from the stored one replaces it at once. After
//! that, every node fires by the stored declaration, with its own entry closure. In a
//! rolling deploy the node that started last wins, and the nodes still running the old
//! release follow it: one pattern is in force at a time, instead of one per node, flipping
//! at every pass. A fire time is still inserted once (the row lock and the fire key).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;

use super::{CatchUp, Schedule};
use crate::model::error::{Error, Result};
use crate::model::rows::{Redeclared, ScheduleDeclaration, StoredSchedule};

impl Schedule {
    /// This schedule's declaration, as `gd_schedules` stores it.
    #[doc(hidden)]
    pub fn declaration(&self) -> ScheduleDeclaration {
        ScheduleDeclaration {
            pattern: self.pattern.clone(),
            timezone: self.tz.name().to_string(),
            catch_up: self.catch_up.as_str().to_string(),
        }
    }

    /// Whether declaring this schedule changes the stored row: another pattern, zone or
    /// policy, or no next fire time (a valid declaration revives a row an older version
    /// left without one).
    #[doc(hidden)]
    pub fn redeclares(&self, stored: &StoredSchedule) -> bool {
        stored.declaration != self.declaration() || stored.next_fire.is_none()
    }

    /// The row once this declaration replaces `stored` at `now`.
    ///
    /// Another pattern or zone names other fire times, so it starts as a new schedule does:
    /// at its first fire time after now, and after the newest fire time inserted, so that a
    /// clock set back cannot insert a fire time again. It does not catch up: the stored
    /// pattern's fire times that were due and not handled (the change deployed after a
    /// downtime) are counted as skipped, as the old pattern's times that the new one may not
    /// even name. A changed policy alone keeps the next fire time: the fire times are the
    /// same, and the new policy decides about those missed.
    #[doc(hidden)]
    pub fn redeclare(&self, stored: &StoredSchedule, now: DateTime<Utc>) -> Redeclared {
        let same_times = stored.declaration.pattern == self.pattern
            && stored.declaration.timezone == self.tz.name();
        if let (true, Some(next)) = (same_times, stored.next_fire) {
            return Redeclared {
                next: Some(next),
                skipped: 0,
            };
        }
        let skipped = match stored.next_fire {
            Some(next) if next <= now => self
                .following(&stored.declaration)
                .ok()
                .and_then(|old| Some(old.count_between(next, old.newest_until(now)?)))
                // A stored pattern this version cannot read: its next fire time, at least.
                .unwrap_or(1),
            _ => 0,
        };
        let from = stored.last_fire.map_or(now, |last| last.max(now));
        Redeclared {
            next: self.next_after(from),
            skipped,
        }
    }

    /// The reason `schedule.skipped` gives for the fire times a redeclaration leaves out.
    #[doc(hidden)]
    pub fn redeclared_reason(&self, stored: &ScheduleDeclaration) -> String {
        format!(
            "redeclared from {:?} ({}) to {:?} ({}): the due fire times of the replaced pattern are not caught up",
            stored.pattern,
            stored.timezone,
            self.pattern,
            self.tz.name()
        )
    }

    /// This schedule as `stored` declares it: the stored pattern, zone and policy, with this
    /// schedule's name and entry. A node fires by it once a node started after it has
    /// declared the schedule otherwise. An error if this version cannot read the
    /// declaration (a pattern syntax or a zone it does not know).
    pub(crate) fn following(&self, stored: &ScheduleDeclaration) -> Result<Schedule> {
        let unreadable = |reason: String| Error::InvalidInput {
            what: "stored schedule declaration",
            reason: format!("schedule {:?}: {reason}", self.name),
        };
        let cron = Cron::from_str(&stored.pattern)
            .map_err(|e| unreadable(format!("pattern {:?}: {e}", stored.pattern)))?;
        let tz = Tz::from_str(&stored.timezone)
            .map_err(|e| unreadable(format!("time zone {:?}: {e}", stored.timezone)))?;
        let catch_up = CatchUp::from_name(&stored.catch_up)
            .ok_or_else(|| unreadable(format!("catch-up policy {:?}", stored.catch_up)))?;
        Ok(Schedule {
            name: self.name.clone(),
            pattern: stored.pattern.clone(),
            cron,
            tz,
            catch_up,
            make: self.make.clone(),
        })
    }
}

impl CatchUp {
    /// The policy named `name` ([`CatchUp::as_str`]).
    fn from_name(name: &str) -> Option<CatchUp> {
        [CatchUp::Skip, CatchUp::RunOnce, CatchUp::RunAll]
            .into_iter()
            .find(|c| c.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, m, 0).unwrap()
    }

    fn stored(s: &Schedule, next: Option<DateTime<Utc>>) -> StoredSchedule {
        StoredSchedule {
            declaration: s.declaration(),
            next_fire: next,
            last_fire: None,
        }
    }

    #[test]
    fn the_same_declaration_changes_nothing() {
        let s = Schedule::for_tests("s", "*/5 * * * *", CatchUp::RunOnce, None);
        assert!(!s.redeclares(&stored(&s, Some(at(0, 5)))));
    }

    #[test]
    fn a_new_pattern_starts_after_now_and_counts_the_old_patterns_due_times() {
        let old = Schedule::for_tests("s", "*/10 * * * *", CatchUp::RunOnce, None);
        let new = Schedule::for_tests("s", "0 0 1 1 *", CatchUp::RunOnce, None);
        // On time: 00:10 is not due yet at 00:05, and the yearly pattern never names it.
        let r = new.redeclare(&stored(&old, Some(at(0, 10))), at(0, 5));
        assert_eq!(r.next, new.next_after(at(0, 5)));
        assert_eq!(r.skipped, 0);
        // After a downtime: 00:10, 00:20 and 00:30 were due at 00:35.
        let r = new.redeclare(&stored(&old, Some(at(0, 10))), at(0, 35));
        assert_eq!(r.skipped, 3);
    }

    #[test]
    fn a_new_pattern_never_starts_before_the_last_fire_time() {
        let old = Schedule::for_tests("s", "*/10 * * * *", CatchUp::RunOnce, None);
        let new = Schedule::for_tests("s", "* * * * *", CatchUp::RunOnce, None);
        let mut row = stored(&old, Some(at(0, 20)));
        row.last_fire = Some(at(0, 10));
        // The clock was set back to 00:05: 00:06 … 00:10 would be inserted again otherwise.
        assert_eq!(new.redeclare(&row, at(0, 5)).next, Some(at(0, 11)));
    }

    #[test]
    fn a_new_policy_alone_keeps_the_next_fire_time() {
        let old = Schedule::for_tests("s", "*/5 * * * *", CatchUp::RunOnce, None);
        let new = Schedule::for_tests("s", "*/5 * * * *", CatchUp::RunAll, None);
        let row = stored(&old, Some(at(0, 5)));
        assert!(new.redeclares(&row));
        assert_eq!(
            new.redeclare(&row, at(0, 33)),
            Redeclared {
                next: Some(at(0, 5)),
                skipped: 0
            }
        );
    }

    #[test]
    fn a_row_with_no_next_fire_time_is_revived() {
        let s = Schedule::for_tests("s", "* * * * *", CatchUp::RunOnce, None);
        let row = stored(&s, None);
        assert!(s.redeclares(&row));
        assert_eq!(s.redeclare(&row, at(0, 0)).next, Some(at(0, 1)));
    }

    #[test]
    fn a_node_follows_the_stored_declaration_with_its_own_entry() {
        let mine = Schedule::for_tests("s", "* * * * *", CatchUp::RunOnce, Some("k"));
        let theirs = ScheduleDeclaration {
            pattern: "30 12 * * *".into(),
            timezone: "Asia/Tokyo".into(),
            catch_up: "run_all".into(),
        };
        let f = mine.following(&theirs).unwrap();
        assert_eq!(f.declaration(), theirs);
        assert_eq!(f.next_after(at(0, 0)), Some(at(3, 30)), "12:30 JST");
        let row = f.instance(at(3, 30)).unwrap();
        assert_eq!(row.unique_key.as_deref(), Some("k"), "the node's own entry");
        let unknown = ScheduleDeclaration {
            timezone: "Mars/Olympus".into(),
            ..theirs
        };
        assert!(matches!(
            mine.following(&unknown),
            Err(Error::InvalidInput {
                what: "stored schedule declaration",
                ..
            })
        ));
    }
}
