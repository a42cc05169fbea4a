//! Bulk instance migration: [`crate::Client::migrate_instances`] and `gen_durable
//! migrate-instances`. Moves the live rows of an FSM that are not executing to a later
//! version with the registered [`crate::Migration`]s, in short id-ordered batches (see
//! `store::pg::migration`); executing rows are left to the lazy path (the node that runs
//! them migrates them on their next claim, if it knows the migration).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::types::Json;
use sqlx::PgPool;

use serde_json::Value;

use crate::client::Client;
use crate::model::clock::Clock;
use crate::model::error::{Error, Result};
use crate::model::rows::Migrated;
use crate::runtime::instance_migration::{apply_path, MigrationEntry};
use crate::runtime::registry::Registry;
use crate::store::pg::migration;
use crate::store::pooler::Pooler;

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

/// The engine-independent part of a bulk migration, shared by
/// [`crate::Client::migrate_instances`] and the testkit's: the chains checked before
/// anything is written, each batch's rows transformed, the report kept.
#[doc(hidden)]
#[derive(Debug)]
pub struct BulkPass<'r> {
    registry: &'r Registry,
    paths: BTreeMap<i32, Vec<MigrationEntry>>,
    report: MigrationReport,
}

/// A batch's outcome: rows moved `(id, migrated)`, rows whose transform failed `(id, error)`.
#[doc(hidden)]
pub type BatchOutcome = (Vec<(i64, Migrated)>, Vec<(i64, String)>);

impl<'r> BulkPass<'r> {
    /// Checks every chain: from each of `versions` (those live rows of `fsm` below `to`
    /// are at) to `to`, and that some migration ends at `to` — else
    /// [`Error::NoMigration`], before anything is written.
    pub fn new(
        registry: &'r Registry,
        fsm: &str,
        to: i32,
        versions: &[i32],
        dry_run: bool,
    ) -> Result<Self> {
        if !registry.migrations().any(|m| m.name == fsm && m.to == to) {
            let from = versions.first().copied().unwrap_or(0);
            return Err(registry.path_to(fsm, from, to).err().unwrap_or_else(|| {
                Error::InvalidConfig(format!("no migration of {fsm} to v{to}"))
            }));
        }
        let mut paths = BTreeMap::new();
        for &v in versions {
            paths.insert(v, registry.path_to(fsm, v, to)?);
        }
        Ok(BulkPass {
            registry,
            paths,
            report: MigrationReport {
                fsm: fsm.to_string(),
                to,
                dry_run,
                ..MigrationReport::default()
            },
        })
    }

    /// Transforms one batch of rows `(id, version, step, state)` and counts the outcome.
    pub fn batch<'a>(
        &mut self,
        rows: impl IntoIterator<Item = (i64, i32, &'a str, &'a Value)>,
    ) -> BatchOutcome {
        let (fsm, to) = (self.report.fsm.as_str(), self.report.to);
        let mut moved = Vec::new();
        let mut failed = Vec::new();
        for (id, version, step, state) in rows {
            let path = match self.paths.get(&version) {
                Some(p) => p,
                // A version inserted since the check: its chain is checked now.
                None => match self.registry.path_to(fsm, version, to) {
                    Ok(p) => self.paths.entry(version).or_insert(p),
                    Err(e) => {
                        failed.push((id, e.to_string()));
                        continue;
                    }
                },
            };
            match apply_path(path, state, step) {
                Ok(m) => {
                    *self.report.migrated.entry(version).or_default() += 1;
                    moved.push((id, m));
                }
                Err(e) => failed.push((id, e)),
            }
        }
        self.report.failed += failed.len() as u64;
        let room = LISTED_FAILURES.saturating_sub(self.report.failures.len());
        self.report
            .failures
            .extend(failed.iter().take(room).cloned());
        (moved, failed)
    }

    /// The report, given what is left below `to` after the pass: `executing` rows and
    /// `other` live rows (failed ones, and in a dry run the ones it would have moved,
    /// are not counted as skipped).
    pub fn finish(mut self, executing: u64, other: u64) -> MigrationReport {
        let r = &mut self.report;
        r.executing = executing;
        let accounted = r.failed + if r.dry_run { r.migrated_total() } else { 0 };
        r.skipped = other.saturating_sub(accounted);
        self.report
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    pool: &PgPool,
    pooler: Pooler,
    clock: &Clock,
    registry: &Registry,
    actor: Option<&str>,
    fsm: &str,
    to: i32,
    opts: MigrateOptions,
) -> Result<MigrationReport> {
    let versions = migration::old_versions(pooler.pool(pool), fsm, to).await?;
    let mut pass = BulkPass::new(registry, fsm, to, &versions, opts.dry_run)?;
    let limit = i64::try_from(opts.batch.max(1)).unwrap_or(i64::MAX);
    let mut after = 0_i64;
    loop {
        let mut tx = pool.begin().await?;
        let rows =
            migration::batch(pooler.on(&mut *tx), fsm, to, after, limit, !opts.dry_run).await?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        let (moved, failed) = pass.batch(
            rows.iter()
                .map(|(id, version, step, Json(state))| (*id, *version, step.as_str(), state)),
        );
        if !opts.dry_run {
            let now = clock.now_param();
            migration::apply_batch(pooler.on(&mut *tx), &moved, actor, now).await?;
            migration::note_failed(pooler.on(&mut *tx), &failed, now).await?;
            tx.commit().await?;
        }
    }
    let (executing, other) = migration::left(pooler.pool(pool), fsm, to).await?;
    Ok(pass.finish(executing as u64, other as u64))
}

impl Client {
    /// Moves the live rows of FSM `fsm` below version `to` that are not executing to
    /// version `to`, with the [`crate::Migration`]s of this client's registry (the linked
    /// ones unless [`Client::with_registry`]), in short batches that never block the engine.
    /// A row whose transform fails stays on its version with the error in `last_error`;
    /// executing rows are left to their node. Every chain is checked before anything is
    /// written: with none from a version some row is at, the answer is
    /// [`crate::Error::NoMigration`] and nothing changes. See [`MigrateOptions`] for a dry run.
    pub async fn migrate_instances(
        &self,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
    ) -> Result<MigrationReport> {
        run(
            self.pool(),
            self.pooler(),
            self.clock(),
            self.registry(),
            self.actor(),
            fsm,
            to,
            opts,
        )
        .await
    }
}
