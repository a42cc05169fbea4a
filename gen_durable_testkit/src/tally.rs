//! What a `run_until_idle` did: committed outcomes by kind.

use std::fmt;

use gen_durable::OutcomeKind;

/// Committed step outcomes by kind, as `run_until_idle` returns them. `Display` lists
/// the kinds that occurred, then the total: `{next: 3, done: 1, steps: 4}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Tally {
    /// `Step::next` outcomes.
    pub next: usize,
    /// `Step::replay` outcomes.
    pub replay: usize,
    /// `Step::await_signal` outcomes (also those that committed runnable at once).
    pub await_: usize,
    /// `Step::schedule_children` outcomes.
    pub schedule_children: usize,
    /// `Step::done` outcomes.
    pub done: usize,
    /// `Step::stop` outcomes, including failures `handle` turned into a stop.
    pub stop: usize,
    /// Every committed step.
    pub steps: usize,
}

impl Tally {
    /// Counts one committed outcome of `kind`.
    pub fn record(&mut self, kind: OutcomeKind) {
        *self.slot(kind) += 1;
        self.steps += 1;
    }

    /// The count of one kind.
    pub fn of(&self, kind: OutcomeKind) -> usize {
        let mut copy = *self;
        *copy.slot(kind)
    }

    /// The field that counts `kind`: the one place a kind maps to its field.
    fn slot(&mut self, kind: OutcomeKind) -> &mut usize {
        match kind {
            OutcomeKind::Next => &mut self.next,
            OutcomeKind::Replay => &mut self.replay,
            OutcomeKind::Await => &mut self.await_,
            OutcomeKind::ScheduleChildren => &mut self.schedule_children,
            OutcomeKind::Done => &mut self.done,
            OutcomeKind::Stop => &mut self.stop,
        }
    }

    /// Adds another tally to this one.
    pub fn add(&mut self, other: Tally) {
        for kind in OutcomeKind::ALL {
            *self.slot(kind) += other.of(kind);
        }
        self.steps += other.steps;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for kind in OutcomeKind::ALL {
            let n = self.of(kind);
            if n > 0 {
                write!(f, "{kind}: {n}, ")?;
            }
        }
        write!(f, "steps: {}}}", self.steps)
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;
    use gen_durable::OutcomeKind::{Await, Done, Next, ScheduleChildren};

    #[test]
    fn displays_the_kinds_that_occurred_then_the_total() {
        let mut t = Tally::default();
        assert_eq!(t.to_string(), "{steps: 0}");
        for k in [Next, Next, Next, Done] {
            t.record(k);
        }
        assert_eq!(t.to_string(), "{next: 3, done: 1, steps: 4}");
        t.record(Await);
        t.record(ScheduleChildren);
        assert_eq!(
            t.to_string(),
            "{next: 3, await: 1, schedule_children: 1, done: 1, steps: 6}"
        );
    }
}
