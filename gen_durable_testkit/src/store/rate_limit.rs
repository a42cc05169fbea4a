//! A rate limit's bucket in memory: `gd_buckets`' row and the arithmetic the claims do
//! with it (migration 0031), so the kit admits, reserves and gives back tokens as the
//! engine does.

use chrono::{DateTime, Utc};

/// The furthest a reservation is due, in seconds (~95 years), as the claims clamp it.
const LONGEST_WAIT_SECS: f64 = 3e9;

/// One key's bucket: its level at `at`, debts included, and what waiting rows reserved.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    pub(crate) tokens: f64,
    pub(crate) held: f64,
    pub(crate) at: DateTime<Utc>,
}

impl Bucket {
    /// A bucket no row has used: full.
    pub(crate) fn full(burst: f64, now: DateTime<Utc>) -> Self {
        Bucket {
            tokens: burst,
            held: 0.0,
            at: now,
        }
    }

    /// What a row that reserved nothing finds at `now`: the refill stops at a full bucket
    /// less what is reserved.
    pub(crate) fn avail(&self, per_second: f64, burst: f64, now: DateTime<Utc>) -> f64 {
        let elapsed = (now - self.at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
        (burst - self.held).min(self.tokens + elapsed * per_second)
    }

    /// The tokens of a reservation that will not be used, back in the bucket.
    pub(crate) fn refund(&mut self, weight: f64) {
        self.tokens += weight;
        self.held = (self.held - weight).max(0.0);
    }
}

/// When a row `short` tokens short of its place in the line may start: `now` plus the
/// time the bucket takes to refill them, rounded up to the microsecond (so it never
/// comes back a hair short), at most [`LONGEST_WAIT_SECS`].
pub(crate) fn due(now: DateTime<Utc>, short: f64, per_second: f64) -> DateTime<Utc> {
    let wait = (short / per_second * 1e6).ceil() / 1e6;
    now + chrono::Duration::microseconds((wait.min(LONGEST_WAIT_SECS) * 1e6) as i64)
}
