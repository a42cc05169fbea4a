//! Insert options shared by [`crate::Client::insert`], [`crate::Entry`] and [`crate::Child`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::Status;

/// Where and when a new instance runs, and what keeps it unique.
#[derive(Debug, Clone, Default)]
pub struct InsertOptions {
    pub(crate) step: Option<String>,
    pub(crate) queue: Option<String>,
    pub(crate) priority: i16,
    pub(crate) partition_key: Option<String>,
    pub(crate) unique_key: Option<String>,
    pub(crate) unique_scope: Option<Vec<Status>>,
    pub(crate) eligible_at: Option<DateTime<Utc>>,
    pub(crate) schedule_at: Option<DateTime<Utc>>,
    pub(crate) schedule_in: Option<Duration>,
}

impl InsertOptions {
    /// The scope a `unique_key` holds in, as stored: the given one, or every
    /// non-terminal status when a key is given without one.
    pub(crate) fn resolved_scope(&self) -> Option<Vec<Status>> {
        match (&self.unique_key, &self.unique_scope) {
            (None, _) => None,
            (Some(_), Some(scope)) => Some(scope.clone()),
            (Some(_), None) => Some(Status::NON_TERMINAL.to_vec()),
        }
    }

    /// Absolute eligibility, if one was given: `eligible_at`, else `schedule_at`.
    pub(crate) fn absolute_at(&self) -> Option<DateTime<Utc>> {
        self.eligible_at.or(self.schedule_at)
    }

    /// Delay from the database's clock, used only when no absolute time was given.
    pub(crate) fn delay(&self) -> Option<Duration> {
        if self.absolute_at().is_some() {
            None
        } else {
            self.schedule_in
        }
    }
}

/// Generates the option setters on a builder whose `InsertOptions` sit at `$field`
/// (e.g. `opts`, or `entry.opts` for a builder wrapping an entry).
macro_rules! insert_option_setters {
    ($($field:ident).+) => {
        /// Starts at this step (its stored name) instead of the FSM's initial step.
        pub fn step(mut self, step: impl Into<String>) -> Self {
            self.$($field).+.step = Some(step.into());
            self
        }
        /// Runs on this queue instead of the FSM's.
        pub fn queue(mut self, queue: impl Into<String>) -> Self {
            self.$($field).+.queue = Some(queue.into());
            self
        }
        /// Lower runs first; default 0.
        pub fn priority(mut self, priority: i16) -> Self {
            self.$($field).+.priority = priority;
            self
        }
        /// Instances sharing a partition key never run steps at the same time.
        pub fn partition_key(mut self, key: impl Into<String>) -> Self {
            self.$($field).+.partition_key = Some(key.into());
            self
        }
        /// At most one instance holds this key while its status is in the unique scope.
        pub fn unique_key(mut self, key: impl Into<String>) -> Self {
            self.$($field).+.unique_key = Some(key.into());
            self
        }
        /// The statuses in which the unique key is occupied; default: every non-terminal status.
        pub fn unique_scope(mut self, scope: impl IntoIterator<Item = $crate::Status>) -> Self {
            self.$($field).+.unique_scope = Some(scope.into_iter().collect());
            self
        }
        /// Runnable from this instant on. Takes precedence over `schedule_at` and `schedule_in`.
        pub fn eligible_at(mut self, at: ::chrono::DateTime<::chrono::Utc>) -> Self {
            self.$($field).+.eligible_at = Some(at);
            self
        }
        /// Sugar for `eligible_at`; takes precedence over `schedule_in`.
        pub fn schedule_at(mut self, at: ::chrono::DateTime<::chrono::Utc>) -> Self {
            self.$($field).+.schedule_at = Some(at);
            self
        }
        /// Runnable this long after the database's `now()` (not the caller's clock).
        pub fn schedule_in(mut self, delay: ::std::time::Duration) -> Self {
            self.$($field).+.schedule_in = Some(delay);
            self
        }
    };
}
pub(crate) use insert_option_setters;
