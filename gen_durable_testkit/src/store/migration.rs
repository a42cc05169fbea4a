//! Instance migrations on the in-memory table: the bulk pass of
//! `TestKit::migrate_instances`, as `Client::migrate_instances` runs it with the
//! statements of `gen_durable::store::pg::migration` (OLD_VERSIONS, LOCK_BATCH /
//! PEEK_BATCH, APPLY_BATCH, NOTE_FAILED, LEFT). The lazy path is the kit's `run_one`.
//!
//! Batches make no difference here: no step runs while the kit's caller holds it, so
//! no row is ever locked or executing, and one pass over the rows by id is every batch.

use chrono::{DateTime, Utc};
use gen_durable::{
    BulkPass, HistoryKind, MigrateOptions, Migrated, MigrationReport, Registry, Result, Status,
};

use super::history::Extra;
use super::{Row, Store, KIT_NODE};

impl Row {
    /// Live: neither `done` nor `failed` (`status NOT IN ('done', 'failed')`).
    fn live(&self) -> bool {
        !self.status.is_terminal()
    }

    /// A row of `fsm` below version `to`.
    fn below(&self, fsm: &str, to: i32) -> bool {
        self.fsm == fsm && self.version < to
    }
}

impl Store {
    /// OLD_VERSIONS: the versions below `to` that live rows of `fsm` are at, ascending.
    fn old_versions(&self, fsm: &str, to: i32) -> Vec<i32> {
        let mut versions: Vec<i32> = self
            .rows
            .values()
            .filter(|r| r.below(fsm, to) && r.live())
            .map(|r| r.version)
            .collect();
        versions.sort_unstable();
        versions.dedup();
        versions
    }

    /// LOCK_BATCH without its limit: the rows a bulk migration moves — below `to`,
    /// runnable or parked (never executing, never finished) — by id.
    fn movable(&self, fsm: &str, to: i32) -> Vec<i64> {
        self.rows
            .values()
            .filter(|r| r.below(fsm, to))
            .filter(|r| {
                matches!(
                    r.status,
                    Status::Runnable | Status::AwaitingSignal | Status::AwaitingChildren
                )
            })
            .map(|r| r.id)
            .collect()
    }

    /// LEFT: what is still below `to` after a pass: `(executing, other live rows)`.
    fn left(&self, fsm: &str, to: i32) -> (u64, u64) {
        let left = self.rows.values().filter(|r| r.below(fsm, to) && r.live());
        left.fold((0, 0), |(executing, other), r| {
            if r.status == Status::Executing {
                (executing + 1, other)
            } else {
                (executing, other + 1)
            }
        })
    }

    /// A bulk migration of the live rows of `fsm` below `to` (see `Client::migrate_instances`):
    /// every chain checked first — [`Error::NoMigration`] and nothing written if a row's
    /// version has none, or no migration ends at `to` — then each row moved (APPLY_BATCH:
    /// version, state, step; nothing else) or, if its transform fails, left where it is
    /// with the error in `last_error` (NOTE_FAILED). A dry run writes nothing.
    pub(crate) fn migrate_instances(
        &mut self,
        registry: &Registry,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
        now: DateTime<Utc>,
    ) -> Result<MigrationReport> {
        let versions = self.old_versions(fsm, to);
        let mut pass = BulkPass::new(registry, fsm, to, &versions, opts.dry_run)?;
        let ids = self.movable(fsm, to);
        let (moved, failed) = pass.batch(ids.iter().map(|id| {
            let row = &self.rows[id];
            (row.id, row.version, row.step.as_str(), &row.state)
        }));
        if !opts.dry_run {
            for (id, m) in moved {
                self.migrate_row(id, m, true, now);
            }
            for (id, error) in failed {
                let row = self.rows.get_mut(&id).expect("a movable row exists");
                row.last_error = Some(error);
                row.updated_at = now;
            }
        }
        let (executing, other) = self.left(fsm, to);
        Ok(pass.finish(executing, other))
    }

    /// Moves row `id` to `m` (version, state, step) and records it in the history, as
    /// MIGRATE_CLAIMED does for the node that claimed it (`by_operator` false) and
    /// APPLY_BATCH for an operator's bulk migration.
    pub(crate) fn migrate_row(
        &mut self,
        id: i64,
        m: Migrated,
        by_operator: bool,
        now: DateTime<Utc>,
    ) {
        let row = self.rows.get_mut(&id).expect("a migrated row exists");
        let (was, from) = (row.step.clone(), row.version);
        let attempt = row.attempt + 1;
        (row.version, row.state, row.step) = (m.version, m.state, m.step.into());
        row.updated_at = now;
        self.note(
            id,
            now,
            HistoryKind::Migrated,
            &was,
            attempt,
            Extra {
                next_step: Some(m.step.to_string()),
                node: (!by_operator).then(|| KIT_NODE.to_string()),
                by_operator,
                detail: Some(format!("from version {from} to {}", m.version)),
                ..Extra::default()
            },
        );
    }
}
