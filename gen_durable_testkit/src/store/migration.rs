//! Instance migrations on the in-memory table: the bulk pass of
//! `TestKit::migrate_instances`, as `Client::migrate_instances` runs it with the
//! statements of `gen_durable::store::pg::migration` (OLD_VERSIONS, LOCK_BATCH /
//! PEEK_BATCH, APPLY_BATCH, NOTE_FAILED, LEFT). The lazy path is the kit's `run_one`.
//!
//! Batches make no difference here: no step runs while the kit's caller holds it, so
//! no row is ever locked or executing, and one pass over the rows by id is every batch.

use std::collections::BTreeMap;

use gen_durable::__private::apply_path;
use gen_durable::{Error, MigrateOptions, MigrationEntry, MigrationReport, Registry, Result};
use gen_durable::{Migrated, Status};

use super::{Row, Store};

/// The failures a report lists (the rest are counted), as the client's.
const LISTED_FAILURES: usize = 20;

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
    ) -> Result<MigrationReport> {
        let versions = self.old_versions(fsm, to);
        if !registry.migrations().any(|m| m.name == fsm && m.to == to) {
            return Err(registry
                .path_to(fsm, versions.first().copied().unwrap_or(0), to)
                .err()
                .unwrap_or_else(|| {
                    Error::InvalidConfig(format!("no migration of {fsm} to v{to}"))
                }));
        }
        let mut paths: BTreeMap<i32, Vec<MigrationEntry>> = BTreeMap::new();
        for v in versions {
            paths.insert(v, registry.path_to(fsm, v, to)?);
        }

        let mut report = MigrationReport {
            fsm: fsm.to_string(),
            to,
            dry_run: opts.dry_run,
            ..MigrationReport::default()
        };
        let mut moved: Vec<(i64, i32, Migrated)> = Vec::new();
        let mut failed: Vec<(i64, String)> = Vec::new();
        for id in self.movable(fsm, to) {
            let row = &self.rows[&id];
            // Every movable row is live, so its version's chain was checked above.
            let path = &paths[&row.version];
            match apply_path(path, &row.state, &row.step) {
                Ok(m) => moved.push((id, row.version, m)),
                Err(e) => failed.push((id, e)),
            }
        }
        if !opts.dry_run {
            for (id, _, m) in &moved {
                let row = self.rows.get_mut(id).expect("a movable row exists");
                (row.version, row.state, row.step) = (m.version, m.state.clone(), m.step.into());
            }
            for (id, error) in &failed {
                self.rows
                    .get_mut(id)
                    .expect("a movable row exists")
                    .last_error = Some(error.clone());
            }
        }
        for (_, from, _) in &moved {
            *report.migrated.entry(*from).or_default() += 1;
        }
        report.failed = failed.len() as u64;
        report.failures = failed.into_iter().take(LISTED_FAILURES).collect();

        let (executing, other) = self.left(fsm, to);
        report.executing = executing;
        let accounted = report.failed
            + if opts.dry_run {
                report.migrated_total()
            } else {
                0
            };
        report.skipped = other.saturating_sub(accounted);
        Ok(report)
    }
}
