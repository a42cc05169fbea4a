//! `gen_durable inspect ID` (or `--key K`): one instance's row, inbox and children.

use std::fmt::Write as _;

use serde_json::{json, Value};
use sqlx::PgPool;

use super::table::{self, Table};
use super::{CliError, Output};
use crate::store::admin;
use gen_durable::{Error, Target};

/// The row's columns in the order an operator reads them; any column not listed (a
/// newer migration's) is printed after these, so nothing stored is hidden.
const FIELDS: &[&str] = &[
    "id",
    "fsm",
    "fsm_version",
    "step",
    "status",
    "queue",
    "priority",
    "partition_key",
    "eligible_at",
    "attempt",
    "reaps",
    "max_reaps",
    "last_error",
    "awaits",
    "await_deadline",
    "locked_by",
    "lease_epoch",
    "lease_expires_at",
    "parent_id",
    "children_pending",
    "unique_key",
    "unique_scope",
    "inserted_at",
    "updated_at",
    "state",
    "result",
];

const TIME_FIELDS: &[&str] = &[
    "eligible_at",
    "await_deadline",
    "lease_expires_at",
    "inserted_at",
    "updated_at",
];

pub(crate) async fn run(pool: &PgPool, target: Target) -> Result<Output, CliError> {
    let id = match target {
        Target::Id(id) => id,
        Target::Key(key) => gen_durable::backend::wait::id_by_key(pool, &key)
            .await?
            .ok_or(Error::KeyNotFound { key })?,
    };
    let limit = admin::INSPECT_LIST_LIMIT;
    let found = admin::inspect(pool, id, limit)
        .await?
        .ok_or(Error::NotFound { id })?;
    let json = json!({
        "instance": found.row,
        "inbox_total": found.inbox_total,
        "inbox": found.inbox,
        "children_by_status": found.children_by_status,
        "children": found.children,
    });

    let mut text = String::new();
    let row = found.row.as_object().cloned().unwrap_or_default();
    let width = FIELDS.iter().map(|f| f.len()).max().unwrap_or(0);
    let extra = row.keys().filter(|k| !FIELDS.contains(&k.as_str()));
    for key in FIELDS.iter().copied().chain(extra.map(String::as_str)) {
        let Some(v) = row.get(key) else { continue };
        let shown = if TIME_FIELDS.contains(&key) && !v.is_null() {
            table::json_time(v).unwrap_or_default()
        } else if key == "attempt" {
            table::attempt(v)
        } else {
            table::cell(v)
        };
        let _ = writeln!(text, "{key:<width$}  {shown}");
    }

    let inbox = found.inbox.as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        text,
        "\ninbox: {}{}",
        plural(found.inbox_total, "signal"),
        shown_of(inbox.len(), found.inbox_total)
    );
    if !inbox.is_empty() {
        let mut t = Table::new(["id", "name", "dedup_key", "inserted_at", "payload"]);
        for s in &inbox {
            t.row(vec![
                table::cell(&s["id"]),
                table::cell(&s["name"]),
                table::cell(&s["dedup_key"]),
                table::json_time(&s["inserted_at"]).unwrap_or_default(),
                table::cell(&s["payload"]),
            ]);
        }
        text.push_str(&t.render());
    }

    let children = found.children.as_array().cloned().unwrap_or_default();
    let by_status = found
        .children_by_status
        .as_object()
        .cloned()
        .unwrap_or_default();
    let total: i64 = by_status.values().filter_map(Value::as_i64).sum();
    let breakdown = by_status
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        text,
        "\nchildren: {}{}{}",
        total,
        if breakdown.is_empty() {
            String::new()
        } else {
            format!(" ({breakdown})")
        },
        shown_of(children.len(), total)
    );
    if !children.is_empty() {
        let mut t = Table::new(["id", "fsm", "step", "status", "result / error"]);
        for c in &children {
            let outcome = if c["last_error"].is_null() {
                &c["result"]
            } else {
                &c["last_error"]
            };
            t.row(vec![
                table::cell(&c["id"]),
                format!(
                    "{} v{}",
                    table::cell(&c["fsm"]),
                    table::cell(&c["fsm_version"])
                ),
                table::cell(&c["step"]),
                table::cell(&c["status"]),
                table::cell(outcome),
            ]);
        }
        text.push_str(&t.render());
    }
    Ok(Output { json, text })
}

fn plural(n: i64, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn shown_of(shown: usize, total: i64) -> String {
    if (shown as i64) < total {
        format!(", the first {shown} shown")
    } else {
        String::new()
    }
}
