//! The parameters of the commit functions (`gd_commit_outcomes`, `gd_commit_handoff`):
//! a batch's outcomes as one array per column of the outcome table, in id order, and the
//! per-transition columns when any outcome moves a key or takes a limit. A new outcome
//! kind is encoded here.

use std::collections::HashMap;

use serde_json::Value;

use super::Commit;
use crate::model::step::{Outcome, OutcomeKind, StepOutput};
use crate::model::transition::Transition;
use crate::store::pg::millis;

/// The commit function's parameters: one array per column of the outcome table, in the
/// batch's id order, plus the signals consumed and the signals an `await` saw.
#[derive(Debug, Default)]
pub(super) struct Arrays<'x> {
    pub(super) id: Vec<i64>,
    pub(super) epoch: Vec<i64>,
    pub(super) kind: Vec<&'static str>,
    pub(super) step: Vec<Option<&'static str>>,
    pub(super) state: Vec<Option<&'x Value>>,
    pub(super) result: Vec<Option<&'x Value>>,
    pub(super) error: Vec<Option<&'x str>>,
    pub(super) delay: Vec<Option<i64>>,
    pub(super) awaits: Vec<Option<String>>,
    pub(super) children: Vec<i32>,
    pub(super) run_ahead: Vec<bool>,
    pub(super) consumed: Vec<i64>,
    pub(super) seen: Vec<i64>,
    /// Each outcome's history level (`HistoryLevel::code`) and its step's duration in
    /// microseconds; `None` when no outcome of the batch is recorded.
    pub(super) history: Option<(Vec<Option<i16>>, Vec<i64>)>,
    /// The transitions' keys and limits; `None` when no outcome of the batch has any
    /// (the function then keeps every key and clears every transition's limit).
    pub(super) moves: Option<Moves>,
}

/// The per-transition columns (see [`crate::model::transition::Transition`]), one element per outcome.
#[derive(Debug, Default)]
pub(super) struct Moves {
    pub(super) keyed: Vec<bool>,
    pub(super) key: Vec<Option<String>>,
    pub(super) gate: Vec<Option<String>>,
    pub(super) rate_limit: Vec<Option<String>>,
    pub(super) rate_key: Vec<Option<String>>,
    pub(super) rate_weight: Vec<Option<f64>>,
}

impl Moves {
    fn of(sorted: &[&Commit<'_>]) -> Option<Self> {
        let plain = |c: &&Commit<'_>| c.output.transition == Transition::default();
        if sorted.iter().all(plain) {
            return None;
        }
        let mut m = Moves::default();
        for c in sorted {
            let t = &c.output.transition;
            let (keyed, key, gate) = t.key_columns();
            m.keyed.push(keyed);
            m.key.push(key);
            m.gate.push(gate);
            m.rate_limit
                .push(t.rate.as_ref().map(|r| r.key.name.clone()));
            m.rate_key.push(t.rate.as_ref().map(|r| r.key.key.clone()));
            m.rate_weight.push(t.rate.as_ref().map(|r| r.weight));
        }
        Some(m)
    }
}

impl<'x> Arrays<'x> {
    pub(super) fn of(sorted: &[&'x Commit<'_>], spawned: &HashMap<i64, i32>) -> Self {
        let n = sorted.len();
        let mut a = Arrays {
            id: Vec::with_capacity(n),
            epoch: Vec::with_capacity(n),
            kind: Vec::with_capacity(n),
            step: Vec::with_capacity(n),
            state: Vec::with_capacity(n),
            result: Vec::with_capacity(n),
            error: Vec::with_capacity(n),
            delay: Vec::with_capacity(n),
            awaits: Vec::with_capacity(n),
            children: Vec::with_capacity(n),
            run_ahead: Vec::with_capacity(n),
            consumed: Vec::new(),
            seen: Vec::new(),
            history: sorted
                .iter()
                .any(|c| c.history.code().is_some())
                .then(|| (Vec::with_capacity(n), Vec::with_capacity(n))),
            moves: Moves::of(sorted),
        };
        for c in sorted {
            let out: &'x StepOutput = c.output;
            let outcome = &out.outcome;
            a.id.push(c.id);
            a.epoch.push(c.epoch);
            if let Some((levels, ran)) = &mut a.history {
                levels.push(c.history.code());
                ran.push(i64::try_from(out.duration.as_micros()).unwrap_or(i64::MAX));
            }
            a.kind.push(sql_kind(outcome.kind()));
            a.state.push((!c.keep_state).then_some(&out.state));
            a.error.push(match outcome {
                Outcome::Stop { reason } => Some(reason.as_str()),
                _ => out.error.as_deref(),
            });
            a.children.push(spawned.get(&c.id).copied().unwrap_or(0));
            a.run_ahead
                .push(c.run_ahead && matches!(outcome, Outcome::Next { .. }));
            let (step, result, delay, awaits) = match outcome {
                Outcome::Next { step } => (Some(*step), None, None, None),
                Outcome::Replay { delay } => (None, None, Some(millis(*delay)), None),
                Outcome::Await {
                    names,
                    step,
                    timeout,
                } => (
                    Some(*step),
                    None,
                    timeout.map(millis),
                    // Unit separator: cannot appear in a signal name worth awaiting.
                    Some(names.join("\u{1f}")),
                ),
                Outcome::ScheduleChildren { step, .. } => (Some(*step), None, None, None),
                Outcome::Done { result } => (None, Some(result), None, None),
                Outcome::Stop { .. } => (None, None, None, None),
            };
            a.step.push(step);
            a.result.push(result);
            a.delay.push(delay);
            a.awaits.push(awaits);
            match outcome {
                Outcome::Next { .. } | Outcome::ScheduleChildren { .. } => {
                    a.consumed.extend_from_slice(&out.awaited)
                }
                Outcome::Await { .. } => a.seen.extend_from_slice(&out.awaited),
                _ => {}
            }
        }
        a
    }
}

/// A kind as the commit function names it: migration 0004 predates the
/// `schedule_children` spelling, and a migration's text is fixed by its checksum.
fn sql_kind(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::ScheduleChildren => "schedule_childs",
        other => other.as_str(),
    }
}
