//! Which FSMs this process can run, resolved from a row's `(fsm, fsm_version)`.
//!
//! Every `#[durable_fsm]` / `#[durable_job]` type linked into the binary submits an
//! [`FsmEntry`] through `inventory`; [`Registry::linked`] collects them, and
//! `Engine::builder(..).register::<T>()` adds one explicitly.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::error::{Error, Result};
use crate::model::history::HistoryLevel;
use crate::model::insert::NewInstance;
use crate::model::options::InsertOptions;
use crate::model::rows::Migrated;
use crate::model::state::{CastError, DurableState};
use crate::model::step::StepOutput;
use crate::model::transition::StepRate;
use crate::runtime::fsm::Fsm;
use crate::runtime::instance_migration::{apply_path, Migration, MigrationEntry};
use crate::runtime::{run_erased, StepInput};

/// The type-erased description of one FSM version: what the engine needs to claim,
/// validate and run its rows without knowing the Rust type.
#[derive(Clone, Copy)]
pub struct FsmEntry {
    /// Stored FSM name.
    pub name: &'static str,
    /// Version.
    pub version: i32,
    /// Default queue.
    pub queue: &'static str,
    /// Stored step names.
    pub steps: &'static [&'static str],
    /// Lost leases allowed per step before the instance fails.
    pub max_reaps: i32,
    /// How much of its history each instance keeps.
    pub history: HistoryLevel,
    initial: fn() -> &'static str,
    cast: fn(&Value) -> std::result::Result<(), CastError>,
    step_rate: fn(&str, &Value) -> Option<StepRate>,
    pub(crate) run: fn(StepInput) -> futures_util::future::BoxFuture<'static, StepOutput>,
}

impl std::fmt::Debug for FsmEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsmEntry")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("queue", &self.queue)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

fn initial_of<F: Fsm>() -> &'static str {
    F::initial().step_name()
}

fn cast_of<F: Fsm>(value: &Value) -> std::result::Result<(), CastError> {
    F::State::cast(value).map(drop)
}

/// The rate limit step `step` declares (`#[step(rate_limit = …)]`), from `state`: the
/// state is cast only for a step that declares one.
fn step_rate_of<F: Fsm>(step: &str, state: &Value) -> Option<StepRate> {
    let step = F::from_step_name(step).filter(|s| s.rate_limited())?;
    step.step_rate_limit(&F::State::cast(state).ok()?)
}

fn run_of<F: Fsm>(input: StepInput) -> futures_util::future::BoxFuture<'static, StepOutput> {
    Box::pin(run_erased::<F>(input))
}

impl FsmEntry {
    /// The entry of FSM `F`. `const`, so macros can submit it to `inventory`.
    pub const fn of<F: Fsm>() -> Self {
        FsmEntry {
            name: F::NAME,
            version: F::VERSION,
            queue: F::QUEUE,
            steps: F::STEPS,
            max_reaps: F::MAX_REAPS,
            history: F::HISTORY,
            initial: initial_of::<F>,
            cast: cast_of::<F>,
            step_rate: step_rate_of::<F>,
            run: run_of::<F>,
        }
    }

    /// The stored name of the initial step.
    pub fn initial(&self) -> &'static str {
        (self.initial)()
    }

    /// Runs one step of an instance of this FSM (see [`crate::runtime::run_erased`]).
    #[doc(hidden)]
    pub fn run(&self, input: StepInput) -> futures_util::future::BoxFuture<'static, StepOutput> {
        (self.run)(input)
    }

    /// Checks that `state` casts into this FSM's state type.
    pub fn check_state(&self, state: &Value) -> std::result::Result<(), CastError> {
        (self.cast)(state)
    }

    /// The row an insert of this FSM writes: `state` (already JSON) with `opts`, its start
    /// step checked against the FSM's steps and every value against what PostgreSQL
    /// stores. Every insert path reduces to this: `insert`, `insert_all`, `insert_json`,
    /// a child, and the testkit's.
    #[doc(hidden)]
    pub fn new_instance(&self, state: Value, opts: InsertOptions) -> Result<NewInstance> {
        if let Some(step) = &opts.step {
            self.check_step(step)?;
        }
        let weighted = opts.weight.is_some();
        let mut row = NewInstance::from_parts(
            self.name,
            self.version,
            self.initial(),
            self.queue,
            self.max_reaps,
            state,
            opts,
        );
        // The first step's declared limit, unless the insert names one.
        if row.rate_limit.is_none() {
            if let Some(rate) = (self.step_rate)(&row.step, &row.state) {
                row.rate_limit = Some((rate.key.name, rate.key.key));
                if !weighted {
                    row.rate_weight = rate.weight;
                }
            }
        }
        row.validate()?;
        Ok(row)
    }

    /// Checks that `step` is one of this FSM's stored step names.
    pub fn check_step(&self, step: &str) -> Result<()> {
        if self.steps.contains(&step) {
            Ok(())
        } else {
            Err(Error::UnknownStep {
                fsm: self.name.to_string(),
                version: self.version,
                step: step.to_string(),
                known: self.steps.iter().map(|s| s.to_string()).collect(),
            })
        }
    }
}

inventory::collect!(FsmEntry);

/// A set of FSM versions, keyed by `(name, version)`, and the instance migrations
/// between them, keyed by `(name, from)`.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<(String, i32), FsmEntry>,
    migrations: BTreeMap<(String, i32), MigrationEntry>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every FSM and instance migration linked into this binary through the macros.
    pub fn linked() -> Self {
        let mut reg = Registry::new();
        for entry in inventory::iter::<FsmEntry> {
            reg.add(*entry);
        }
        for m in inventory::iter::<MigrationEntry> {
            reg.add_migration_entry(*m);
        }
        reg
    }

    /// Adds (or replaces) one entry.
    pub fn add(&mut self, entry: FsmEntry) {
        self.entries
            .insert((entry.name.to_string(), entry.version), entry);
    }

    /// Adds FSM `F`.
    pub fn register<F: Fsm>(&mut self) {
        self.add(FsmEntry::of::<F>());
    }

    /// Adds instance migration `M` (from `M::From` to `M`), replacing any other from
    /// the same version. `#[durable_migration]` does this for every node by itself.
    pub fn add_migration<M: Migration>(&mut self) {
        self.add_migration_entry(MigrationEntry::of::<M>());
    }

    /// Adds (or replaces) one migration entry.
    pub fn add_migration_entry(&mut self, entry: MigrationEntry) {
        self.migrations
            .insert((entry.name.to_string(), entry.from), entry);
    }

    /// Every migration, ordered by name then source version.
    pub fn migrations(&self) -> impl Iterator<Item = &MigrationEntry> {
        self.migrations.values()
    }

    /// Checks every migration's step map (each old step maps, none panics): run when
    /// an engine starts, so that a bad map is a start-up error rather than a failed claim.
    pub fn check_migrations(&self) -> Result<()> {
        for m in self.migrations.values() {
            m.check_steps().map_err(|reason| Error::BadMigration {
                fsm: m.name.to_string(),
                from: m.from,
                to: m.to,
                reason,
            })?;
        }
        Ok(())
    }

    /// The migrations a node applies on claiming a row of `(name, version)`: the chain
    /// from `version` as far as it goes, when it ends at a version registered here.
    /// `None` when there is no migration from `version`, or the chain ends at a version
    /// this node cannot run (then the row runs on its own version, if registered).
    pub fn upgrade_path(&self, name: &str, version: i32) -> Option<Vec<MigrationEntry>> {
        if self.migrations.is_empty() {
            return None; // every claim asks: no allocation when there are none
        }
        let mut path = Vec::new();
        let mut at = version;
        while let Some(m) = self.migrations.get(&(name.to_string(), at)) {
            path.push(*m);
            at = m.to;
        }
        (!path.is_empty() && self.get(name, at).is_some()).then_some(path)
    }

    /// The lazy migration of a claimed row of `(name, version)` at `(state, step)`: `None`
    /// when this node runs the row as it is (no migration from its version, or none that
    /// ends at a version registered here); else the version the chain goes to and the
    /// row after it, or the error of the hop that failed (the row stays as it was).
    pub fn upgrade(
        &self,
        name: &str,
        version: i32,
        state: &Value,
        step: &str,
    ) -> Option<(i32, std::result::Result<Migrated, String>)> {
        let path = self.upgrade_path(name, version)?;
        let to = path.last().map_or(version, |m| m.to);
        Some((to, apply_path(&path, state, step)))
    }

    /// The migrations that take `(name, from)` to version `to`, for a bulk migration, or
    /// a typed error naming where the chain breaks.
    pub fn path_to(&self, name: &str, from: i32, to: i32) -> Result<Vec<MigrationEntry>> {
        let mut path = Vec::new();
        let mut at = from;
        while at < to {
            match self.migrations.get(&(name.to_string(), at)) {
                Some(m) => {
                    path.push(*m);
                    at = m.to;
                }
                None => break,
            }
        }
        if at == to {
            Ok(path)
        } else {
            Err(Error::NoMigration {
                fsm: name.to_string(),
                from,
                to,
                known: self
                    .migrations
                    .values()
                    .filter(|m| m.name == name)
                    .map(|m| (m.from, m.to))
                    .collect(),
            })
        }
    }

    /// The entry for `(name, version)`, or a typed error saying which part is unknown.
    pub fn resolve(&self, name: &str, version: i32) -> Result<&FsmEntry> {
        if let Some(e) = self.entries.get(&(name.to_string(), version)) {
            return Ok(e);
        }
        let versions: Vec<i32> = self
            .entries
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect();
        if versions.is_empty() {
            let mut names: Vec<&str> = self.entries.keys().map(|(n, _)| n.as_str()).collect();
            names.dedup();
            Err(Error::UnknownFsm {
                name: name.to_string(),
                known: names.join(", "),
            })
        } else {
            Err(Error::UnknownVersion {
                name: name.to_string(),
                version,
                known: versions,
            })
        }
    }

    /// The row an insert by name writes (`Client::insert_json`, the testkit's): the FSM
    /// version resolved, `state` checked to cast into its state type, then as
    /// [`FsmEntry::new_instance`].
    #[doc(hidden)]
    pub fn new_instance(
        &self,
        fsm: &str,
        version: i32,
        state: Value,
        opts: InsertOptions,
    ) -> Result<NewInstance> {
        let entry = self.resolve(fsm, version)?;
        entry.check_state(&state)?;
        entry.new_instance(state, opts)
    }

    /// The entry for `(name, version)`, if registered.
    pub fn get(&self, name: &str, version: i32) -> Option<&FsmEntry> {
        self.entries.get(&(name.to_string(), version))
    }

    /// The highest registered version of `name`.
    pub fn latest(&self, name: &str) -> Option<&FsmEntry> {
        self.entries
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, e)| e)
            .next_back()
    }

    /// Every entry, ordered by name then version.
    pub fn iter(&self) -> impl Iterator<Item = &FsmEntry> {
        self.entries.values()
    }

    /// `(names, versions)` as two parallel arrays, for the pick's filter: the versions
    /// registered here, and the older ones this node migrates to one of them on a claim.
    pub(crate) fn name_version_arrays(&self) -> (Vec<String>, Vec<i32>) {
        let migratable = self
            .migrations
            .keys()
            .filter(|(name, from)| self.upgrade_path(name, *from).is_some());
        let mut pairs: Vec<(String, i32)> =
            self.entries.keys().chain(migratable).cloned().collect();
        pairs.sort();
        pairs.dedup();
        pairs.into_iter().unzip()
    }
}
