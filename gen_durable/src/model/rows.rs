//! The rows a store reports to the layers above it: what a wait reads of an instance, a
//! paused queue, a stored schedule, and a row after its instance migrations. (The
//! answers to the caller's actions are `answers`; the facts behind an explanation are
//! `explain`.)

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::model::status::Status;

/// What a wait reads of a row: the testkit builds it from its own rows.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct WaitRow {
    /// The instance's id.
    pub id: i64,
    /// Its status.
    pub status: Status,
    /// Its step.
    pub step: String,
    /// Its attempt.
    pub attempt: i32,
    /// Its result, once done.
    pub result: Option<Value>,
    /// Its last error.
    pub last_error: Option<String>,
    /// The signal names it awaits.
    pub awaits: Vec<String>,
    /// Its live children.
    pub children_pending: i32,
}

/// A queue an operator paused: no node claims its rows until it is resumed. Rows claimed
/// before the pause finish their step; parked rows still take signals and time out, and
/// become runnable rows that wait for the resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct QueuePause {
    /// The queue.
    pub queue: String,
    /// When it was paused (by the clock of the call that paused it).
    pub paused_at: DateTime<Utc>,
    /// Why, as the operator who paused it said.
    pub reason: Option<String>,
}

/// A schedule's declaration as `gd_schedules` stores it: the pattern as written, the time
/// zone's name and the catch-up policy's name.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleDeclaration {
    /// `gd_schedules.pattern`.
    pub pattern: String,
    /// `gd_schedules.timezone`: an IANA name such as `Europe/Paris`.
    pub timezone: String,
    /// `gd_schedules.catch_up`: see [`CatchUp::as_str`].
    pub catch_up: String,
}

/// What `gd_schedules` holds of a schedule when a node declares it.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    /// The stored declaration.
    pub declaration: ScheduleDeclaration,
    /// The earliest fire time not handled yet; `None` when the stored pattern has no fire
    /// time ahead (an older version stored a pattern that never fires).
    pub next_fire: Option<DateTime<Utc>>,
    /// The newest fire time an instance was inserted for.
    pub last_fire: Option<DateTime<Utc>>,
}

/// The stored row after a declaration replaced it (see [`Schedule::redeclare`]).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redeclared {
    /// The new next fire time.
    pub next: Option<DateTime<Utc>>,
    /// The stored declaration's fire times that were due and are left out.
    pub skipped: usize,
}

/// A row after its migrations: the version it is now at, with its state and step.
#[derive(Debug, Clone, PartialEq)]
pub struct Migrated {
    /// The version the row moved to.
    pub version: i32,
    /// Its new state.
    pub state: Value,
    /// Its new step.
    pub step: &'static str,
}
