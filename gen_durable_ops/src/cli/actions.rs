//! The commands that change something: `migrate-schema`, `signal`, `cancel`, `retry`, `gc`.

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::PgPool;

use super::args::format_age;
use super::error::Kind;
use super::{CliError, Output};
use crate::store::admin;
use gen_durable::backend::millis;
use gen_durable::{Client, Target};

pub(crate) async fn migrate_schema(pool: &PgPool) -> Result<Output, CliError> {
    let before = applied(pool).await?;
    gen_durable::migrate_schema(pool).await?;
    let after = applied(pool).await?;
    let new: Vec<&(i64, String)> = after.iter().filter(|m| !before.contains(m)).collect();
    let text = if new.is_empty() {
        format!("already up to date ({} migrations applied)\n", after.len())
    } else {
        let names: Vec<String> = new.iter().map(|(v, d)| format!("{v:04} {d}")).collect();
        format!("migrated: applied {}\n", names.join(", "))
    };
    let list = |ms: &[&(i64, String)]| {
        ms.iter()
            .map(|(v, d)| json!({ "version": v, "description": d }))
            .collect::<Vec<_>>()
    };
    let json = json!({
        "applied": list(&new),
        "schema_version": after.last().map(|(v, _)| *v),
    });
    Ok(Output { json, text })
}

async fn applied(pool: &PgPool) -> Result<Vec<(i64, String)>, CliError> {
    if admin::has_migrations_table(pool).await? {
        Ok(admin::applied_migrations(pool).await?)
    } else {
        Ok(Vec::new())
    }
}

/// Reads `signal`'s positionals: `ID NAME JSON`, or `NAME JSON` with `--key`.
pub(crate) fn signal_args(
    args: &[String],
    key: Option<&str>,
) -> Result<(Target, String, String), CliError> {
    let usage = |what: &str| {
        CliError::new(Kind::Usage, what.to_string())
            .hint("write `signal ID NAME JSON`, or `signal --key KEY NAME JSON`")
    };
    match (args, key) {
        ([id, name, payload], None) => {
            let id = id
                .parse()
                .map_err(|_| usage(&format!("{id:?} is not an instance id")))?;
            Ok((Target::Id(id), name.clone(), payload.clone()))
        }
        ([_, _, _], Some(_)) => Err(usage("with --key, pass only NAME and JSON")),
        ([name, payload], Some(key)) => {
            Ok((Target::Key(key.into()), name.clone(), payload.clone()))
        }
        (_, Some(_)) => Err(usage("pass NAME and JSON after --key KEY")),
        (_, None) => Err(usage("pass ID NAME JSON, or --key KEY NAME JSON")),
    }
}

pub(crate) async fn signal(
    pool: &PgPool,
    target: Target,
    name: &str,
    payload: &str,
    dedup_key: Option<&str>,
) -> Result<Output, CliError> {
    let payload: Value = serde_json::from_str(payload).map_err(|e| {
        CliError::new(Kind::Usage, format!("the payload is not JSON: {e}")).hint(
            "pass one JSON value, quoted for your shell: '{\"amount\": 100}', '\"text\"', 42 or null",
        )
    })?;
    let gd = Client::new(pool.clone());
    let mut send = gd.signal(target.clone(), name, payload);
    if let Some(k) = dedup_key {
        send = send.dedup_key(k);
    }
    let d = send.await?;
    let id = d.id;
    let text = match (d.signal_id, d.woke) {
        (Some(sid), true) => {
            format!("stored signal {sid} for instance {id}; it was awaiting {name:?} and is runnable now\n")
        }
        (Some(sid), false) => format!(
            "stored signal {sid} for instance {id}; it is not awaiting {name:?}, so the signal waits in its inbox\n"
        ),
        (None, _) => format!(
            "nothing stored: instance {id} already has a signal with dedup key {:?}\n",
            dedup_key.unwrap_or_default()
        ),
    };
    let json = json!({
        "id": id,
        "signal_id": d.signal_id,
        "woke": d.woke,
        "deduplicated": d.signal_id.is_none(),
    });
    Ok(Output { json, text })
}

pub(crate) async fn cancel(pool: &PgPool, id: i64) -> Result<Output, CliError> {
    let c = super::connect::operator(pool).cancel(id).await?;
    let mut text = format!("cancelled instance {id}: ");
    text.push_str(&match (c.failed, c.after_current_step) {
        (f, 0) => format!("{f} instance(s) failed with \"cancelled\" (it and its live descendants)\n"),
        (0, r) => format!(
            "{r} running instance(s) will fail with \"cancelled\" after their current step\n"
        ),
        (f, r) => format!(
            "{f} instance(s) failed with \"cancelled\" now, {r} running one(s) will after their current step\n"
        ),
    });
    let json = json!({
        "id": id,
        "failed": c.failed,
        "after_current_step": c.after_current_step,
    });
    Ok(Output { json, text })
}

pub(crate) async fn retry(pool: &PgPool, id: i64) -> Result<Output, CliError> {
    super::connect::operator(pool).retry(id).await?;
    Ok(Output {
        json: json!({ "id": id, "retried": true }),
        text: format!("instance {id} is runnable again at the step it failed in, its attempts counted afresh\n"),
    })
}

pub(crate) async fn gc(pool: &PgPool, older_than: Duration) -> Result<Output, CliError> {
    let age = millis(older_than);
    let (mut deleted, mut batches) = (0u64, 0u64);
    loop {
        let n = admin::gc_batch(pool, age, admin::GC_BATCH, None).await?;
        deleted += n;
        batches += 1;
        // A short batch means nothing older is left but rows that someone holds right
        // now (skipped, not waited on); the next gc takes them.
        if n < admin::GC_BATCH as u64 {
            break;
        }
    }
    let text = format!(
        "deleted {deleted} done/failed instance(s) last updated more than {} ago ({batches} batch{})\n",
        format_age(older_than),
        if batches == 1 { "" } else { "es" }
    );
    let json = json!({
        "deleted": deleted,
        "older_than_seconds": older_than.as_secs(),
        "batches": batches,
    });
    Ok(Output { json, text })
}
