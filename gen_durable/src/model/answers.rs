//! What an operation found, turned into its caller's answer — once, for both engines.
//!
//! A store (the PostgreSQL statements, or the testkit's in-memory rows) reports what it
//! found as one of the `…Found` values here; the mapping to the [`Error`] or value the
//! caller sees lives only here, so `Client` and `TestKit` cannot disagree on it. The
//! checks before a write live in `validate` ([`crate::check_signal`],
//! `NewInstance::validate`) and in [`crate::Registry::new_instance`].

use crate::model::error::{Error, Result};
use crate::model::status::Status;
use crate::model::target::Target;

/// What a cancel did: see `Client::cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled {
    /// Instances (the target and live descendants) failed at once.
    pub failed: usize,
    /// Executing instances that will fail after their current step (always 0 in the
    /// testkit, where no step runs between calls).
    pub after_current_step: usize,
}

/// What a delivery did: see `Client::signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The instance that got the signal (the key's holder, for a signal by key).
    pub id: i64,
    /// The stored signal's id; `None` when a signal with the same dedup key was already stored.
    pub signal_id: Option<i64>,
    /// True if the instance was awaiting this name and is now runnable.
    pub woke: bool,
}

/// What a store found when it cancelled an instance.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelFound {
    /// No such instance.
    NotFound,
    /// The instance had already finished.
    Finished(Status),
    /// Cancelled: `failed` rows failed at once, `flagged` executing rows fail after their step.
    Cancelled {
        /// Failed at once.
        failed: usize,
        /// Flagged while executing.
        flagged: usize,
    },
}

impl CancelFound {
    /// The caller's answer for instance `id`.
    pub fn answer(self, id: i64) -> Result<Cancelled> {
        match self {
            CancelFound::NotFound => Err(Error::NotFound { id }),
            CancelFound::Finished(status) => Err(Error::Finished { id, status }),
            CancelFound::Cancelled { failed, flagged } => Ok(Cancelled {
                failed,
                after_current_step: flagged,
            }),
        }
    }
}

/// What a store found when it retried an instance.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryFound {
    /// No such instance.
    NotFound,
    /// Only a failed instance can be retried.
    NotFailed(Status),
    /// A child whose parent no longer waits for its children.
    ParentMovedOn {
        /// The parent's id.
        parent: i64,
        /// The parent's status.
        status: Status,
    },
    /// Its unique key was taken since it failed.
    KeyTaken,
    /// Runnable again.
    Retried,
}

impl RetryFound {
    /// What a store found, from the instance's status, whether it was retried, and its
    /// parent with the parent's status (if it has a stored parent).
    pub fn of(status: Status, retried: bool, parent: Option<(i64, Status)>) -> Self {
        match (status, parent) {
            _ if retried => RetryFound::Retried,
            (Status::Failed, Some((parent, status))) => {
                RetryFound::ParentMovedOn { parent, status }
            }
            (st, _) => RetryFound::NotFailed(st),
        }
    }

    /// The caller's answer for instance `id`.
    pub fn answer(self, id: i64) -> Result<()> {
        match self {
            RetryFound::NotFound => Err(Error::NotFound { id }),
            RetryFound::Retried => Ok(()),
            RetryFound::NotFailed(status) => Err(Error::WrongStatus {
                id,
                status,
                what: "only a failed instance can be retried",
            }),
            RetryFound::ParentMovedOn { parent, status } => {
                Err(Error::ParentMovedOn { id, parent, status })
            }
            RetryFound::KeyTaken => Err(Error::Duplicate {
                key: format!("(the unique key of instance {id})"),
            }),
        }
    }
}

/// What a store found when it delivered a signal.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryFound {
    /// The instance the target resolved to; `None` if none.
    pub id: Option<i64>,
    /// The target's status before delivery; `None` if no such instance.
    pub status: Option<Status>,
    /// The new signal's id; `None` if nothing was stored.
    pub signal_id: Option<i64>,
    /// Whether the instance was woken.
    pub woke: bool,
}

impl DeliveryFound {
    /// The caller's answer for a signal to `target`.
    pub fn answer(self, target: &Target) -> Result<Delivery> {
        match (self.id, self.status) {
            (Some(id), Some(status)) if status.is_terminal() => Err(Error::Finished { id, status }),
            (Some(id), Some(_)) => Ok(Delivery {
                id,
                signal_id: self.signal_id,
                woke: self.woke,
            }),
            _ => Err(not_found(target)),
        }
    }
}

/// The error for a target that names no instance.
pub(crate) fn not_found(target: &Target) -> Error {
    match target {
        Target::Id(id) => Error::NotFound { id: *id },
        Target::Key(key) => Error::KeyNotFound { key: key.clone() },
    }
}

/// The answer to a one-row insert: its id, or [`Error::Duplicate`] if the row was
/// dropped because its unique key is held.
#[doc(hidden)]
pub fn inserted(id: Option<i64>, unique_key: Option<&str>) -> Result<i64> {
    id.ok_or_else(|| Error::Duplicate {
        key: unique_key.unwrap_or_default().to_string(),
    })
}

/// What a store found when it restarted an instance (see `Client::restart`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartFound {
    /// No such instance.
    NotFound,
    /// Executing: its node runs a step of it right now.
    Executing,
    /// It has live children, which its restarted steps would not count.
    LiveChildren(Status),
    /// A finished child whose parent no longer waits for its children.
    ParentMovedOn {
        /// The parent's id.
        parent: i64,
        /// The parent's status.
        status: Status,
    },
    /// Its unique key is held by another instance.
    KeyTaken,
    /// Its FSM version changed (an instance migration) after its step was checked.
    VersionChanged {
        /// The version the step was checked against.
        from: i32,
        /// Its version now.
        to: i32,
    },
    /// Runnable now at the step.
    Restarted,
}

impl RestartFound {
    /// What a store found, from the instance's status, whether it was restarted, its live
    /// children, and its parent with the parent's status (if it has a stored parent).
    pub fn of(status: Status, restarted: bool, live: i32, parent: Option<(i64, Status)>) -> Self {
        match (status, parent) {
            _ if restarted => RestartFound::Restarted,
            (Status::Executing, _) => RestartFound::Executing,
            (st, _) if live > 0 => RestartFound::LiveChildren(st),
            (_, Some((parent, status))) => RestartFound::ParentMovedOn { parent, status },
            // Not reached: any other status is restarted.
            (_, None) => RestartFound::Executing,
        }
    }

    /// The caller's answer for instance `id`.
    pub fn answer(self, id: i64) -> Result<()> {
        match self {
            RestartFound::NotFound => Err(Error::NotFound { id }),
            RestartFound::Restarted => Ok(()),
            RestartFound::Executing => Err(Error::WrongStatus {
                id,
                status: Status::Executing,
                what: "a step of it is running: restart it once the step has ended (cancel it first to stop it)",
            }),
            RestartFound::LiveChildren(status) => Err(Error::WrongStatus {
                id,
                status,
                what: "it has live children, which a restart would leave uncounted: cancel it (which cancels them) and restart it once they have ended",
            }),
            RestartFound::ParentMovedOn { parent, status } => Err(Error::ParentMovedOn {
                id,
                parent,
                status,
            }),
            RestartFound::KeyTaken => Err(Error::Duplicate {
                key: format!("(the unique key of instance {id})"),
            }),
            RestartFound::VersionChanged { from, to } => Err(Error::VersionChanged { id, from, to }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_to_a_finished_instance_is_refused_with_its_status() {
        let found = DeliveryFound {
            id: Some(7),
            status: Some(Status::Done),
            signal_id: None,
            woke: false,
        };
        let by_key = Target::Key("order:7".into());
        assert!(
            matches!(found.answer(&by_key), Err(Error::Finished { id: 7, status }) if status == Status::Done)
        );
        let nobody = DeliveryFound {
            id: None,
            status: None,
            signal_id: None,
            woke: false,
        };
        assert!(
            matches!(nobody.answer(&by_key), Err(Error::KeyNotFound { key }) if key == "order:7")
        );
        assert!(matches!(
            nobody.answer(&Target::Id(7)),
            Err(Error::NotFound { id: 7 })
        ));
    }

    #[test]
    fn a_retry_whose_key_was_taken_names_the_instance() {
        let e = RetryFound::KeyTaken.answer(3).unwrap_err();
        assert!(matches!(e, Error::Duplicate { key } if key.contains("instance 3")));
    }

    /// Each refusal is a typed error: the status a restart found, or the versions an
    /// instance migration moved the row between.
    #[test]
    fn a_refused_restart_answers_with_typed_values() {
        assert!(matches!(
            RestartFound::LiveChildren(Status::AwaitingChildren).answer(7),
            Err(Error::WrongStatus {
                id: 7,
                status: Status::AwaitingChildren,
                ..
            })
        ));
        assert!(matches!(
            RestartFound::VersionChanged { from: 1, to: 2 }.answer(7),
            Err(Error::VersionChanged {
                id: 7,
                from: 1,
                to: 2
            })
        ));
    }
}
