//! The lazy instance migration: a claimed row of a version this node migrates (see
//! [`crate::Registry::upgrade_path`]) is moved to the newest version before its step runs.
//!
//! The transforms run in memory, all of them, before anything is written (a chain moves a
//! row all the way or not at all). Then either the migration is written fenced by the
//! claim (once: a lost lease writes nothing) and the step runs on the new version under
//! the same claim, or — a transform failed or panicked — the row stays on its old version:
//! its step is committed as a `replay` after `backoff(attempt)` with the error as
//! `last_error`, like any outcome, and an event says why.

use std::sync::Arc;

use crate::engine::shared::Shared;
use crate::model::history::HistoryLevel;
use crate::model::step::StepOutput;
use crate::runtime::registry::FsmEntry;
use crate::store::pg::{claim, migration};
use crate::telemetry::Event;

/// What became of a claimed row's migration.
// Moved once per claim and never stored: boxing the row would cost an allocation a step.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Upgraded {
    /// Migrated and written: run the step of `entry` (the new version) on `row`.
    Run(FsmEntry, claim::Claimed),
    /// Not run: the lease was lost, or the transform failed and the row's replay was
    /// handed to the committer (whose delay, if committed, is returned).
    Stop(Option<std::time::Duration>),
}

/// Migrates `row` if this node migrates its version (`Err(row)`: run it as it is).
pub(crate) async fn upgrade(
    shared: &Shared,
    queue: &Arc<str>,
    mut row: claim::Claimed,
) -> Result<Upgraded, claim::Claimed> {
    let (id, epoch, from) = (row.id, row.lease_epoch, row.fsm_version);
    let Some((to, migrated)) = shared
        .registry
        .upgrade(&row.fsm, from, &row.state, &row.step)
    else {
        return Err(row);
    };
    let Some(entry) = shared.registry.get(&row.fsm, to).copied() else {
        return Err(row); // `upgrade` ends at a registered version: unreachable.
    };
    let fsm = entry.name;
    Ok(match migrated {
        Ok(m) => {
            let written = migration::migrate_claimed(
                shared.db.exec(),
                id,
                epoch,
                &shared.node_id,
                m.version,
                &m.state,
                m.step,
                shared.db.now(),
            )
            .await;
            match written {
                Ok(true) => {}
                Ok(false) => return Ok(Upgraded::Stop(None)),
                Err(e) => {
                    tracing::error!(target: "gen_durable::migration", id, error = %e,
                        "the migration was not written; it runs again once the lease expires");
                    return Ok(Upgraded::Stop(None));
                }
            }
            shared
                .telemetry
                .emit(Event::InstanceMigrated { id, fsm, from, to });
            (row.fsm_version, row.state, row.step) = (m.version, m.state, m.step.to_string());
            Upgraded::Run(entry, row)
        }
        Err(error) => {
            shared.telemetry.emit(Event::MigrationFailed {
                id,
                fsm,
                from,
                to,
                error: error.clone(),
            });
            let output = StepOutput::migration_failed(row.state, error, row.attempt);
            let delay = match &output.outcome {
                crate::model::step::Outcome::Replay { delay } => Some(*delay),
                _ => None,
            };
            match shared
                .committer
                .commit(queue, id, epoch, output, false, None, HistoryLevel::Steps)
                .await
            {
                Ok(reply) if reply.committed => Upgraded::Stop(delay),
                Ok(_) => Upgraded::Stop(None),
                Err(e) => {
                    tracing::error!(target: "gen_durable::migration", id, error = %e,
                        "a failed migration's replay was not committed");
                    Upgraded::Stop(None)
                }
            }
        }
    })
}
