//! Insert options shared by [`crate::Client::insert`], [`crate::Entry`] and [`crate::Child`]
//! (and the testkit's inserts): the list is written once, in `__insert_options`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::model::gate::ConcurrencyKey;
use crate::Status;

/// Where and when a new instance runs, and what keeps it unique.
#[derive(Debug, Clone, Default)]
pub struct InsertOptions {
    pub(crate) step: Option<String>,
    pub(crate) queue: Option<String>,
    pub(crate) priority: i16,
    pub(crate) concurrency: Option<ConcurrencyKey>,
    pub(crate) rate_limit: Option<crate::LimitKey>,
    pub(crate) weight: Option<f64>,
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

/// The insert options, listed once: each one's documentation, setter signature and how
/// it is stored. `$crate::insert_option_setters!` expands this list in one of two modes.
#[doc(hidden)]
#[macro_export]
macro_rules! __insert_options {
    ($mode:tt) => {
        $crate::__insert_option! { $mode
            /// Starts at this step (its stored name) instead of the FSM's initial step.
            step(step: impl Into<String>) => step = Some(step.into());
        }
        $crate::__insert_option! { $mode
            /// Runs on this queue instead of the FSM's.
            queue(queue: impl Into<String>) => queue = Some(queue.into());
        }
        $crate::__insert_option! { $mode
            /// Lower runs first; default 0.
            priority(priority: i16) => priority = priority;
        }
        $crate::__insert_option! { $mode
            /// Instances sharing a partition key never run steps at the same time (a gate
            /// of K = 1). Replaces a `gate` set before.
            partition_key(key: impl Into<String>)
                => concurrency = Some($crate::__private::ConcurrencyKey::Partition(key.into()));
        }
        $crate::__insert_option! { $mode
            /// Runs under key `key` of a gate: at most the gate's K steps of that key at
            /// once, across every node (`("stripe", tenant)`, or `LimitKey::global("smtp")`).
            /// The gate must be declared (`EngineBuilder::gate`,
            /// `Client::set_gate`): an unknown one is `Error::UnknownGate` and nothing is
            /// written. Replaces a `partition_key` set before.
            gate(key: impl Into<$crate::LimitKey>)
                => concurrency = Some($crate::__private::ConcurrencyKey::Gate(key.into()));
        }
        $crate::__insert_option! { $mode
            /// Its first step takes tokens from this key of a rate limit (`("stripe",
            /// tenant)`, or a bare name for the limit's one bucket) each time it runs, and
            /// waits for them when they are not there. The limit must be declared
            /// (`EngineBuilder::rate_limit`, `Client::set_rate_limit`): an unknown one is
            /// `Error::UnknownRateLimit` and nothing is written.
            rate_limit(key: impl Into<$crate::LimitKey>) => rate_limit = Some(key.into());
        }
        $crate::__insert_option! { $mode
            /// The tokens its rate-limited step takes (default 1): positive, and at most
            /// the limit's burst (`Error::InvalidInput` otherwise, nothing written).
            weight(weight: f64) => weight = Some(weight);
        }
        $crate::__insert_option! { $mode
            /// The instance's correlation key: its business name (`"order:42"`), set once.
            /// While the instance's status is in the key's scope it holds the key: no other
            /// instance can be inserted with it (`Error::Duplicate`; dropped by
            /// `insert_all` and children), and `Key(..)` names it (`Client::signal`).
            correlation_key(key: impl Into<String>) => unique_key = Some(key.into());
        }
        $crate::__insert_option! { $mode
            /// The statuses in which the correlation key is held: every live status (the
            /// default), optionally with `done` and/or `failed` (a finished instance keeps
            /// its key until collected), or none (the key is then neither unique nor an
            /// address). Other scopes are refused: a row could leave and re-enter them.
            correlation_scope(scope: impl IntoIterator<Item = $crate::Status>)
                => unique_scope = Some(scope.into_iter().collect());
        }
        $crate::__insert_option! { $mode
            /// The correlation key under the name of its uniqueness half: the same as
            /// `correlation_key`.
            unique_key(key: impl Into<String>) => unique_key = Some(key.into());
        }
        $crate::__insert_option! { $mode
            /// The same as `correlation_scope`.
            unique_scope(scope: impl IntoIterator<Item = $crate::Status>)
                => unique_scope = Some(scope.into_iter().collect());
        }
        $crate::__insert_option! { $mode
            /// Runnable from this instant on. Takes precedence over `schedule_at` and `schedule_in`.
            eligible_at(at: ::chrono::DateTime<::chrono::Utc>) => eligible_at = Some(at);
        }
        $crate::__insert_option! { $mode
            /// Sugar for `eligible_at`; takes precedence over `schedule_in`.
            schedule_at(at: ::chrono::DateTime<::chrono::Utc>) => schedule_at = Some(at);
        }
        $crate::__insert_option! { $mode
            /// Runnable this long after the database's `now()` (the testkit's virtual now).
            schedule_in(delay: ::std::time::Duration) => schedule_in = Some(delay);
        }
    };
}

/// One setter of `__insert_options`: on [`InsertOptions`] itself (`[own]`: it sets the
/// field), or on a builder holding one at `$path` (`[forward path]`: it calls the
/// `InsertOptions` setter of the same name, so it works from any crate).
#[doc(hidden)]
#[macro_export]
macro_rules! __insert_option {
    ([own] $(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;) => {
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$field = $value;
            self
        }
    };
    ([forward $($path:ident).+] $(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;) => {
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$($path).+ = ::std::mem::take(&mut self.$($path).+).$name($arg);
            self
        }
    };
}

/// The insert-option setters on a builder whose [`InsertOptions`] sit at `$path` (e.g.
/// `opts`, or `entry.opts`), plus `options(..)` to set them all at once. The testkit's
/// builders use it too, so every insert builder has the same options.
#[doc(hidden)]
#[macro_export]
macro_rules! insert_option_setters {
    ($($path:ident).+) => {
        $crate::__insert_options!([forward $($path).+]);

        /// Replaces every insert option with `options` (an `InsertOptions` built with
        /// the same setters).
        pub fn options(mut self, options: $crate::InsertOptions) -> Self {
            self.$($path).+ = options;
            self
        }
    };
}

impl InsertOptions {
    __insert_options!([own]);
}
