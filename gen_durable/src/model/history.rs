//! An instance's history: what each of its steps did, and what happened to it besides
//! (a lost lease, a release), as the database recorded it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// How much of its history an FSM keeps, declared with `#[durable_fsm(history = "…")]`.
///
/// Every level records lost leases and releases: they are rare, and they are what an
/// operator needs first when an instance misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryLevel {
    /// An entry per step, with the state the step began with (what starting again from a
    /// past step needs).
    Full,
    /// An entry per step, without its state (the default).
    #[default]
    Steps,
    /// No entry for steps.
    Off,
}

impl HistoryLevel {
    /// The name `#[durable_fsm(history = …)]` takes: `full`, `steps` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryLevel::Full => "full",
            HistoryLevel::Steps => "steps",
            HistoryLevel::Off => "off",
        }
    }

    /// As the commit functions take it (`p_history`): NULL for off, 1 steps, 2 full.
    pub(crate) fn code(self) -> Option<i16> {
        match self {
            HistoryLevel::Full => Some(2),
            HistoryLevel::Steps => Some(1),
            HistoryLevel::Off => None,
        }
    }
}

impl fmt::Display for HistoryLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an entry of the history records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryKind {
    /// The step went on to `next_step`.
    Next,
    /// The step failed and runs again (its `error`).
    Retry,
    /// The step parks until a signal (or a timeout) and goes on at `next_step`.
    Await,
    /// The step spawned `children` and goes on at `next_step` once they end.
    Children,
    /// The step finished the instance.
    Done,
    /// The step stopped the instance for good (its `error`).
    Failed,
    /// The instance was cancelled while the step ran: its outcome was not written.
    Cancelled,
    /// The step's worker lost its lease (it stopped, or lost the database): the step
    /// runs again, or the instance failed (`error` says which).
    LeaseLost,
    /// A draining worker gave the step back before it ran.
    Released,
    /// An operator asked to cancel the instance while its step ran (`actor`): the step's
    /// outcome is then written as `cancelled`.
    CancelRequested,
    /// An operator retried the failed instance at its `step` (`actor`).
    Retried,
    /// An operator restarted the instance, from `step`, at `next_step` (`actor`).
    Restarted,
    /// The instance moved to a later version of its FSM (`detail`), from `step` to
    /// `next_step`: by an operator's bulk migration (`actor`), or by the node that
    /// claimed it (`node`).
    Migrated,
    /// The instance was started as a fork of another's past step
    /// ([`Client::fork`](crate::Client::fork)): `detail` names the instance and entry it
    /// came from, `actor` who forked it.
    Forked,
}

impl HistoryKind {
    /// The stored name, e.g. `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Next => "next",
            HistoryKind::Retry => "retry",
            HistoryKind::Await => "await",
            HistoryKind::Children => "children",
            HistoryKind::Done => "done",
            HistoryKind::Failed => "failed",
            HistoryKind::Cancelled => "cancelled",
            HistoryKind::LeaseLost => "lease_lost",
            HistoryKind::Released => "released",
            HistoryKind::CancelRequested => "cancel_requested",
            HistoryKind::Retried => "retried",
            HistoryKind::Restarted => "restarted",
            HistoryKind::Migrated => "migrated",
            HistoryKind::Forked => "forked",
        }
    }

    /// Every kind.
    pub const ALL: [HistoryKind; 14] = [
        HistoryKind::Next,
        HistoryKind::Retry,
        HistoryKind::Await,
        HistoryKind::Children,
        HistoryKind::Done,
        HistoryKind::Failed,
        HistoryKind::Cancelled,
        HistoryKind::LeaseLost,
        HistoryKind::Released,
        HistoryKind::CancelRequested,
        HistoryKind::Retried,
        HistoryKind::Restarted,
        HistoryKind::Migrated,
        HistoryKind::Forked,
    ];
}

impl fmt::Display for HistoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HistoryKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        HistoryKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown history kind {s:?}"))
    }
}

/// One entry of an instance's history ([`Client::history`](crate::Client::history)).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HistoryEntry {
    /// The entry's id: entries of one instance are in its order.
    pub entry: i64,
    /// When it was committed (the database's clock).
    pub at: DateTime<Utc>,
    /// What happened.
    pub kind: HistoryKind,
    /// The step that ran (for a lost lease or a release: the step that was to run).
    pub step: String,
    /// The step's attempt, from 1.
    pub attempt: i32,
    /// When the step began: `at` less the step's duration as its worker measured it.
    pub started_at: Option<DateTime<Utc>>,
    /// The step the outcome leads to (`next`, `await`, `children`).
    pub next_step: Option<String>,
    /// The node whose worker ran the step (or lost its lease).
    pub node: Option<String>,
    /// The step's error, a stop's reason, or a lost lease's account.
    pub error: Option<String>,
    /// The ids of the signals the step consumed.
    pub signals: Vec<i64>,
    /// How many children the step spawned.
    pub children: Option<i32>,
    /// The state the step began with (history level `full` only).
    pub state: Option<Value>,
    /// Who did an operator's action: the name its client was given
    /// ([`Client::with_actor`](crate::Client::with_actor)), else the database role it
    /// connected as. `None` for what the engine did.
    pub actor: Option<String>,
    /// What an action did that the other fields do not say (a migration's versions).
    pub detail: Option<String>,
}

/// A page of an instance's history, oldest first.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HistoryPage {
    /// The entries, oldest first.
    pub entries: Vec<HistoryEntry>,
    /// Where the next page starts (pass it as `after`), if there may be more.
    pub next: Option<i64>,
}
