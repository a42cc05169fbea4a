//! `gen_durable status`: what every queue holds, how late it runs, and what nobody runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};
use sqlx::PgPool;

use super::table::{self, Table};
use super::{CliError, Output};
use crate::store::admin;
use gen_durable::backend::{gate, pause, rate_limit};
use gen_durable::Status;

#[derive(Debug, Default)]
struct QueueLine {
    counts: BTreeMap<Status, i64>,
    ready: i64,
    lag_secs: Option<f64>,
    keyed: i64,
}

pub(crate) async fn run(pool: &PgPool) -> Result<Output, CliError> {
    // Read everything in one REPEATABLE READ transaction, so the tables agree with each
    // other (a row cannot be counted executing and listed as unrunnable at once).
    let mut tx = pool.begin().await?;
    sqlx::query("/* gd:admin */ SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let now = admin::db_now(&mut *tx, None).await?;
    let cells = admin::queue_status(&mut *tx, Some(now)).await?;
    let unrunnable = admin::unrunnable(&mut *tx, Some(now)).await?;
    let expired = admin::expired_leases(&mut *tx, Some(now)).await?;
    let nodes = admin::nodes(&mut *tx, Some(now)).await?;
    let schedules = admin::schedules(&mut *tx).await?;
    let paused = pause::paused(&mut *tx).await?;
    let gates = gate::usage(&mut *tx).await?;
    let buckets = rate_limit::buckets(&mut *tx, Some(now)).await?;
    tx.commit().await?;

    let mut queues: BTreeMap<String, QueueLine> = BTreeMap::new();
    for c in cells {
        let q = queues.entry(c.queue).or_default();
        q.counts.insert(c.status, c.count);
        q.ready += c.ready;
        q.keyed += c.keyed;
        if let Some(t) = c.oldest_ready {
            q.lag_secs = Some((now - t).num_milliseconds() as f64 / 1000.0);
        }
    }
    let live = nodes.iter().filter(|n| n.live).count();
    let window = admin::NODE_LIVE_WINDOW_MS / 1000;

    let json = json!({
        "now": now,
        "queues": queues.iter().map(|(name, q)| json!({
            "queue": name,
            "counts": Status::ALL.iter()
                .map(|s| (s.as_str().to_string(), json!(q.counts.get(s).copied().unwrap_or(0))))
                .collect::<serde_json::Map<String, Value>>(),
            "ready": q.ready,
            "lag_seconds": q.lag_secs,
            "keyed": q.keyed,
        })).collect::<Vec<_>>(),
        "unrunnable": unrunnable,
        "expired_leases": expired,
        "nodes": nodes,
        "live_window_seconds": window,
        "schedules": schedules,
        "paused_queues": paused,
        "gates": gates.iter().map(|g| json!({
            "gate": g.name, "limit": g.size, "key": g.key,
            "running": g.running, "waiting": g.waiting,
        })).collect::<Vec<_>>(),
        "rate_limits": buckets,
    });

    let mut text = String::new();
    let _ = writeln!(text, "as of {}\n", table::time(&now));
    if queues.is_empty() {
        text.push_str("no instances\n");
    } else {
        let mut t = Table::new(
            ["queue"]
                .into_iter()
                .chain(Status::ALL.iter().map(|s| s.as_str()))
                .chain(["ready", "lag", "keyed"]),
        );
        for (name, q) in &queues {
            let mut row = vec![name.clone()];
            row.extend(
                Status::ALL
                    .iter()
                    .map(|s| q.counts.get(s).copied().unwrap_or(0).to_string()),
            );
            row.push(q.ready.to_string());
            row.push(q.lag_secs.map_or("-".into(), table::span));
            row.push(q.keyed.to_string());
            t.row(row);
        }
        text.push_str(&t.render());
        text.push_str(
            "(ready: runnable now; lag: how long the oldest ready row has waited; \
             keyed: rows holding their correlation key)\n",
        );
    }

    text.push_str("\npaused queues:\n");
    if paused.is_empty() {
        text.push_str("  none\n");
    } else {
        let mut t = Table::new(["queue", "paused at", "reason"]);
        for p in &paused {
            t.row(vec![
                p.queue.clone(),
                table::time(&p.paused_at),
                p.reason.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        text.push_str(&t.render());
        text.push_str("(no node claims their rows: `gen_durable resume QUEUE`)\n");
    }

    text.push_str("\ngates:\n");
    if gates.is_empty() {
        text.push_str("  none\n");
    } else {
        let mut t = Table::new(["gate", "limit", "key", "running", "waiting"]);
        for g in &gates {
            t.row(vec![
                g.name.clone(),
                g.size.to_string(),
                g.key.as_ref().map_or("-".into(), |k| format!("{k:?}")),
                g.running.to_string(),
                g.waiting.to_string(),
            ]);
        }
        text.push_str(&t.render());
        text.push_str("(running: slots held, at most the limit per key; waiting: runnable rows)\n");
    }

    text.push_str("\nrate limits:\n");
    if buckets.is_empty() {
        text.push_str("  none\n");
    } else {
        let mut t = Table::new(["limit", "rate", "burst", "key", "tokens"]);
        for b in &buckets {
            t.row(vec![
                b.name.clone(),
                table::rate(b.per_second),
                table::number(b.burst),
                b.key.as_ref().map_or("-".into(), |k| format!("{k:?}")),
                b.tokens.map_or("full".into(), table::number),
            ]);
        }
        text.push_str(&t.render());
        text.push_str("(tokens now; below zero: reserved by rows waiting for them)\n");
    }

    let _ = writeln!(
        text,
        "\nrows no live node runs ({live} live node{}; live = announced in the last {window} s):",
        if live == 1 { "" } else { "s" }
    );
    if unrunnable.is_empty() {
        text.push_str("  none\n");
    } else {
        let mut t = Table::new(["queue", "fsm", "version", "rows", "runnable"]);
        for u in &unrunnable {
            t.row(vec![
                u.queue.clone(),
                u.fsm.clone(),
                u.fsm_version.to_string(),
                u.rows.to_string(),
                u.runnable.to_string(),
            ]);
        }
        text.push_str(&t.render());
        text.push_str(if live == 0 {
            "(no node is live: none runs, or they run a release that does not announce itself)\n"
        } else {
            "(start a node that runs these queues with these FSM versions; nothing is lost meanwhile)\n"
        });
    }

    text.push_str("\nexecuting rows whose lease expired:\n");
    if expired.is_empty() {
        text.push_str("  none\n");
    } else {
        let mut t = Table::new(["queue", "locked_by", "rows", "oldest expiry", "ids"]);
        for e in &expired {
            t.row(vec![
                e.queue.clone(),
                e.locked_by.clone().unwrap_or_else(|| "-".into()),
                e.count.to_string(),
                e.oldest_expiry.as_ref().map_or("-".into(), table::time),
                ids(&e.ids, e.count),
            ]);
        }
        text.push_str(&t.render());
        text.push_str(
            "(a node's reaper returns these to runnable; if they stay, no node runs a reaper)\n",
        );
    }

    text.push_str("\nnodes:\n");
    if nodes.is_empty() {
        text.push_str("  none has announced itself\n");
    } else {
        let mut t = Table::new(["node", "live", "last seen", "queues", "fsms"]);
        for n in &nodes {
            t.row(vec![
                n.node_id.clone(),
                if n.live { "yes" } else { "no" }.into(),
                format!(
                    "{} ago",
                    table::span((now - n.last_seen_at).num_milliseconds() as f64 / 1000.0)
                ),
                n.queues.join(","),
                n.fsms.join(","),
            ]);
        }
        text.push_str(&t.render());
    }
    if !schedules.is_empty() {
        text.push_str("\nschedules:\n");
        let mut t = Table::new([
            "schedule",
            "pattern",
            "zone",
            "catch-up",
            "next fire",
            "last fire",
            "instance",
            "skipped",
        ]);
        for s in &schedules {
            t.row(vec![
                s.name.clone(),
                s.pattern.clone(),
                s.timezone.clone(),
                s.catch_up.clone(),
                s.next_fire.as_ref().map_or("never".into(), table::time),
                s.last_fire.as_ref().map_or("-".into(), table::time),
                s.last_id.map_or("-".into(), |id| id.to_string()),
                s.skipped.to_string(),
            ]);
        }
        text.push_str(&t.render());
        for s in schedules.iter().filter(|s| s.last_error.is_some()) {
            let _ = writeln!(
                text,
                "  {}: last skipped fire: {}",
                s.name,
                s.last_error.as_deref().unwrap_or_default()
            );
        }
    }
    Ok(Output { json, text })
}

fn ids(shown: &[i64], total: i64) -> String {
    let mut s = shown
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if total > shown.len() as i64 {
        let _ = write!(s, ",… ({} more)", total - shown.len() as i64);
    }
    s
}
