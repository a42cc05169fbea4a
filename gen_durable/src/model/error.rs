//! The one error type of gen_durable's infrastructure. Step outcomes are values
//! ([`crate::Step`]), never errors; this enum is for what went wrong around them.

use crate::model::state::CastError;
use crate::model::status::Status;

/// Everything that can go wrong when inserting, signalling or running the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An instance with this `unique_key` is already in its uniqueness scope; nothing was inserted.
    #[error("duplicate: an instance with unique_key {key:?} is already in its uniqueness scope")]
    Duplicate {
        /// The key that is occupied.
        key: String,
    },
    /// No instance has this id.
    #[error("no instance with id {id}")]
    NotFound {
        /// The id that was asked for.
        id: i64,
    },
    /// No instance holds this correlation key (none was inserted with it, or the one
    /// that held it has finished and freed it); nothing was stored.
    #[error("no live instance holds the key {key:?}; nothing was stored")]
    KeyNotFound {
        /// The key that was asked for.
        key: String,
    },
    /// The instance has already ended (`done` or `failed`): a signal to it is not stored,
    /// a cancel changes nothing.
    #[error("instance {id} has already finished ({status}); nothing was changed")]
    Finished {
        /// The instance.
        id: i64,
        /// Its terminal status.
        status: Status,
    },
    /// The instance is not in a status that allows the operation.
    #[error("instance {id} is {status}: {what}")]
    WrongStatus {
        /// The instance.
        id: i64,
        /// Its current status.
        status: Status,
        /// What the operation needs.
        what: &'static str,
    },
    /// A child can be retried only while its parent still waits for its children; this
    /// one's parent has read its outcome and gone on. Nothing was changed.
    #[error("instance {id} is a child of instance {parent}, which is {status} and no longer waits for its children: a retried child would end with nobody counting it; nothing was changed")]
    ParentMovedOn {
        /// The child asked for.
        id: i64,
        /// Its parent.
        parent: i64,
        /// The parent's status.
        status: Status,
    },
    /// An instance migration moved the instance to another FSM version while the operation
    /// checked it; nothing was changed. Asking again acts on the new version.
    #[error("instance {id} moved from FSM version {from} to {to} while it was checked; nothing was changed: try again")]
    VersionChanged {
        /// The instance.
        id: i64,
        /// The version it was checked against.
        from: i32,
        /// Its version now.
        to: i32,
    },
    /// A value the database cannot store or index (a NUL character in JSON or text, a key
    /// over [`crate::MAX_KEY_BYTES`], a delay beyond [`crate::MAX_DELAY`], a uniqueness
    /// scope that a row could re-enter); the message says which and why. Nothing was written.
    #[error("invalid {what}: {reason}; nothing was written")]
    InvalidInput {
        /// What was wrong: `state`, `partition_key`, `signal payload`, …
        what: &'static str,
        /// Why, and the limit.
        reason: String,
    },
    /// A state does not cast into the FSM's state type; nothing was written.
    #[error("state does not cast: {0}")]
    InvalidState(#[from] CastError),
    /// No FSM of this name is registered in this process.
    #[error("unknown FSM {name:?}: no #[durable_fsm] or #[durable_job] of that name is linked or registered (known: {known})")]
    UnknownFsm {
        /// The name asked for.
        name: String,
        /// The names this process knows, comma-separated.
        known: String,
    },
    /// The FSM exists but not at this version.
    #[error("FSM {name:?} has no version {version} in this process (known versions: {known:?})")]
    UnknownVersion {
        /// The FSM name.
        name: String,
        /// The version asked for.
        version: i32,
        /// The versions this process knows.
        known: Vec<i32>,
    },
    /// No chain of registered instance migrations takes this FSM from one version to
    /// another; nothing was changed.
    #[error("no instance migration of FSM {fsm:?} from v{from} to v{to} is registered in this process (migrations known: {known:?})")]
    NoMigration {
        /// The FSM name.
        fsm: String,
        /// The version rows are at.
        from: i32,
        /// The version asked for.
        to: i32,
        /// The `(from, to)` migrations known for this FSM.
        known: Vec<(i32, i32)>,
    },
    /// An instance migration's step map does not map every old step.
    #[error("the instance migration of FSM {fsm:?} from v{from} to v{to} is invalid: {reason}")]
    BadMigration {
        /// The FSM name.
        fsm: String,
        /// Its source version.
        from: i32,
        /// Its target version.
        to: i32,
        /// What is wrong.
        reason: String,
    },
    /// The FSM has no step of this name.
    #[error("FSM {fsm:?} v{version} has no step {step:?} (steps: {known:?})")]
    UnknownStep {
        /// The FSM name.
        fsm: String,
        /// The FSM version.
        version: i32,
        /// The step asked for.
        step: String,
        /// The FSM's stored step names.
        known: Vec<String>,
    },
    /// The instance has no history entry of this id: it never had one, or the entry was
    /// collected after the history's retention. Nothing was written.
    #[error("instance {id} has no history entry {entry} (it never had one, or it was collected after the history's retention); nothing was written")]
    UnknownEntry {
        /// The instance.
        id: i64,
        /// The entry asked for.
        entry: i64,
    },
    /// The history entry holds no state to start from: only the step entries of an FSM
    /// that keeps `history = "full"` do. Nothing was written.
    #[error("entry {entry} of instance {id} ({kind}) holds no state to start from: only the step entries of an FSM with history = \"full\" do; nothing was written")]
    EntryWithoutState {
        /// The instance.
        id: i64,
        /// The entry asked for.
        entry: i64,
        /// What the entry records.
        kind: crate::HistoryKind,
    },
    /// Neither this process's registry nor any live node knows the steps of this FSM
    /// version, so a step given for it cannot be checked; nothing was written.
    #[error("the steps of FSM {fsm:?} v{version} are unknown here: this process has not registered it and no live node announces it (start a node that runs it, or call this from a binary that registers it); nothing was written")]
    UnknownSteps {
        /// The FSM name.
        fsm: String,
        /// The FSM version.
        version: i32,
    },
    /// A signal name must be 1 to 255 bytes long.
    #[error("signal name must be 1 to 255 bytes, got {len} bytes")]
    InvalidSignalName {
        /// The length given, in bytes.
        len: usize,
    },
    /// A signal payload is larger than the client's limit.
    #[error("signal payload is {size} bytes, over the limit of {limit} bytes (see Client::with_max_signal_payload)")]
    PayloadTooLarge {
        /// The payload's size as JSON, in bytes.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A step's outcome could not be committed (the database was unreachable or refused
    /// it). Nothing of it was written; the row is retried once its lease expires.
    #[error("outcome of instance {id} not committed: {reason}")]
    CommitFailed {
        /// The instance.
        id: i64,
        /// The underlying error.
        reason: String,
    },
    /// An insert or a transition named a gate that is not declared (no
    /// `EngineBuilder::gate` or `Client::set_gate` for it). Nothing was written.
    #[error("unknown gate {name:?}: declare it with EngineBuilder::gate or Client::set_gate; nothing was written")]
    UnknownGate {
        /// The gate named.
        name: String,
    },
    /// An insert named a rate limit that is not declared (no
    /// `EngineBuilder::rate_limit` or `Client::set_rate_limit` for it). Nothing was written.
    #[error("unknown rate limit {name:?}: declare it with EngineBuilder::rate_limit or Client::set_rate_limit; nothing was written")]
    UnknownRateLimit {
        /// The limit named.
        name: String,
    },
    /// A value given to a builder is out of range; the message says which and why.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A value could not be serialized to JSON.
    #[error("could not serialize to JSON: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The database returned an error or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The database of shard `shard` of a [`crate::ShardedClient`] returned an error or
    /// could not be reached: [`Error::Database`], naming the shard.
    #[error("shard {shard}: database error: {source}")]
    Shard {
        /// The shard's index in the [`crate::ShardedClient`].
        shard: usize,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// Running the migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The engine was started on a database whose schema lacks migrations this version
    /// needs (or has none): it wrote nothing.
    #[error("{}", schema_behind(.applied, .missing))]
    SchemaBehind {
        /// The newest schema migration applied, if any is.
        applied: Option<i64>,
        /// The migrations this version embeds that are not applied.
        missing: Vec<i64>,
    },
    /// The engine was started on a database migrated by a later version of gen_durable
    /// (applied migrations this version does not know): it wrote nothing.
    #[error("the database's gen_durable schema has migrations this version does not know ({unknown:?}; it knows up to {known}): it was migrated by a later gen_durable (or another migrator shares `_sqlx_migrations`). Run that version or a later one on every node")]
    SchemaAhead {
        /// The applied migrations newer than this version's newest.
        unknown: Vec<i64>,
        /// This version's newest migration.
        known: i64,
    },
}

fn schema_behind(applied: &Option<i64>, missing: &[i64]) -> String {
    const RUN: &str =
        "run `gen_durable migrate-schema` (or call `gen_durable::migrate_schema(&pool)`) first";
    match applied {
        None => format!("the database has no gen_durable schema: {RUN}"),
        Some(v) => format!(
            "the database's gen_durable schema is at migration {v}, and this version needs migrations {missing:?} too: {RUN}"
        ),
    }
}

impl Error {
    /// This error as met on shard `shard` (if any): a database error names the shard.
    pub(crate) fn on_shard(self, shard: Option<usize>) -> Error {
        match (self, shard) {
            (Error::Database(source), Some(shard)) => Error::Shard { shard, source },
            (e, _) => e,
        }
    }
}

/// `Result<T, gen_durable::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
