//! The dashboard's in-memory time (sign-in expiry, the wrong-token window): the process's
//! monotonic clock, so that a change of the wall clock neither ends nor extends a
//! session; or, in tests, a manual [`Clock`] whose moves are added to a fixed instant.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use gen_durable::Clock;

/// "Now" as the dashboard counts it.
#[derive(Debug, Clone)]
pub(crate) struct Now {
    origin: Instant,
    /// A manual clock and where it stood at `origin`.
    manual: Option<(Clock, DateTime<Utc>)>,
}

impl Now {
    /// Runs on `clock` if it is manual, else on [`Instant::now`].
    pub(crate) fn new(clock: &Clock) -> Self {
        Now {
            origin: Instant::now(),
            manual: clock.now_param().map(|start| (clock.clone(), start)),
        }
    }

    pub(crate) fn now(&self) -> Instant {
        let Some((clock, start)) = &self.manual else {
            return Instant::now();
        };
        let at = clock.now_param().unwrap_or(*start);
        // A manual clock set back before its start stays at the start: time never runs
        // backwards here, as an `Instant` never does.
        let moved = (at - *start).to_std().unwrap_or(Duration::ZERO);
        self.origin + moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_the_dashboards_time_and_only_forward() {
        let clock = Clock::manual(Utc::now());
        let now = Now::new(&clock);
        let t0 = now.now();
        assert_eq!(now.now(), t0, "a manual clock stands still");
        clock.advance(Duration::from_secs(90));
        assert_eq!(now.now() - t0, Duration::from_secs(90));
        clock.set(Utc::now() - chrono::Duration::hours(1));
        assert_eq!(now.now(), t0);
    }
}
