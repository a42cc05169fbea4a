//! Restarting an instance at a named step: `Client::restart`.

use crate::model::error::{Error, Result};
use crate::store::pg;
use crate::{Client, Status};

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

/// Checks `step` against the steps of `fsm` v`version`: those of `registry` if it has the
/// version, else those a live node announces (`announced`), else [`Error::UnknownSteps`].
pub fn check_restart_step(
    registry: &crate::Registry,
    fsm: &str,
    version: i32,
    step: &str,
    announced: Option<Vec<String>>,
) -> Result<()> {
    if let Some(entry) = registry.get(fsm, version) {
        return entry.check_step(step);
    }
    match announced {
        Some(known) if known.iter().any(|s| s == step) => Ok(()),
        Some(known) => Err(Error::UnknownStep {
            fsm: fsm.to_string(),
            version,
            step: step.to_string(),
            known,
        }),
        None => Err(Error::UnknownSteps {
            fsm: fsm.to_string(),
            version,
        }),
    }
}

impl Client {
    /// Runs instance `id` again from step `step`: an instance that is `failed`, `done`, or
    /// live but not executing (runnable, parked on a signal or on children) becomes
    /// runnable now at `step`, with `attempt` 0, nothing awaited, no deadline and no
    /// result. Its inbox is kept (a finished instance's was deleted when it ended) and
    /// its state is the last committed one.
    ///
    /// The step is checked against the FSM version's steps, from this client's registry
    /// when it has the instance's `(fsm, version)`, else from what live nodes announce;
    /// if neither knows that version: [`Error::UnknownSteps`]. An unknown step is
    /// [`Error::UnknownStep`].
    ///
    /// Refused, with nothing changed: an executing instance ([`Error::WrongStatus`]:
    /// cancel it, or wait for its step to end), one with live children (`WrongStatus`:
    /// they would be counted by no step; cancel it first), a finished child whose parent
    /// no longer waits for its children ([`Error::ParentMovedOn`], as for `retry`; while the
    /// parent still waits it waits for this child again), and a finished instance whose
    /// unique key another instance now holds ([`Error::Duplicate`]).
    pub async fn restart(&self, id: i64, step: &str) -> Result<()> {
        let now = self.clock().now_param();
        let (fsm, version, announced) =
            pg::control::steps_of(self.pooler().pool(self.pool()), id, now)
                .await?
                .ok_or(Error::NotFound { id })?;
        check_restart_step(self.registry(), &fsm, version, step, announced)?;
        let mut tx = self.pool().begin().await?;
        let conn = self.pooler().on(&mut *tx);
        let found = pg::control::restart(conn, id, step, version, now).await?;
        tx.commit().await?;
        crate::wait::wake(id);
        found.answer(id)
    }
}

#[cfg(test)]
mod tests {
    use super::RestartFound;
    use crate::{Error, Status};

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
