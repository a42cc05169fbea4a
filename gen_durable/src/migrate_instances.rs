//! Bulk instance migration: [`crate::Client::migrate_instances`] and `gen_durable
//! migrate-instances`. Moves the live rows of an FSM that are not executing to a later
//! version with the registered [`crate::Migration`]s, in short id-ordered batches (see
//! `store::pg::migration`); executing rows are left to the lazy path (the node that runs
//! them migrates them on their next claim, if it knows the migration).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::types::Json;
use sqlx::PgPool;

use crate::error::{Error, Result};
use crate::instance_migration::{apply_path, MigrationEntry};
use crate::registry::Registry;
use crate::store::pg::migration;

/// How a bulk migration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateOptions {
    /// Run the transforms and count what they would do, writing nothing.
    pub dry_run: bool,
    /// Rows per transaction (default 500): each batch locks its rows only while their
    /// transforms run and their new versions are written.
    pub batch: usize,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            dry_run: false,
            batch: 500,
        }
    }
}

impl MigrateOptions {
    /// A dry run: counts, no writes.
    pub fn dry_run() -> Self {
        MigrateOptions {
            dry_run: true,
            ..Self::default()
        }
    }

    /// Rows per batch (at least 1).
    pub fn with_batch(mut self, rows: usize) -> Self {
        self.batch = rows.max(1);
        self
    }
}

/// What a bulk migration did (or, in a dry run, would do), per outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MigrationReport {
    /// The FSM.
    pub fsm: String,
    /// The version rows were moved to.
    pub to: i32,
    /// Nothing was written.
    pub dry_run: bool,
    /// Rows moved to `to` (would be, in a dry run), by the version they were at.
    pub migrated: BTreeMap<i32, u64>,
    /// Rows whose transform failed: left on their version with the error in `last_error`.
    pub failed: u64,
    /// The first failures (at most 20): `(id, error)`.
    pub failures: Vec<(i64, String)>,
    /// Executing rows, not touched: the node running one migrates it on its next claim if
    /// it knows the migration, or a rerun does once its step has ended.
    pub executing: u64,
    /// Other rows still below `to` after the pass: locked by someone else when their batch
    /// ran, or inserted at an old version since. A rerun takes them.
    pub skipped: u64,
}

impl MigrationReport {
    /// Rows moved, over all source versions.
    pub fn migrated_total(&self) -> u64 {
        self.migrated.values().sum()
    }
}

const LISTED_FAILURES: usize = 20;

pub(crate) async fn run(
    pool: &PgPool,
    registry: &Registry,
    fsm: &str,
    to: i32,
    opts: MigrateOptions,
) -> Result<MigrationReport> {
    // Every chain is checked before anything is written.
    let versions = migration::old_versions(pool, fsm, to).await?;
    if !registry.migrations().any(|m| m.name == fsm && m.to == to) {
        return Err(registry
            .path_to(fsm, versions.first().copied().unwrap_or(0), to)
            .err()
            .unwrap_or_else(|| Error::InvalidConfig(format!("no migration of {fsm} to v{to}"))));
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
    let limit = i64::try_from(opts.batch.max(1)).unwrap_or(i64::MAX);
    let mut after = 0_i64;
    loop {
        let mut tx = pool.begin().await?;
        let rows = migration::batch(&mut *tx, fsm, to, after, limit, !opts.dry_run).await?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        let mut moved = Vec::new();
        let mut failed = Vec::new();
        for (id, version, step, Json(state)) in rows {
            let path = match paths.get(&version) {
                Some(p) => p,
                // A version inserted since the check: its chain is checked now.
                None => match registry.path_to(fsm, version, to) {
                    Ok(p) => paths.entry(version).or_insert(p),
                    Err(e) => {
                        failed.push((id, e.to_string()));
                        continue;
                    }
                },
            };
            match apply_path(path, &state, &step) {
                Ok(m) => moved.push((id, version, m)),
                Err(e) => failed.push((id, e)),
            }
        }
        if !opts.dry_run {
            let rows: Vec<_> = moved
                .iter()
                .map(|(id, _, m)| (*id, m.version, m.state.clone(), m.step))
                .collect();
            migration::apply_batch(&mut *tx, &rows).await?;
            migration::note_failed(&mut *tx, &failed).await?;
            tx.commit().await?;
        }
        for (_, from, _) in &moved {
            *report.migrated.entry(*from).or_default() += 1;
        }
        report.failed += failed.len() as u64;
        let room = LISTED_FAILURES.saturating_sub(report.failures.len());
        report.failures.extend(failed.into_iter().take(room));
    }
    let (executing, other) = migration::left(pool, fsm, to).await?;
    report.executing = executing as u64;
    let accounted = report.failed
        + if opts.dry_run {
            report.migrated_total()
        } else {
            0
        };
    report.skipped = (other as u64).saturating_sub(accounted);
    Ok(report)
}
