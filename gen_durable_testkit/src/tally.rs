//! What a `run_until_idle` did: committed outcomes by kind.

use std::fmt;

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
    /// `Step::schedule_childs` outcomes.
    pub schedule_childs: usize,
    /// `Step::done` outcomes.
    pub done: usize,
    /// `Step::stop` outcomes, including failures `handle` turned into a stop.
    pub stop: usize,
    /// Every committed step.
    pub steps: usize,
}

impl Tally {
    /// Counts one committed outcome of `kind` (`next · replay · await · schedule_childs · done · stop`).
    pub fn record(&mut self, kind: &str) {
        match kind {
            "next" => self.next += 1,
            "replay" => self.replay += 1,
            "await" => self.await_ += 1,
            "schedule_childs" => self.schedule_childs += 1,
            "done" => self.done += 1,
            "stop" => self.stop += 1,
            other => panic!("unknown outcome kind {other:?}"),
        }
        self.steps += 1;
    }

    /// The count of one kind, by its telemetry name.
    pub fn of(&self, kind: &str) -> usize {
        match kind {
            "next" => self.next,
            "replay" => self.replay,
            "await" => self.await_,
            "schedule_childs" => self.schedule_childs,
            "done" => self.done,
            "stop" => self.stop,
            "steps" => self.steps,
            _ => 0,
        }
    }

    /// Adds another tally to this one.
    pub fn add(&mut self, other: Tally) {
        self.next += other.next;
        self.replay += other.replay;
        self.await_ += other.await_;
        self.schedule_childs += other.schedule_childs;
        self.done += other.done;
        self.stop += other.stop;
        self.steps += other.steps;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (name, n) in [
            ("next", self.next),
            ("replay", self.replay),
            ("await", self.await_),
            ("schedule_childs", self.schedule_childs),
            ("done", self.done),
            ("stop", self.stop),
        ] {
            if n > 0 {
                write!(f, "{name}: {n}, ")?;
            }
        }
        write!(f, "steps: {}}}", self.steps)
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn displays_the_kinds_that_occurred_then_the_total() {
        let mut t = Tally::default();
        assert_eq!(t.to_string(), "{steps: 0}");
        for k in ["next", "next", "next", "done"] {
            t.record(k);
        }
        assert_eq!(t.to_string(), "{next: 3, done: 1, steps: 4}");
        t.record("await");
        t.record("schedule_childs");
        assert_eq!(
            t.to_string(),
            "{next: 3, await: 1, schedule_childs: 1, done: 1, steps: 6}"
        );
    }
}
