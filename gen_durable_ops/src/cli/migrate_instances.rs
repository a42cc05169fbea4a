//! `gen_durable migrate-instances --fsm F --to N [--dry-run]`: bulk instance migration
//! with the migrations linked into this binary. The stock `gen_durable` binary links none
//! (they are the user's Rust code): run the command from a binary of your own whose
//! `main` calls `gen_durable_ops::main()`.

use serde_json::json;
use sqlx::PgPool;

use super::error::Kind;
use super::{CliError, Output};
use gen_durable::{Error, MigrateOptions};

pub(crate) async fn run(
    pool: &PgPool,
    fsm: &str,
    to: i32,
    dry_run: bool,
    batch: usize,
) -> Result<Output, CliError> {
    let opts = MigrateOptions {
        dry_run,
        ..MigrateOptions::default()
    }
    .with_batch(batch);
    let report = super::connect::operator(pool)
        .migrate_instances(fsm, to, opts)
        .await
        .map_err(|e| match e {
            Error::NoMigration { .. } => CliError::new(Kind::Usage, e.to_string()).hint(
                "instance migrations are Rust code: run migrate-instances from a binary of \
                 your own that links them (its main calls gen_durable_ops::main())",
            ),
            e => e.into(),
        })?;
    let verb = if dry_run { "would migrate" } else { "migrated" };
    let mut text = format!(
        "{fsm}: {verb} {} instance(s) to v{to}",
        report.migrated_total()
    );
    for (from, n) in &report.migrated {
        text.push_str(&format!(" ({n} from v{from})"));
    }
    text.push('\n');
    let fail = if dry_run {
        "would fail"
    } else {
        "failed, left on their version with last_error"
    };
    text.push_str(&format!("  {} {fail}\n", report.failed));
    for (id, error) in &report.failures {
        text.push_str(&format!("    {id}: {error}\n"));
    }
    text.push_str(&format!(
        "  {} executing (migrated by their node on the next claim, or by a rerun)\n  {} skipped (locked or inserted meanwhile; rerun to take them)\n",
        report.executing, report.skipped
    ));
    let json = json!(report);
    Ok(Output { json, text })
}
