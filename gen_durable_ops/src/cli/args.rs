//! The command line, as clap parses it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use gen_durable::Status;

/// Operate a gen_durable database: migrate it, see what its queues are doing, look
/// into one instance, and act on it.
#[derive(Debug, Parser)]
#[command(name = "gen_durable", version, about, long_about = None, after_help = super::EXIT_CODES)]
pub(crate) struct Cli {
    /// PostgreSQL URL, e.g. postgres://user:password@host:5432/dbname.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// Print JSON on stdout instead of tables (errors too, on stderr).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or update the schema. Idempotent; safe from several processes at once.
    MigrateSchema,
    /// Counts per queue and status, lag of the oldest runnable row, rows no live node
    /// runs, expired leases, and the nodes that announce themselves.
    Status,
    /// One instance: its row, its inbox and its children.
    Inspect {
        /// The instance id.
        #[arg(required_unless_present = "key", conflicts_with = "key")]
        id: Option<i64>,
        /// The instance holding this correlation key, or, once none does, the newest
        /// instance inserted with it.
        #[arg(long)]
        key: Option<String>,
    },
    /// Why an instance is not running, or what it is doing: one line naming the reason
    /// (finished, executing, parked, paused queue, scheduled or in backoff, partition
    /// held, no live node, or runnable with the rows ahead of it), then its evidence.
    Explain {
        /// The instance id.
        #[arg(required_unless_present = "key", conflicts_with = "key")]
        id: Option<i64>,
        /// The instance holding this correlation key, or, once none does, the newest
        /// instance inserted with it.
        #[arg(long)]
        key: Option<String>,
    },
    /// An instance's history, oldest first: each step's outcome, attempt, node, duration
    /// and error, and the leases its workers lost (`--json` for every field, the state a
    /// step began with included where its FSM keeps it).
    History {
        /// The instance id.
        id: i64,
    },
    /// Deliver a signal to an instance (it wakes if it awaits that name):
    /// `signal ID NAME JSON`, or `signal --key KEY NAME JSON` for the instance holding
    /// a correlation key.
    Signal {
        /// ID NAME JSON, or NAME JSON with --key. The name is 1 to 255 bytes; the
        /// payload a JSON value, quoted for your shell, e.g. '{"amount": 100}'.
        #[arg(num_args = 2..=3, required = true, value_names = ["ID", "NAME", "JSON"])]
        args: Vec<String>,
        /// Address the instance holding this correlation key instead of an id.
        #[arg(long)]
        key: Option<String>,
        /// A redelivery with the same key to the same instance stores nothing.
        #[arg(long)]
        dedup_key: Option<String>,
    },
    /// Fail a live instance with "cancelled", and its live children with it (a running
    /// instance fails after its current step): `cancel ID`, or every live instance a
    /// filter matches, `cancel --queue Q --fsm F [--older-than 1h] [--dry-run]`.
    Cancel {
        /// The instance id (or give a filter instead).
        #[arg(required_unless_present_any = ["queue", "fsm"], conflicts_with_all = ["queue", "fsm", "dry_run"])]
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Make a failed instance runnable again at the step it failed in, attempt 0:
    /// `retry ID`, or every failed instance a filter matches, `retry --fsm F [--dry-run]`.
    Retry {
        /// The instance id (or give a filter instead).
        #[arg(required_unless_present_any = ["queue", "fsm"], conflicts_with_all = ["queue", "fsm", "dry_run"])]
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Run an instance again from a named step (failed, done, or live but not executing):
    /// runnable now, attempt 0, nothing awaited. With `--entry`, from the step a history
    /// entry ran, in the state that step began with (`history = "full"`).
    Restart {
        /// The instance id.
        id: i64,
        /// The step to run it from (checked against the FSM version's steps, as live
        /// nodes announce them).
        #[arg(long, required_unless_present = "entry", conflicts_with = "entry")]
        step: Option<String>,
        /// The history entry to start again from (`gen_durable history ID`).
        #[arg(long)]
        entry: Option<i64>,
    },
    /// Start a new instance from a past step of another: at the step a history entry ran,
    /// in the state that step began with (`history = "full"`). The original is not
    /// touched. Needs the FSM's code: run it from a binary that links it.
    Fork {
        /// The instance id.
        id: i64,
        /// The history entry to start from (`gen_durable history ID`).
        #[arg(long)]
        entry: i64,
    },
    /// Pause a queue on every node: no node claims its rows until `resume` (rows
    /// already claimed finish their step).
    Pause {
        /// The queue.
        queue: String,
        /// Why, shown by `status`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused queue; its nodes pick at once.
    Resume {
        /// The queue.
        queue: String,
    },
    /// Move the live, not executing instances of an FSM to a later version with the
    /// instance migrations linked into this binary (run it from your own binary that calls
    /// `gen_durable_ops::main()`), in small batches that never block the engine.
    MigrateInstances {
        /// The FSM's stored name.
        #[arg(long)]
        fsm: String,
        /// The version to move them to.
        #[arg(long)]
        to: i32,
        /// Run the transforms and report what they would do, writing nothing.
        #[arg(long)]
        dry_run: bool,
        /// Rows per transaction.
        #[arg(long, default_value_t = 500)]
        batch: usize,
    },
    /// Serve the web dashboard: read-only, or able to cancel, retry and signal for an
    /// operator who signs in with the token read from the environment variable named by
    /// --auth-token-env.
    Dashboard {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:4000")]
        listen: std::net::SocketAddr,
        /// The environment variable holding the operator token (not the token itself,
        /// which would show in `ps`). Without it, the dashboard is read-only.
        /// The token must be at least 32 bytes (`openssl rand -hex 32`).
        #[arg(long, value_name = "VAR")]
        auth_token_env: Option<String>,
        /// Mark the sign-in and CSRF cookies `Secure` (sent over HTTPS only): use it when
        /// the dashboard is reached over TLS, e.g. behind a TLS-terminating proxy.
        #[arg(long)]
        secure_cookies: bool,
    },
    /// Delete done and failed instances last updated longer ago than --older-than, in
    /// small batches that never block the engine (children of a live parent are kept).
    Gc {
        /// An age such as 7d, 12h, 30m or 45s.
        #[arg(long, default_value = "7d", value_parser = parse_age)]
        older_than: Duration,
    },
}

/// A bulk action's filter: which instances `cancel` / `retry` take without an ID.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only instances of this queue.
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Only instances of this FSM (its stored name).
    #[arg(long)]
    pub(crate) fsm: Option<String>,
    /// Only this version of the FSM (with --fsm).
    #[arg(long, requires = "fsm")]
    pub(crate) version: Option<i32>,
    /// Only instances in this status (repeatable; default: every status the command
    /// takes: the live ones for cancel, failed for retry).
    #[arg(long = "status", value_name = "STATUS", value_parser = parse_status)]
    pub(crate) statuses: Vec<Status>,
    /// Only instances last updated longer ago than this age (7d, 12h, 30m, 45s).
    #[arg(long, value_parser = parse_age)]
    pub(crate) older_than: Option<Duration>,
    /// Only instances whose correlation key starts with this.
    #[arg(long)]
    pub(crate) key_prefix: Option<String>,
    /// Only instances with exactly this correlation key.
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// Only the children of this instance.
    #[arg(long)]
    pub(crate) parent: Option<i64>,
    /// Only instances whose last error contains this text, in any case.
    #[arg(long)]
    pub(crate) error_contains: Option<String>,
    /// Count the instances the filter matches; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

impl FilterArgs {
    /// The library's filter.
    pub(crate) fn filter(&self) -> gen_durable::Filter {
        gen_durable::Filter {
            queue: self.queue.clone(),
            fsm: self.fsm.clone(),
            version: self.version,
            statuses: self.statuses.clone(),
            older_than: self.older_than,
            key_prefix: self.key_prefix.clone(),
            key: self.key.clone(),
            parent: self.parent,
            error_contains: self.error_contains.clone(),
            ..gen_durable::Filter::default()
        }
    }
}

fn parse_status(s: &str) -> Result<Status, String> {
    s.parse().map_err(|_| {
        let all: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
        format!("{s:?} is not a status (one of: {})", all.join(", "))
    })
}

/// Parses `7d`, `12h`, `30m`, `45s`: a whole number and one unit.
pub(crate) fn parse_age(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!("{s:?} is not an age: write a whole number and a unit, e.g. 7d, 12h, 30m or 45s")
    };
    let s = s.trim();
    let unit_at = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(unit_at);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(bad)
}

/// Writes an age back the way `parse_age` reads it, in its largest whole unit.
pub(crate) fn format_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_age("30m"), Ok(Duration::from_secs(1_800)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        for bad in [
            "",
            "7",
            "d",
            "7w",
            "-1d",
            "1.5h",
            "7 d",
            "99999999999999999999d",
        ] {
            assert!(parse_age(bad).is_err(), "{bad:?} should not parse");
        }
        assert_eq!(format_age(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(format_age(Duration::from_secs(90)), "90s");
    }
}
