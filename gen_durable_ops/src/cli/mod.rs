//! The operator CLI, `gen_durable`. The binary in `src/bin/gen_durable.rs`, like a user's
//! own binary, only calls [`crate::main`]; the commands live here, their statements in
//! `crate::store`.
//!
//! Every command prints a human-readable report on stdout, or one JSON document with
//! `--json`. Errors go to stderr with a hint on what to do, and exit with a code per
//! kind of failure (`EXIT_CODES`, also printed by `--help`).

mod actions;
mod args;
mod connect;
mod dashboard;
mod error;
mod explain;
mod history;
mod inspect;
mod migrate_instances;
mod operator;
mod status;
pub(crate) mod table;

use std::process::ExitCode;

use clap::Parser;
use serde_json::Value;

use args::{Cli, Command};
use error::CliError;

/// The exit codes, as `--help` prints them.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the database failed or refused the operation
  2  bad arguments (also a payload that is not JSON, a bad signal name or age)
  3  no database URL, a malformed one, or the server cannot be reached or logged into
  4  the database is not migrated: run `gen_durable migrate-schema`
  5  no instance with this id
  6  the instance's status does not allow it (finished, not failed, executing, unique key taken)";

/// What a command reports: the same facts for people and for scripts.
#[derive(Debug)]
pub(crate) struct Output {
    json: Value,
    text: String,
}

/// Runs the CLI on the process's arguments and environment, and returns its exit code.
pub(crate) fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version land here too, with exit code 0; usage errors with 2.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = cli.json;
    match runtime.block_on(run(cli)) {
        Ok(out) if json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&out.json).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Ok(out) => {
            print!("{}", out.text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            if json {
                eprintln!(
                    "{}",
                    serde_json::to_string_pretty(&e.to_json()).unwrap_or_default()
                );
            } else {
                eprintln!("{e}");
            }
            e.exit_code()
        }
    }
}

/// The instance an `ID` or `--key K` argument names (clap requires one of them).
fn target(id: Option<i64>, key: Option<String>) -> gen_durable::Target {
    match (id, key) {
        (_, Some(key)) => gen_durable::Target::Key(key),
        (Some(id), None) => gen_durable::Target::Id(id),
        (None, None) => unreachable!("clap requires an id or --key"),
    }
}

async fn run(cli: Cli) -> Result<Output, CliError> {
    // Arguments clap cannot check alone are checked before connecting, as clap's are.
    let signal = match &cli.command {
        Command::Signal { args, key, .. } => Some(actions::signal_args(args, key.as_deref())?),
        _ => None,
    };
    let dashboard_config = match &cli.command {
        Command::Dashboard {
            auth_token_env,
            secure_cookies,
            ..
        } => Some(dashboard::config(
            auth_token_env.as_deref(),
            *secure_cookies,
        )?),
        _ => None,
    };
    let url = connect::database_url(cli.database_url.clone(), cli.json);
    let pool = match &cli.command {
        Command::Dashboard { .. } => {
            connect::connect_with(url.as_deref(), dashboard::POOL_SIZE).await?
        }
        _ => connect::connect(url.as_deref()).await?,
    };
    if !matches!(cli.command, Command::MigrateSchema) {
        connect::require_schema(&pool).await?;
    }
    let out = match cli.command {
        Command::MigrateSchema => actions::migrate_schema(&pool).await,
        Command::Status => status::run(&pool).await,
        Command::Inspect { id, key } => inspect::run(&pool, target(id, key)).await,
        Command::Explain { id, key } => explain::run(&pool, target(id, key)).await,
        Command::History { id } => history::run(&pool, id).await,
        Command::Signal { dedup_key, .. } => {
            let (target, name, payload) = signal.expect("checked above");
            actions::signal(&pool, target, &name, &payload, dedup_key.as_deref()).await
        }
        Command::Cancel { id: Some(id), .. } => actions::cancel(&pool, id).await,
        Command::Cancel { id: None, filter } => {
            operator::cancel_where(&pool, &filter.filter(), filter.dry_run).await
        }
        Command::Retry { id: Some(id), .. } => actions::retry(&pool, id).await,
        Command::Retry { id: None, filter } => {
            operator::retry_where(&pool, &filter.filter(), filter.dry_run).await
        }
        Command::Restart { id, step, entry } => {
            operator::restart(&pool, id, step.as_deref(), entry).await
        }
        Command::Fork { id, entry } => operator::fork(&pool, id, entry).await,
        Command::Pause { queue, reason } => operator::pause(&pool, &queue, reason.as_deref()).await,
        Command::Resume { queue } => operator::resume(&pool, &queue).await,
        Command::Dashboard { listen, .. } => {
            let config = dashboard_config.expect("read above");
            dashboard::run(&pool, listen, config).await
        }
        Command::Gc { older_than } => actions::gc(&pool, older_than).await,
        Command::MigrateInstances {
            fsm,
            to,
            dry_run,
            batch,
        } => migrate_instances::run(&pool, &fsm, to, dry_run, batch).await,
    };
    pool.close().await;
    out
}
