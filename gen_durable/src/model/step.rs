//! What a step produced, type-erased and ready to commit: its outcome, the state to
//! commit, the signals it saw, its own transaction and the flow control from the next step
//! on. (How a step is run to get it is the runtime's.) [`Outcome`] is the one outcome type:
//! [`crate::Step`] holds one, the runner hands it on, both stores apply it; [`OutcomeKind`]
//! names its variants in events, the testkit's tally and the commit statement.

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use sqlx::{Postgres, Transaction};

use crate::model::insert::NewInstance;
use crate::model::status::Status;
use crate::model::transition::Transition;

/// What a step produced, ready to commit.
#[derive(Debug)]
pub struct StepOutput {
    /// The outcome.
    pub outcome: Outcome,
    /// The state to commit.
    pub state: Value,
    /// Ids of the signals the step saw in `ctx.awaited()`. A progressing outcome (`next`,
    /// `schedule_children`) consumes them; an `await` does not count them as news, so a
    /// step that re-awaits to accumulate parks until a signal it has not seen arrives.
    pub awaited: Vec<i64>,
    /// `last_error` to record with the outcome (a `stop` records its reason).
    pub error: Option<String>,
    /// The step's own transaction, to commit with the outcome.
    pub tx: Option<Transaction<'static, Postgres>>,
    /// A `next` that may continue in the same worker under its claim (run-ahead).
    pub run_ahead: bool,
    /// The flow-control options of an outcome that leads to a step: the concurrency key
    /// and the rate limit from that step on (default: key kept, no limit).
    pub transition: Transition,
    /// How long the handler (and `handle`) ran.
    pub duration: Duration,
}

/// A type-erased step outcome.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Go on at `step`, runnable now.
    Next {
        /// Stored name of the next step.
        step: &'static str,
    },
    /// Run the same step again after `delay`.
    Replay {
        /// Delay from now.
        delay: Duration,
    },
    /// Park until a signal in `names` (or the timeout), then run `step`.
    Await {
        /// Awaited names.
        names: Vec<String>,
        /// Step to run on wake.
        step: &'static str,
        /// Give up waiting after this long.
        timeout: Option<Duration>,
    },
    /// Insert the children and park until all are terminal, then run `step`.
    ScheduleChildren {
        /// The children to insert.
        children: Vec<NewInstance>,
        /// Step to run when all are terminal.
        step: &'static str,
    },
    /// Finished.
    Done {
        /// The result.
        result: Value,
    },
    /// Failed for good.
    Stop {
        /// Recorded as `last_error`.
        reason: String,
    },
}

impl Outcome {
    /// Its kind.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Next { .. } => OutcomeKind::Next,
            Outcome::Replay { .. } => OutcomeKind::Replay,
            Outcome::Await { .. } => OutcomeKind::Await,
            Outcome::ScheduleChildren { .. } => OutcomeKind::ScheduleChildren,
            Outcome::Done { .. } => OutcomeKind::Done,
            Outcome::Stop { .. } => OutcomeKind::Stop,
        }
    }

    /// The status this outcome leaves the instance in, before signals or children
    /// can change it (an `await` may still commit as `runnable`).
    pub fn status(&self) -> Status {
        match self {
            Outcome::Next { .. } | Outcome::Replay { .. } => Status::Runnable,
            Outcome::Await { .. } => Status::AwaitingSignal,
            Outcome::ScheduleChildren { .. } => Status::AwaitingChildren,
            Outcome::Done { .. } => Status::Done,
            Outcome::Stop { .. } => Status::Failed,
        }
    }
}

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
