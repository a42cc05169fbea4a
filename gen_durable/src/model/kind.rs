//! [`OutcomeKind`]: what a step decided, by name — in events, the testkit's tally and the
//! commit statement.

use std::fmt;

/// The kind of a step's outcome: which [`crate::Step`] constructor built it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutcomeKind {
    /// [`crate::Step::next`]: go on to another step.
    Next,
    /// [`crate::Step::replay`]: run the same step again later, `attempt + 1`.
    Replay,
    /// [`crate::Step::await_signal`]: park until a named signal (or the timeout).
    Await,
    /// [`crate::Step::schedule_children`]: insert children and wait for them all.
    ScheduleChildren,
    /// [`crate::Step::done`]: finished with a result.
    Done,
    /// [`crate::Step::stop`]: failed for good.
    Stop,
}

impl OutcomeKind {
    /// Every kind, in declaration order.
    pub const ALL: [OutcomeKind; 6] = [
        OutcomeKind::Next,
        OutcomeKind::Replay,
        OutcomeKind::Await,
        OutcomeKind::ScheduleChildren,
        OutcomeKind::Done,
        OutcomeKind::Stop,
    ];

    /// Its name in events and logs: `next`, `replay`, `await`, `schedule_children`,
    /// `done`, `stop`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Next => "next",
            OutcomeKind::Replay => "replay",
            OutcomeKind::Await => "await",
            OutcomeKind::ScheduleChildren => "schedule_children",
            OutcomeKind::Done => "done",
            OutcomeKind::Stop => "stop",
        }
    }

    /// True for the kinds that move the instance on (the step's awaited signals are
    /// consumed and its attempt count restarts): `next` and `schedule_children`.
    pub fn progresses(self) -> bool {
        matches!(self, OutcomeKind::Next | OutcomeKind::ScheduleChildren)
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with a kind's name, so that `kinds == ["next", "done"]` reads as it means.
impl PartialEq<&str> for OutcomeKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for OutcomeKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_name() {
        let mut names: Vec<&str> = OutcomeKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), OutcomeKind::ALL.len());
        assert_eq!(OutcomeKind::ScheduleChildren, "schedule_children");
    }
}
