//! The operator actions: `pause`, `resume`, `restart`, and `cancel` / `retry` by filter.

use serde_json::json;
use sqlx::PgPool;

use super::args::format_age;
use super::error::Kind;
use super::{CliError, Output};
use crate::store::admin;
use gen_durable::{BulkReport, Client, Error, Filter};

pub(crate) async fn pause(
    pool: &PgPool,
    queue: &str,
    reason: Option<&str>,
) -> Result<Output, CliError> {
    let gd = super::connect::operator(pool);
    let newly = gd.pause_queue(queue, reason).await?;
    let mut text = if newly {
        format!("paused queue {queue:?}: no node claims its rows until `gen_durable resume {queue}` (rows already claimed finish their step)\n")
    } else {
        format!("queue {queue:?} was already paused; it stays paused (its first reason is kept)\n")
    };
    // A queue no node has announced is most likely a misspelt name: the pause is kept
    // (a node may start on it later), and the queues nodes do pick are named.
    let known = admin::announced_queues(pool).await?;
    let warning = (!known.iter().any(|q| q == queue)).then(|| {
        let known = if known.is_empty() {
            "no node has announced any queue yet".to_string()
        } else {
            format!("the announced queues: {}", known.join(", "))
        };
        format!("no node has announced queue {queue:?}: check its name ({known}); it is paused all the same, for a node that starts on it")
    });
    if let Some(w) = &warning {
        text.push_str(&format!("warning: {w}\n"));
    }
    Ok(Output {
        json: json!({ "queue": queue, "paused": true, "newly_paused": newly, "warning": warning }),
        text,
    })
}

pub(crate) async fn resume(pool: &PgPool, queue: &str) -> Result<Output, CliError> {
    let resumed = Client::new(pool.clone()).resume_queue(queue).await?;
    let text = if resumed {
        format!("resumed queue {queue:?}: its nodes pick at once\n")
    } else {
        format!("queue {queue:?} was not paused; nothing changed\n")
    };
    Ok(Output {
        json: json!({ "queue": queue, "paused": false, "resumed": resumed }),
        text,
    })
}

pub(crate) async fn restart(
    pool: &PgPool,
    id: i64,
    step: Option<&str>,
    entry: Option<i64>,
) -> Result<Output, CliError> {
    let gd = super::connect::operator(pool);
    match (step, entry) {
        (_, Some(entry)) => {
            gd.restart_from(id, entry).await?;
            Ok(Output {
                json: json!({ "id": id, "restarted": true, "entry": entry }),
                text: format!(
                    "instance {id} is runnable now at the step of entry {entry}, in the state it began with, its attempts counted afresh\n"
                ),
            })
        }
        (step, None) => {
            let step = step.unwrap_or_default();
            gd.restart(id, step).await?;
            Ok(Output {
                json: json!({ "id": id, "restarted": true, "step": step }),
                text: format!(
                    "instance {id} is runnable now at step {step:?}, its attempts counted afresh\n"
                ),
            })
        }
    }
}

pub(crate) async fn fork(pool: &PgPool, id: i64, entry: i64) -> Result<Output, CliError> {
    let fork = super::connect::operator(pool)
        .fork(id, entry)
        .await
        .map_err(|e| match e {
            Error::UnknownFsm { .. } | Error::UnknownVersion { .. } => {
                CliError::new(Kind::Usage, e.to_string()).hint(
                    "a fork is checked against the FSM's code (its steps, state and rate \
                     limits): run fork from a binary of your own that links it (its main \
                     calls gen_durable_ops::main())",
                )
            }
            e => e.into(),
        })?;
    Ok(Output {
        json: json!({ "id": fork, "forked_from": id, "entry": entry }),
        text: format!(
            "started instance {fork} from entry {entry} of instance {id} (the original is not touched)\n"
        ),
    })
}

pub(crate) async fn cancel_where(
    pool: &PgPool,
    filter: &Filter,
    dry_run: bool,
) -> Result<Output, CliError> {
    let r = super::connect::operator(pool)
        .cancel_where(filter, dry_run)
        .await?;
    let text = if dry_run {
        format!(
            "dry run: {} live instance(s) match {}; nothing was changed\n",
            r.matched,
            describe(filter)
        )
    } else {
        format!(
            "cancelled {} matching instance(s) of {} in {} batch(es): {} failed with \"cancelled\" now (with their live descendants), {} running one(s) will after their current step, {} had finished meanwhile\n",
            r.matched - r.skipped,
            describe(filter),
            r.batches,
            r.changed,
            r.after_current_step,
            r.skipped
        )
    };
    Ok(Output {
        json: report_json(&r),
        text,
    })
}

pub(crate) async fn retry_where(
    pool: &PgPool,
    filter: &Filter,
    dry_run: bool,
) -> Result<Output, CliError> {
    let r = super::connect::operator(pool)
        .retry_where(filter, dry_run)
        .await?;
    let text = if dry_run {
        format!(
            "dry run: {} failed instance(s) match {}; nothing was changed\n",
            r.matched,
            describe(filter)
        )
    } else {
        format!(
            "retried {} of {} failed instance(s) matching {} in {} batch(es); {} skipped (no longer failed, a child whose parent went on, or a unique key taken)\n",
            r.changed,
            r.matched,
            describe(filter),
            r.batches,
            r.skipped
        )
    };
    Ok(Output {
        json: report_json(&r),
        text,
    })
}

fn report_json(r: &BulkReport) -> serde_json::Value {
    serde_json::to_value(r).unwrap_or_default()
}

/// The filter as the operator wrote it: `queue=q fsm=F older-than=1h`.
fn describe(f: &Filter) -> String {
    let mut parts = Vec::new();
    if let Some(q) = &f.queue {
        parts.push(format!("queue={q}"));
    }
    if let Some(x) = &f.fsm {
        parts.push(format!("fsm={x}"));
    }
    if let Some(v) = f.version {
        parts.push(format!("version={v}"));
    }
    if !f.statuses.is_empty() {
        let s: Vec<&str> = f.statuses.iter().map(|s| s.as_str()).collect();
        parts.push(format!("status={}", s.join(",")));
    }
    if let Some(a) = f.older_than {
        parts.push(format!("older-than={}", format_age(a)));
    }
    if let Some(k) = &f.key_prefix {
        parts.push(format!("key-prefix={k:?}"));
    }
    if let Some(k) = &f.key {
        parts.push(format!("key={k:?}"));
    }
    if let Some(p) = f.parent {
        parts.push(format!("parent={p}"));
    }
    if let Some(e) = &f.error_contains {
        parts.push(format!("error-contains={e:?}"));
    }
    parts.join(" ")
}
