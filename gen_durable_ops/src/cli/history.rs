//! `gen_durable history ID`: an instance's history, oldest first — each step's outcome,
//! attempt, node, duration and error, the lost leases and releases between them, and the
//! operators' actions with who did them.

use sqlx::PgPool;

use super::table::{span, time, Table};
use super::{CliError, Output};
use gen_durable::{Client, HistoryEntry, HISTORY_PAGE_MAX};

/// Entries shown at most: the newest are the ones an operator looks for, so a longer
/// history shows its last `SHOWN` (`--json` gives them all the same way).
const SHOWN: usize = 10 * HISTORY_PAGE_MAX;

pub(crate) async fn run(pool: &PgPool, id: i64) -> Result<Output, CliError> {
    let gd = Client::new(pool.clone());
    let mut entries: Vec<HistoryEntry> = Vec::new();
    let mut after = None;
    loop {
        let page = gd.history(id, after, HISTORY_PAGE_MAX).await?;
        entries.extend(page.entries);
        if entries.len() > SHOWN {
            entries.drain(..entries.len() - SHOWN);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut table = Table::new([
        "entry", "at", "step", "attempt", "outcome", "took", "by", "detail",
    ]);
    for e in &entries {
        let took = e
            .started_at
            .map(|s| span((e.at - s).num_microseconds().unwrap_or(0) as f64 / 1e6))
            .unwrap_or_default();
        table.row(vec![
            e.entry.to_string(),
            time(&e.at),
            e.step.clone(),
            e.attempt.to_string(),
            e.kind.to_string(),
            took,
            e.actor
                .clone()
                .or_else(|| e.node.clone())
                .unwrap_or_default(),
            detail(e),
        ]);
    }
    let text = if entries.is_empty() {
        format!("instance {id} has no history (its FSM keeps none, or it was collected)\n")
    } else {
        table.render()
    };
    let json = serde_json::to_value(&entries).map_err(gen_durable::Error::from)?;
    Ok(Output { json, text })
}

/// What an entry adds: where it leads, its children, signals, error and what an action did.
fn detail(e: &HistoryEntry) -> String {
    let mut parts = Vec::new();
    if let Some(next) = &e.next_step {
        parts.push(format!("-> {next}"));
    }
    if let Some(d) = &e.detail {
        parts.push(d.clone());
    }
    if let Some(n) = e.children {
        parts.push(format!("{n} children"));
    }
    if !e.signals.is_empty() {
        parts.push(format!("signals {:?}", e.signals));
    }
    if let Some(error) = &e.error {
        parts.push(error.clone());
    }
    parts.join("; ")
}
