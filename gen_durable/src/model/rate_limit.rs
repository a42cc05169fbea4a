//! Rate limits: at most R steps per second of one key, with a burst, as token buckets in
//! the database (`gd_rate_limits`, `gd_buckets`, migration 0012).
//!
//! A limit is declared by name ([`crate::EngineBuilder::rate_limit`],
//! [`crate::Client::set_rate_limit`]); a row joins one of its keys with the insert option
//! `rate_limit((name, key))` (or a bare name: the limit's one global bucket) and an
//! optional `weight` (default 1). The limit applies to the step the row starts at: each
//! execution of that step — its first, a replay, a re-run after a lost lease — takes
//! `weight` tokens when a pick claims it, and no other step does.
//!
//! Tokens are taken in the pick's order (priority, then eligibility, then id). A row
//! whose tokens are not there yet is not turned away: it reserves them (the bucket goes
//! below zero, and counts them as `held`) and becomes runnable at the instant they are
//! due, so it never spins, no row behind it takes the tokens it is owed, and its queue's
//! other rows run meanwhile. The bucket refills lazily from the database clock at each
//! admission, to at most `burst - held`: `min(burst - held, tokens + elapsed × rate)`.
//!
//! A reservation is a debt the row carries until it starts (migration 0031):
//! - a reserved row starts only when its bucket holds its tokens, first in the bucket's
//!   line (ahead of rows that have not reserved). One that comes late — its queue was
//!   paused, no node was up, an operator restarted it — is not let through on top of a
//!   refilled bucket: if the tokens are not there it waits again, keeping its place;
//! - cancelling a reserved row gives its tokens back to the bucket (retried, it pays
//!   again);
//! - a restart at another step (where the limit does not apply) gives them back too; a
//!   restart at the limited step keeps the reservation and its place;
//! - the rows of a paused queue keep what they reserved: other queues' rows of the same
//!   key wait behind them;
//! - a new rate or burst applies from the next admission, reserved rows included.
//!
//! A due time is at most ~95 years away, whatever the limit and the debt. A weight
//! above a lowered burst counts as the burst. The collector recounts `held` from the
//! rows (`gd_recount_held`).
use std::time::Duration;

use serde::Serialize;

use crate::model::error::{Error, Result};
use crate::model::gate::gate_name;

/// A rate limit's configuration: `count` tokens per `period`, and a burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    count: u32,
    period: Duration,
    burst: Option<u32>,
}

impl RateLimit {
    /// `count` tokens every `period` (e.g. `RateLimit::per(100, Duration::from_secs(60))`:
    /// 100 a minute), with a burst of `count` unless [`RateLimit::burst`] says otherwise.
    pub fn per(count: u32, period: Duration) -> Self {
        RateLimit {
            count,
            period,
            burst: None,
        }
    }

    /// The most tokens a bucket holds: how many steps may start at once after a quiet
    /// spell. A row's weight may not exceed it.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Tokens per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.count) / self.period.as_secs_f64()
    }

    /// The bucket's capacity.
    pub fn capacity(&self) -> f64 {
        f64::from(self.burst.unwrap_or(self.count))
    }

    /// Checks limit `name` as `start` and `Client::set_rate_limit` do: a name of 1 to
    /// 255 bytes without NUL, a positive count and period, a burst of at least 1.
    pub fn check(&self, name: &str) -> Result<()> {
        gate_name(name)?;
        let bad = |why: String| Err(Error::InvalidConfig(format!("rate limit {name:?}: {why}")));
        if self.count == 0 || self.period.is_zero() {
            return bad("the count and the period must be positive".into());
        }
        if !(self.per_second() <= 1e9 && self.per_second() >= 1e-9) {
            return bad(format!(
                "{} tokens per second is out of range",
                self.per_second()
            ));
        }
        if self.capacity() < 1.0 {
            return bad("the burst must be at least 1".into());
        }
        Ok(())
    }
}

/// One bucket of a rate limit, as [`Client::rate_limits`](crate::Client::rate_limits) shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct BucketUse {
    /// The rate limit.
    pub name: String,
    /// Tokens per second.
    pub per_second: f64,
    /// The bucket's capacity.
    pub burst: f64,
    /// The key (`None`: a declared limit with no bucket yet).
    pub key: Option<String>,
    /// Tokens now (refilled to the database's now); negative when rows reserved tokens
    /// that are not there yet.
    pub tokens: Option<f64>,
}

/// A weight a row may carry: finite and positive.
pub(crate) fn weight(w: f64) -> Result<()> {
    if w.is_finite() && w > 0.0 && w <= 1e9 {
        Ok(())
    } else {
        Err(Error::InvalidInput {
            what: "rate limit weight",
            reason: format!("must be positive and finite, got {w}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_count_over_period_and_the_burst_defaults_to_the_count() {
        let r = RateLimit::per(100, Duration::from_secs(60));
        assert!((r.per_second() - 100.0 / 60.0).abs() < 1e-12);
        assert_eq!(r.capacity(), 100.0);
        assert_eq!(r.burst(150).capacity(), 150.0);
        assert!(r.check("stripe").is_ok());
        assert!(RateLimit::per(0, Duration::from_secs(1))
            .check("x")
            .is_err());
        assert!(RateLimit::per(1, Duration::ZERO).check("x").is_err());
        assert!(RateLimit::per(5, Duration::from_secs(1))
            .burst(0)
            .check("x")
            .is_err());
        assert!(weight(0.0).is_err() && weight(f64::NAN).is_err() && weight(2.5).is_ok());
    }
}
