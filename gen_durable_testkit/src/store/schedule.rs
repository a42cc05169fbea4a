//! The kit's periodic schedules, held as `gd_schedules` holds them for the engine: each
//! declaration with its earliest unhandled fire time and the newest fire time inserted. A
//! name declared again is replaced by the engine's rule for a node's start
//! (`Schedule::redeclare`): a new pattern or zone fires from its first fire time after now.

use chrono::{DateTime, Utc};
use gen_durable::backend::StoredSchedule;
use gen_durable::{Event, Schedule};

/// One declared schedule.
#[derive(Debug)]
pub(crate) struct KitSchedule {
    pub(crate) schedule: Schedule,
    /// The earliest fire time not handled yet (`None`: its pattern is over).
    pub(crate) next: Option<DateTime<Utc>>,
    /// The newest fire time an instance was inserted for.
    pub(crate) last_fire: Option<DateTime<Utc>>,
}

/// Declares `schedule` at `now` among `declared`. A new name starts at its first fire time
/// after now; a name already declared is replaced, and the `schedule.skipped` of the
/// replaced pattern's due fire times, if any, is returned.
pub(crate) fn declare(
    declared: &mut Vec<KitSchedule>,
    schedule: Schedule,
    now: DateTime<Utc>,
) -> Option<Event> {
    let Some(old) = declared
        .iter_mut()
        .find(|d| d.schedule.name() == schedule.name())
    else {
        declared.push(KitSchedule {
            next: schedule.next_after(now),
            schedule,
            last_fire: None,
        });
        return None;
    };
    let stored = StoredSchedule {
        declaration: old.schedule.declaration(),
        next_fire: old.next,
        last_fire: old.last_fire,
    };
    // The kit's one node declares at each `schedule`, as a node does at its start.
    let r = schedule.redeclare(&stored, now);
    let skipped = (r.skipped > 0).then(|| Event::ScheduleSkipped {
        schedule: schedule.name().to_string(),
        count: r.skipped,
        reason: schedule.redeclared_reason(&stored.declaration),
    });
    old.schedule = schedule;
    old.next = r.next;
    skipped
}
