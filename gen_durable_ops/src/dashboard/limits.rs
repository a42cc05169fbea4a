//! `/limits` ("Flow control"): every declared concurrency gate with its keys in use —
//! rows running (holding slots) and waiting, a key at K shown full — and every declared
//! rate limit with its buckets and their tokens now, a bucket below zero shown as tokens
//! reserved by waiting rows. What `Client::gates` and `Client::rate_limits` return, read
//! at a bounded cost: `Client::gates` counts the waiting rows of every key, which reads
//! every runnable gated row (no index has the gate of a runnable row), so this page
//! counts them among the first [`RUNNABLE_READ`] runnable rows in pick order, reads at
//! most [`RUNNING_READ`] executing gated rows through the gate index and
//! [`BUCKETS_READ`] buckets; a figure past a cap is marked "N+", and the rows say where
//! keys or buckets may be missing (`store::pg::gate::USAGE_CAPPED`,
//! `store::pg::rate_limit::BUCKETS_CAPPED`). Read-only: no action.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Extension;
use maud::{html, Markup};

use super::auth::{self, Csrf};
use super::error::DashboardError;
use super::layout::{self, Page};
use super::live::Live;
use super::AppState;
use crate::cli::table::{number, rate};
use crate::store::limits::CappedBucketRow;
use crate::store::limits::CappedUsageRow;
use crate::store::{admin, limits};
use gen_durable::backend::counts::Figure;

/// The most executing gated rows the page reads (the gate index, in (gate, key) order):
/// the overview's cap of executing rows.
pub(crate) const RUNNING_READ: i64 = 1_000;
/// The most runnable rows the page reads to count the waiting ones (the pick index, in
/// pick order): the overview's cap.
pub(crate) const RUNNABLE_READ: i64 = 1_000;
/// The most buckets the page reads (the primary key, in (limit, key) order).
pub(crate) const BUCKETS_READ: i64 = 1_000;

/// A gate and its keys in use.
#[derive(Debug)]
struct GateLines<'a> {
    name: &'a str,
    size: i32,
    keys: Vec<&'a CappedUsageRow>,
    /// Some of its executing rows may not have been read.
    keys_cut: bool,
}

/// A rate limit and the buckets shown.
#[derive(Debug)]
struct LimitLines<'a> {
    name: &'a str,
    per_second: f64,
    burst: f64,
    buckets: Vec<&'a CappedBucketRow>,
    /// Some of its buckets may not have been read.
    cut: bool,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    live: Live,
) -> Result<Page, DashboardError> {
    let pool = &state.pool;
    // One clock for the page: the database's (the tokens are refilled to it).
    let now = admin::db_now(pool, None).await?;
    let (usage, buckets) = tokio::try_join!(
        limits::usage_capped(pool, RUNNING_READ, RUNNABLE_READ),
        limits::buckets_capped(pool, Some(now), BUCKETS_READ),
    )?;
    let gates = group_gates(&usage);
    let limits = group_limits(&buckets);
    let waiting_capped = usage.iter().any(|u| u.waiting_capped);
    let running_capped = usage.iter().any(|u| u.running_capped);
    let operator = auth::is_operator(&state, &headers);
    let body = html! {
        h1 { "Flow control" }
        p.note { "as of " (layout::time(&now)) ". Read-only: K and the rates are declared by the engines (or `Client::set_gate`, `Client::set_rate_limit`)." }
        h2 { "Concurrency gates" }
        @if gates.is_empty() {
            p id="gates" { "No gate declared." }
        } @else {
            table id="gates" {
                tr { th { "gate" } th { "K" } th { "key" } th { "running" } th { "waiting" } th { "" } }
                @for g in &gates {
                    @if g.keys.is_empty() {
                        tr data-gate=(g.name) {
                            td { (g.name) }
                            td.n data-field="limit" { (g.size) }
                            td.note colspan="4" {
                                @if g.keys_cut { "keys not read (past the first " (Figure::Exact(RUNNING_READ)) " executing gated rows)" }
                                @else { "no key in use" }
                            }
                        }
                    }
                    @for k in &g.keys {
                        @let key = k.key.as_deref().unwrap_or_default();
                        @let full = k.running >= i64::from(g.size);
                        @let running = figure(k.running, k.running_capped);
                        @let waiting = figure(k.waiting, k.waiting_capped);
                        tr data-gate=(g.name) data-key=(key) data-full=(full) {
                            td { (g.name) }
                            td.n data-field="limit" { (g.size) }
                            td { (key_cell(key)) }
                            td.n data-field="running" data-figure=(figure_kind(running)) { (running) }
                            td.n data-field="waiting" data-figure=(figure_kind(waiting)) { (waiting) }
                            td {
                                @if full {
                                    span.error.full { "full" } " (" (k.running) "/" (g.size) " running: no row of the key is admitted until one finishes)"
                                } @else if k.running_capped {
                                    span.note { "at least " (k.running) " running" }
                                } @else {
                                    span.note { (i64::from(g.size) - k.running) " free slot(s)" }
                                }
                            }
                        }
                    }
                    @if g.keys_cut && !g.keys.is_empty() {
                        tr data-gate=(g.name) data-more="true" {
                            td { (g.name) }
                            td.note colspan="5" { "more keys may be running: the first " (Figure::Exact(RUNNING_READ)) " executing gated rows were read" }
                        }
                    }
                }
            }
            p.note id="gates-how-counted" { (gates_how_counted(running_capped, waiting_capped)) }
        }
        h2 { "Rate limits" }
        @if limits.is_empty() {
            p id="rate-limits" { "No rate limit declared." }
        } @else {
            table id="rate-limits" {
                tr { th { "limit" } th { "rate" } th { "burst" } th { "key" } th { "tokens now" } th { "" } }
                @for l in &limits {
                    @if l.buckets.is_empty() {
                        tr data-limit=(l.name) {
                            td { (l.name) }
                            td.n { (rate(l.per_second)) }
                            td.n data-field="burst" { (number(l.burst)) }
                            td.note colspan="3" {
                                @if l.cut { "buckets not read (past the first " (Figure::Exact(BUCKETS_READ)) " buckets)" }
                                @else { "no bucket: every key has its full burst" }
                            }
                        }
                    }
                    @for b in &l.buckets {
                        @let key = b.key.as_deref().unwrap_or_default();
                        @let tokens = b.tokens.unwrap_or(l.burst);
                        tr data-limit=(l.name) data-key=(key) data-reserved=(tokens < 0.0) {
                            td { (l.name) }
                            td.n { (rate(l.per_second)) }
                            td.n data-field="burst" { (number(l.burst)) }
                            td { (key_cell(key)) }
                            td.n data-field="tokens" { (number(tokens)) }
                            td { (bucket_words(tokens, l.per_second, l.burst)) }
                        }
                    }
                    @if l.cut && !l.buckets.is_empty() {
                        tr data-limit=(l.name) data-more="true" {
                            td { (l.name) }
                            td.note colspan="5" { "more buckets may follow: the first " (Figure::Exact(BUCKETS_READ)) " buckets were read" }
                        }
                    }
                }
            }
            p.note id="buckets-how-counted" {
                "Tokens are refilled to now as an admission would see them: min(burst, tokens + elapsed × rate). "
                "A key without a bucket has its full burst (the collector deletes buckets that are full again). "
                "Below zero, rows waiting for the key reserved the tokens: each is runnable at the instant its tokens are due. "
                "At most " (Figure::Exact(BUCKETS_READ)) " buckets are read, in (limit, key) order (the primary key)."
            }
        }
    };
    Ok(Page::new("Flow control", body)
        .live(live)
        .viewer(operator.then_some(csrf.0.as_str()), state.token.is_some()))
}

/// The statement's rows (in gate order, busiest keys first) by gate.
fn group_gates(rows: &[CappedUsageRow]) -> Vec<GateLines<'_>> {
    let mut out: Vec<GateLines<'_>> = Vec::new();
    for r in rows {
        if out.last().is_none_or(|g| g.name != r.name) {
            out.push(GateLines {
                name: &r.name,
                size: r.size,
                keys: Vec::new(),
                keys_cut: r.keys_cut,
            });
        }
        if r.key.is_some() {
            out.last_mut().expect("pushed").keys.push(r);
        }
    }
    out
}

/// The statement's rows (in limit then key order) by limit.
fn group_limits(rows: &[CappedBucketRow]) -> Vec<LimitLines<'_>> {
    let mut out: Vec<LimitLines<'_>> = Vec::new();
    for r in rows {
        if out.last().is_none_or(|l| l.name != r.name) {
            out.push(LimitLines {
                name: &r.name,
                per_second: r.per_second,
                burst: r.burst,
                buckets: Vec::new(),
                cut: r.cut,
            });
        }
        if r.key.is_some() {
            out.last_mut().expect("pushed").buckets.push(r);
        }
    }
    out
}

/// A count, exact or a lower bound.
fn figure(n: i64, capped: bool) -> Figure {
    if capped {
        Figure::AtLeast(n)
    } else {
        Figure::Exact(n)
    }
}

/// How a figure was obtained, for the cell's `data-figure` (as on the overview).
fn figure_kind(f: Figure) -> &'static str {
    match f {
        Figure::Exact(_) => "exact",
        Figure::AtLeast(_) => "at-least",
        Figure::About(_) => "estimate",
    }
}

/// A key; the empty key is the limit's one global key.
fn key_cell(key: &str) -> Markup {
    html! {
        @if key.is_empty() { span.note { "(global)" } } @else { (key) }
    }
}

/// What a bucket's tokens mean, in words.
fn bucket_words(tokens: f64, per_second: f64, burst: f64) -> Markup {
    html! {
        @if tokens < 0.0 {
            span.error.reserved {
                (number(-tokens)) " token(s) reserved by waiting rows"
            }
            " (none free; back to 0 in " (layout::span(-tokens / per_second)) ")"
        } @else if tokens >= burst {
            span.note { "full" }
        } @else {
            span.note { (number(tokens)) " of " (number(burst)) " free" }
        }
    }
}

/// The note under the gate table: how each column was counted, and where it stops.
fn gates_how_counted(running_capped: bool, waiting_capped: bool) -> String {
    let running = format!(
        "running: executing rows (claimed, buffered or running: they hold the slots), \
         counted through the gate index up to {} in all",
        Figure::Exact(RUNNING_READ)
    );
    let waiting = format!(
        "waiting: runnable rows of the key (due or not), counted among the first {} runnable \
         rows in pick order (queue, priority, due time), since no index has the gate of a \
         runnable row",
        Figure::Exact(RUNNABLE_READ)
    );
    let mut s = format!("{running}; {waiting}.");
    if running_capped {
        s.push_str(
            " More gated rows are executing than were read: the last key read and the keys \
             after it show \"N+\", and keys past them are not listed.",
        );
    }
    if waiting_capped {
        s.push_str(
            " More rows are runnable than were read: waiting figures are lower bounds (\"N+\"), \
             and a key whose waiting rows all lie past the first ones is not listed.",
        );
    }
    if running_capped || waiting_capped {
        s.push_str(" `gen_durable status` counts every key exactly (a full scan).");
    } else {
        s.push_str(" Every figure is an exact count.");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_below_zero_is_tokens_reserved() {
        let s = bucket_words(-3.0, 2.0, 10.0).into_string();
        assert!(s.contains("3 token(s) reserved by waiting rows"), "{s}");
        assert!(bucket_words(10.0, 2.0, 10.0).into_string().contains("full"));
        assert!(bucket_words(4.0, 2.0, 10.0)
            .into_string()
            .contains("4 of 10 free"));
    }
}
