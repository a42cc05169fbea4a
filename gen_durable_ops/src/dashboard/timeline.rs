//! The instance page's timeline: its history (`Client::history`) as bars on one time
//! axis — each step from its start to its commit, the waits of a parked step after it,
//! lost leases and operators' actions as marks — each entry expandable to its fields and
//! the state its step began with; for a signed-in operator, with the forms that start
//! again from it (fork, restart from the entry). Inline CSS only: no script runs.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::layout;
use crate::cli::table;
use gen_durable::{HistoryEntry, HistoryKind};

/// The entries shown: the first page of the history (`gen_durable history ID` has all).
pub(crate) const SHOWN: usize = gen_durable::HISTORY_PAGE_MAX;

/// The bar's class: green for a step that went on, red for one that failed or was lost,
/// violet for an await, blue for children, grey for what an operator did.
fn class(kind: HistoryKind) -> &'static str {
    use HistoryKind::*;
    match kind {
        Next | Done => "k-ok",
        Retry | Failed | Cancelled | LeaseLost => "k-bad",
        Await => "k-await",
        Children => "k-kids",
        _ => "k-op",
    }
}

/// Where `t` falls between `from` and `to`, in percent.
fn at(t: DateTime<Utc>, from: DateTime<Utc>, span_us: f64) -> f64 {
    ((t - from).num_microseconds().unwrap_or(0) as f64 / span_us * 100.0).clamp(0.0, 100.0)
}

/// The timeline of `entries` (oldest first), as of `now`; `more` when the history goes
/// on past them. With `operator`, each entry that holds a state has its actions.
pub(crate) fn timeline(
    id: i64,
    entries: &[HistoryEntry],
    more: bool,
    now: DateTime<Utc>,
    operator: bool,
) -> Markup {
    let Some(first) = entries.first() else {
        return html! { p id="timeline" { "No history: its FSM keeps none (history = \"off\"), it was collected, or nothing has happened yet." } };
    };
    let from = first.started_at.unwrap_or(first.at);
    let last = entries.last().map_or(from, |e| e.at);
    // A parked instance's last wait runs until now.
    let parked = matches!(entries.last().map(|e| e.kind), Some(HistoryKind::Await));
    let to = if parked { now.max(last) } else { last };
    let span_us = ((to - from).num_microseconds().unwrap_or(0) as f64).max(1.0);
    html! {
        div id="timeline" {
            p.note {
                (table::time(&from)) " → " (table::time(&to)) " · "
                (table::span(span_us / 1e6)) " · " (entries.len()) " entries"
                @if more { " (the first " (SHOWN) "; `gen_durable history " (id) " --json` has all)" }
            }
            @for (i, e) in entries.iter().enumerate() {
                @let start = e.started_at.unwrap_or(e.at);
                @let left = at(start, from, span_us);
                @let width = (at(e.at, from, span_us) - left).max(0.4);
                @let wait_until = match (e.kind, entries.get(i + 1)) {
                    (HistoryKind::Await, Some(n)) => Some(n.started_at.unwrap_or(n.at)),
                    (HistoryKind::Await, None) => Some(to),
                    _ => None,
                };
                div.tl data-entry=(e.entry) data-kind=(e.kind.as_str()) {
                    div.tl-label {
                        span.tl-step { (e.step) } " #" (e.attempt) " "
                        span class=(format!("tl-kind {}", class(e.kind))) { (e.kind.as_str()) }
                        @if !e.signals.is_empty() { " ✉" (e.signals.len()) }
                        @if let Some(err) = &e.error { " " span.error { (layout::clip(err, 60)) } }
                    }
                    div.tl-track {
                        @if let Some(until) = wait_until {
                            @let wl = at(e.at, from, span_us);
                            span.tl-wait style=(format!("left:{wl:.2}%;width:{:.2}%", (at(until, from, span_us) - wl).max(0.0))) {}
                        }
                        span class=(format!("tl-bar {}", class(e.kind)))
                            style=(format!("left:{left:.2}%;width:{width:.2}%"))
                            title=(format!("{} {} #{}", e.kind, e.step, e.attempt)) {}
                    }
                    details.tl-more {
                        summary { "entry " (e.entry) }
                        (fields(e))
                        @if let Some(state) = &e.state {
                            pre.tl-state { (layout::clip(&serde_json::to_string_pretty(state).unwrap_or_default(), layout::MAX_JSON_SHOWN)) }
                            @if operator {
                                div.actions {
                                    form method="get" action=(format!("/instances/{id}/confirm")) {
                                        input type="hidden" name="action" value="fork";
                                        input type="hidden" name="entry" value=(e.entry);
                                        button type="submit" class="fork" { "Fork from here" }
                                    }
                                    form method="get" action=(format!("/instances/{id}/confirm")) {
                                        input type="hidden" name="action" value="restart";
                                        input type="hidden" name="entry" value=(e.entry);
                                        button type="submit" class="restart-entry" { "Restart from here" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// An entry's fields, as a definition list.
fn fields(e: &HistoryEntry) -> Markup {
    html! {
        dl {
            dt { "at" } dd { (table::time(&e.at)) }
            @if let Some(s) = e.started_at {
                dt { "took" } dd { (table::span((e.at - s).num_microseconds().unwrap_or(0) as f64 / 1e6)) }
            }
            @if let Some(n) = &e.next_step { dt { "next step" } dd { (n) } }
            @if let Some(n) = &e.node { dt { "node" } dd { (n) } }
            @if let Some(a) = &e.actor { dt { "by" } dd { (a) } }
            @if let Some(err) = &e.error { dt { "error" } dd.error { (err) } }
            @if !e.signals.is_empty() { dt { "signals" } dd { (format!("{:?}", e.signals)) } }
            @if let Some(c) = e.children { dt { "children" } dd { (c) } }
            @if let Some(d) = &e.detail { dt { "detail" } dd { (d) } }
        }
    }
}
