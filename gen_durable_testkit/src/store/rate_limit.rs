//! Rate limits in memory (`gen_durable::store::pg::rate_limit`, `gd_rate_limits` and
//! `gd_buckets`): declaring them, a bucket and the arithmetic the claims do with it
//! (migration 0031), the claim's admission of a row against its limit, and the tokens a
//! cancel or a restart gives back — so the kit admits, reserves and gives back tokens as
//! the engine does.

use chrono::{DateTime, Utc};
use gen_durable::Status;

use super::Store;

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

impl Store {
    /// The claim's admission of picked row `id` against its rate limit (migration 0031):
    /// true if it runs now (the tokens it takes now, or reserved before, are there);
    /// false if it waits, runnable, until they are due. A row that has not reserved
    /// reserves its tokens behind everything reserved; a reserved row comes first in
    /// line, and if its bucket does not hold them, it waits again, keeping its
    /// reservation. One row at a time, as the engine's claims of a batch of one.
    pub(crate) fn admit(&mut self, id: i64, now: DateTime<Utc>) -> bool {
        let row = &self.rows[&id];
        let Some(key) = row.rate_limit.clone() else {
            return true;
        };
        let paid = row.rate_paid;
        if !paid && row.rate_step.as_deref() != Some(row.step.as_str()) {
            return true;
        }
        let (rate, burst) = self.rate_limits[&key.0];
        // A weight above the burst (lowered since the insert) counts as the burst.
        let weight = row.rate_weight.min(burst);
        let mut bucket = self
            .buckets
            .get(&key)
            .copied()
            .unwrap_or_else(|| Bucket::full(burst, now));
        if paid {
            bucket.held = bucket.held.max(weight);
        }
        let avail = bucket.avail(rate, burst, now);
        let room = avail + bucket.held;
        // Its place in line: a reserved row's own weight; a new one's after all reserved.
        let pos = if paid { weight } else { bucket.held + weight };
        let admitted = pos <= room;
        let row = self.rows.get_mut(&id).expect("picked");
        if admitted {
            if paid {
                bucket.held = (bucket.held - weight).max(0.0);
            }
            row.rate_paid = false;
        } else {
            // It waits for its tokens; one that had not reserved reserves them now.
            row.eligible_at = due(now, pos - room, rate);
            assert!(
                row.eligible_at > now,
                "row {id} would wait for its tokens no time"
            );
            if !paid {
                row.rate_paid = true;
                bucket.held += weight;
            }
        }
        // What rows that had not reserved took (now, or as a reservation).
        bucket.tokens = avail - if paid { 0.0 } else { weight };
        bucket.at = now;
        self.buckets.insert(key, bucket);
        admitted
    }

    /// Gives back the tokens runnable row `id` reserved, if it did (a cancel, a restart
    /// at another step).
    pub(super) fn refund(&mut self, id: i64) {
        let row = self.rows.get_mut(&id).expect("a row");
        let reserved = row.status == Status::Runnable && row.rate_paid;
        row.rate_paid = false;
        if let (true, Some(key)) = (reserved, row.rate_limit.as_ref()) {
            if let Some(b) = self.buckets.get_mut(key) {
                b.refund(row.rate_weight);
            }
        }
    }

    /// `gd_rate_limits`: (tokens per second, burst) of limit `name`.
    pub(crate) fn rate_limit(&self, name: &str) -> Option<(f64, f64)> {
        self.rate_limits.get(name).copied()
    }

    /// DECLARE: adds rate limit `name` or changes it; true if written.
    pub(crate) fn set_rate_limit(&mut self, name: &str, per_second: f64, burst: f64) -> bool {
        self.rate_limits
            .insert(name.to_string(), (per_second, burst))
            != Some((per_second, burst))
    }
}
