//! Per-transition options: what an outcome that leads to a step (`next`, `await_signal`,
//! `schedule_children`) says about the flow control of that step — switch or release the
//! row's concurrency key, the rate limit the step pays, and whether it may run ahead.
//!
//! The rules, in one place (README, "Flow control"):
//! - The concurrency key (a K = 1 `partition_key` or a gate key) is kept unless the
//!   transition switches it ([`crate::Step::partition_key`], [`crate::Step::gate`]) or
//!   releases it ([`crate::Step::release_partition`]). A switched key is taken at the
//!   row's next claim.
//! - A rate limit belongs to the step a transition leads to: the transition's own
//!   ([`crate::Step::rate_limit`]), else the step's `#[step(rate_limit = "…")]`, else
//!   none. Every transition sets it anew, so a limit never follows the row into a step
//!   that did not ask for one; a `replay` (the same step again) keeps it and pays again.
//! - Run-ahead never runs a step inline that needs something the claim does not hold: a
//!   new concurrency key (it could be someone else's) or tokens (the step must be
//!   admitted by a claim). The row goes back to the picker instead (`run_ahead.yield`).

use crate::model::error::Result;
use crate::model::gate::{ConcurrencyKey, LimitKey};
use crate::model::validate;

/// What a transition does to the row's concurrency key.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum KeyChange {
    /// Keeps the key the row has (none, a K = 1 key or a gate key).
    #[default]
    Keep,
    /// Switches to this key.
    Set(ConcurrencyKey),
    /// Drops the key: the next step runs outside any partition or gate.
    Release,
}

/// The rate limit a step pays when it runs: a key of a limit, and the tokens it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRate {
    /// The limit and the key within it.
    pub key: LimitKey,
    /// Tokens taken per run (default 1).
    pub weight: f64,
}

impl StepRate {
    /// `weight` tokens of `key` per run.
    pub fn new(key: impl Into<LimitKey>, weight: f64) -> Self {
        StepRate {
            key: key.into(),
            weight,
        }
    }
}

/// The flow-control options of one transition (type-erased, as the committer and the
/// in-memory kit apply them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transition {
    /// The concurrency key from the next step on.
    pub key: KeyChange,
    /// The rate limit the next step pays, resolved: the transition's own, else the
    /// step's declared one, else none.
    pub rate: Option<StepRate>,
    /// `.no_run_ahead()`: go back to the picker even under run-ahead.
    pub no_run_ahead: bool,
}

/// Why a run-ahead chain handed its row back to the picker instead of going on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum YieldReason {
    /// The next step runs under a new concurrency key, which a claim must take.
    Contended,
    /// The next step is rate limited: a claim must admit it and take its tokens.
    Throttled,
    /// The transition said `.no_run_ahead()`.
    Off,
}

impl YieldReason {
    /// As telemetry reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            YieldReason::Contended => "contended",
            YieldReason::Throttled => "throttled",
            YieldReason::Off => "off",
        }
    }
}

impl Transition {
    /// Why a run-ahead `next` with these options must go back to the picker, if it must.
    /// `current` is the row's key as claimed: (`partition_key`, `gate`).
    pub(crate) fn yields(&self, current: (Option<&str>, Option<&str>)) -> Option<YieldReason> {
        if self.no_run_ahead {
            return Some(YieldReason::Off);
        }
        if let KeyChange::Set(key) = &self.key {
            let (k, gate) = key.columns();
            if current != (Some(k.as_str()), gate.as_deref()) {
                return Some(YieldReason::Contended);
            }
        }
        self.rate.as_ref().map(|_| YieldReason::Throttled)
    }

    /// The checks an insert makes of the same values: keys and names in range, a
    /// positive finite weight. (An undeclared gate or limit, or a weight above the burst,
    /// is the database's refusal at commit.)
    pub(crate) fn validate(&self) -> Result<()> {
        match &self.key {
            KeyChange::Set(ConcurrencyKey::Partition(k)) => validate::key("partition_key", k)?,
            KeyChange::Set(ConcurrencyKey::Gate(g)) => {
                crate::model::gate::gate_name(&g.name)?;
                validate::key("gate key", &g.key)?;
            }
            KeyChange::Keep | KeyChange::Release => {}
        }
        if let Some(r) = &self.rate {
            crate::model::gate::gate_name(&r.key.name)?;
            validate::key("rate limit key", &r.key.key)?;
            crate::model::rate_limit::weight(r.weight)?;
        }
        Ok(())
    }

    /// As the commit function stores it: whether the key changes, then
    /// (`partition_key`, `gate`) from the next step on.
    pub(crate) fn key_columns(&self) -> (bool, Option<String>, Option<String>) {
        match &self.key {
            KeyChange::Keep => (false, None, None),
            KeyChange::Release => (true, None, None),
            KeyChange::Set(k) => {
                let (key, gate) = k.columns();
                (true, Some(key), gate)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ahead_yields_for_a_new_key_or_tokens_and_goes_on_otherwise() {
        let none = (None, None);
        assert_eq!(Transition::default().yields(none), None);
        let release = Transition {
            key: KeyChange::Release,
            ..Transition::default()
        };
        assert_eq!(release.yields((Some("a"), None)), None);
        let to = |k: &str| Transition {
            key: KeyChange::Set(ConcurrencyKey::Partition(k.into())),
            ..Transition::default()
        };
        assert_eq!(to("a").yields((Some("a"), None)), None, "the key it holds");
        assert_eq!(
            to("b").yields((Some("a"), None)),
            Some(YieldReason::Contended)
        );
        assert_eq!(
            to("a").yields((Some("a"), Some("g"))),
            Some(YieldReason::Contended),
            "a K = 1 key is not the gate key of the same spelling"
        );
        let rated = Transition {
            rate: Some(StepRate::new("stripe", 1.0)),
            ..Transition::default()
        };
        assert_eq!(rated.yields(none), Some(YieldReason::Throttled));
        let off = Transition {
            no_run_ahead: true,
            ..Transition::default()
        };
        assert_eq!(off.yields(none), Some(YieldReason::Off));
    }

    #[test]
    fn bad_keys_and_weights_are_refused_with_what_was_wrong() {
        let rated = |w| Transition {
            rate: Some(StepRate::new(("stripe", "acme"), w)),
            ..Transition::default()
        };
        assert!(rated(2.0).validate().is_ok());
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = rated(w).validate().unwrap_err().to_string();
            assert!(e.contains("rate limit weight"), "{e}");
        }
        let nul = Transition {
            key: KeyChange::Set(ConcurrencyKey::Partition("a\0b".into())),
            ..Transition::default()
        };
        assert!(nul
            .validate()
            .unwrap_err()
            .to_string()
            .contains("partition_key"));
    }
}
