//! Restarting an instance at a named step: `Client::restart`.

use crate::model::error::{Error, Result};
use crate::store::pg;
use crate::Client;

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
        let found = pg::control::restart(conn, id, step, version, None, self.actor(), now).await?;
        tx.commit().await?;
        crate::client::wait::wake(id);
        found.answer(id)
    }
}
