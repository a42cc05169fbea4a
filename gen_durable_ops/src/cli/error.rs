//! What can go wrong in a CLI command, what to do about it, and the exit code that
//! tells scripts which it was.

use std::fmt;
use std::process::ExitCode;

use gen_durable::Error;

/// The kinds of failure, each with its own exit code (documented in `--help` and the
/// README). Clap's own usage errors exit with 2 too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The database failed or refused the operation for another reason.
    Failed,
    /// A bad argument: a payload that is not JSON, a bad signal name, an age.
    Usage,
    /// No URL, a malformed URL, or the server could not be reached or logged into.
    Connect,
    /// The database has no gen_durable schema, or an older one.
    NotMigrated,
    /// No instance has this id.
    NotFound,
    /// The instance's status does not allow the operation (finished, not failed, …).
    Conflict,
}

impl Kind {
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Kind::Failed => 1,
            Kind::Usage => 2,
            Kind::Connect => 3,
            Kind::NotMigrated => 4,
            Kind::NotFound => 5,
            Kind::Conflict => 6,
        }
    }

    /// A stable name for `--json` output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Failed => "failed",
            Kind::Usage => "usage",
            Kind::Connect => "connect",
            Kind::NotMigrated => "not_migrated",
            Kind::NotFound => "not_found",
            Kind::Conflict => "conflict",
        }
    }
}

/// A failed command: what happened, and what to do next.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) kind: Kind,
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
}

impl CliError {
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> Self {
        CliError {
            kind,
            message: message.into(),
            hint: None,
        }
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub(crate) fn not_migrated(what: &str) -> Self {
        CliError::new(Kind::NotMigrated, what.to_string())
            .hint("run `gen_durable migrate-schema` against this database first")
    }

    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.kind.exit_code())
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "kind": self.kind.name(),
                "exit_code": self.kind.exit_code(),
                "message": self.message,
                "hint": self.hint,
            }
        })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.message)?;
        if let Some(h) = &self.hint {
            write!(f, "\nhint: {h}")?;
        }
        Ok(())
    }
}

/// Postgres' SQLSTATE for undefined_table: a statement ran on a database without the
/// schema (or dropped under us).
const UNDEFINED_TABLE: &str = "42P01";

impl From<Error> for CliError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::NotFound { .. } => CliError::new(Kind::NotFound, message).hint(
                "check the id: it may never have existed, or `gc` (or the retention) deleted it",
            ),
            Error::KeyNotFound { .. } => CliError::new(Kind::NotFound, message).hint(
                "no live instance holds it: check the key, or `inspect --key` for the newest \
                 instance that had it",
            ),
            Error::Finished {
                id,
                status: gen_durable::Status::Failed,
            } => CliError::new(Kind::Conflict, message)
                .hint(format!("`gen_durable retry {id}` makes it runnable again")),
            Error::Finished { id, .. } => CliError::new(Kind::Conflict, message)
                .hint(format!("`gen_durable inspect {id}` shows its result")),
            Error::WrongStatus { id, .. } => CliError::new(Kind::Conflict, message)
                .hint(format!("`gen_durable inspect {id}` shows where it is")),
            Error::Duplicate { .. } => CliError::new(Kind::Conflict, message).hint(
                "another live instance holds its unique key; cancel or finish that one first",
            ),
            Error::InvalidSignalName { .. }
            | Error::PayloadTooLarge { .. }
            | Error::InvalidInput { .. }
            | Error::UnknownStep { .. } => CliError::new(Kind::Usage, message),
            Error::UnknownEntry { id, .. } => CliError::new(Kind::NotFound, message)
                .hint(format!("`gen_durable history {id}` lists its entries")),
            Error::EntryWithoutState { .. } | Error::InvalidState(_) => {
                CliError::new(Kind::Usage, message)
            }
            Error::UnknownSteps { .. } => CliError::new(Kind::Usage, message).hint(
                "a node announces the steps of the FSM versions it runs: start one that runs \
                 this version, or run `restart` from your own binary (whose `main` calls \
                 `gen_durable_ops::main()`) that registers it",
            ),
            Error::ParentMovedOn { .. } | Error::VersionChanged { .. } => {
                CliError::new(Kind::Conflict, message)
            }
            Error::Database(sqlx::Error::Database(ref db))
                if db.code().as_deref() == Some(UNDEFINED_TABLE) =>
            {
                CliError::not_migrated(&format!("the gen_durable schema is missing: {db}"))
            }
            Error::Database(
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed,
            ) => CliError::new(Kind::Connect, message)
                .hint("check that the server is up and reachable from here"),
            _ => CliError::new(Kind::Failed, message),
        }
    }
}

impl From<sqlx::Error> for CliError {
    fn from(e: sqlx::Error) -> Self {
        Error::from(e).into()
    }
}
