//! `/`: every queue's counts by status and lag, what waits and why, the finished instances
//! and how long they took over a window (`chart`),
//! paused queues, expired leases, the periodic schedules and the nodes. The schedules,
//! the nodes and the expired leases are `status`'s own statements (`store::pg::admin`);
//! the chart and the pauses are the dashboard's. The counts are `gen_durable::backend::counts`': exact
//! where an index gives them cheaply (up to [`EXACT_CAP`]), estimated from a sample of
//! the table where none does, each figure marked as what it is — unlike `gen_durable
//! status`, which reads the whole table for exact counts, a page must stay fast at any
//! size.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Extension;
use maud::html;
use serde::Deserialize;

use super::auth::{self, Csrf};
use super::error::DashboardError;
use super::layout::{self, Page};
use super::live::Live;
use super::{chart, waiting, AppState};
use crate::store::{admin, dashboard};
use gen_durable::backend::counts::{self, Figure};
use gen_durable::Status;

/// Where the overview stops counting runnable, ready and executing rows exactly: past it a
/// figure shows the sample's estimate, or "1,000+".
const EXACT_CAP: i64 = 1_000;

/// `?did=paused&queue=Q` (or `resumed`): what the action that led here did;
/// `?window=6h`: the charts' window.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    did: Option<String>,
    queue: Option<String>,
    window: Option<String>,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    live: Live,
    Query(params): Query<Params>,
) -> Result<Page, DashboardError> {
    let pool = &state.pool;
    // One clock for every figure of the page: the database's.
    let now = admin::db_now(pool, None).await?;
    let window = chart::Window::parse(params.window.as_deref())?;
    let first = window.first(now);
    // Independent reads, each on its own connection: the page waits for the slowest.
    let (buckets, pauses, expired, nodes, schedules) = tokio::try_join!(
        finished(pool, window, first),
        dashboard::pauses(pool),
        admin::expired_leases(pool, Some(now)),
        admin::nodes(pool, Some(now)),
        admin::schedules(pool),
    )?;
    // Queues a node picks from or an operator paused are listed even with no row.
    let mut known: Vec<&str> = nodes
        .iter()
        .flat_map(|n| n.queues.iter())
        .map(String::as_str)
        .collect();
    known.extend(pauses.iter().map(|p| p.queue.as_str()));
    let counts = counts::queue_counts(pool, Some(now), EXACT_CAP, &known).await?;
    let waiting_rows = counts::waiting(pool, &counts, EXACT_CAP).await?;
    let queues = &counts.queues;
    let operator = auth::is_operator(&state, &headers);
    let paused: std::collections::BTreeMap<&str, chrono::DateTime<chrono::Utc>> = pauses
        .iter()
        .map(|p| (p.queue.as_str(), p.paused_at))
        .collect();
    // The queues some live node picks: a queue none picks waits for a node, however
    // ready its rows are.
    let picked: std::collections::BTreeSet<&str> = nodes
        .iter()
        .filter(|n| n.live)
        .flat_map(|n| n.queues.iter().map(String::as_str))
        .collect();
    let body = html! {
        h1 { "Overview" }
        @if let (Some(did), Some(queue)) = (&params.did, &params.queue) {
            p.notice id="notice" {
                @match did.as_str() {
                    "paused" => { "Paused queue " code { (queue) } ": no node claims its rows until it is resumed; rows already claimed finish their step." }
                    "resumed" => { "Resumed queue " code { (queue) } ": its nodes pick at once." }
                    _ => { "Done." }
                }
            }
        }
        p.note { "as of " (layout::time(&now)) }
        @if !pauses.is_empty() {
            h2 { "Paused queues" }
            table id="pauses" {
                tr { th { "queue" } th { "paused" } th { "reason" } @if operator { th {} } }
                @for p in &pauses {
                    tr {
                        td { (p.queue) }
                        td { (layout::time(&p.paused_at)) " (" (layout::ago(now, p.paused_at)) ")" }
                        td { (p.reason.as_deref().unwrap_or("-")) }
                        @if operator {
                            td {
                                form method="post" action=(format!("/queues/{}/resume", urlencode(&p.queue))) {
                                    input type="hidden" name="csrf" value=(csrf.0);
                                    button type="submit" class="resume" { "Resume" }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Queues" }
        @if queues.is_empty() {
            p id="queues" { "No instances yet." }
        } @else {
            table id="queues" {
                tr {
                    th { "queue" }
                    @for s in Status::ALL { th { (s.as_str()) } }
                    th { "ready now" } th { "lag of the oldest ready" }
                    @if operator { th {} }
                }
                @for q in queues {
                    @let name = &q.queue;
                    tr data-queue=(name) {
                        td { a href=(format!("/instances?queue={}", urlencode(name))) { (name) } }
                        @for s in Status::ALL {
                            @let f = q.by_status.get(&s).copied().unwrap_or(Figure::Exact(0));
                            td.n data-status=(s.as_str()) data-figure=(figure_kind(f)) {
                                @if f.value() > 0 {
                                    a href=(format!("/instances?queue={}&status={}", urlencode(name), s.as_str())) { (f) }
                                } @else { (f) }
                            }
                        }
                        td.n data-figure=(figure_kind(q.ready)) { (q.ready) }
                        td.n.lag {
                            @match q.oldest_ready {
                                Some(t) => (layout::span((now - t).num_milliseconds() as f64 / 1000.0)),
                                None => "-",
                            }
                        }
                        @if operator {
                            td {
                                @if paused.contains_key(name.as_str()) { "paused" } @else {
                                    form method="post" class="pause" action=(format!("/queues/{}/pause", urlencode(name))) {
                                        input type="hidden" name="csrf" value=(csrf.0);
                                        input name="reason" placeholder="reason (optional)";
                                        button type="submit" { "Pause" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            p.note { "ready now: runnable rows whose time has come; lag: how long the oldest of them has waited." }
            p.note id="how-counted" { (how_counted(&counts)) }
        }
        h2 { "What waits, and why" }
        (waiting::table(now, &counts, &waiting_rows, &paused, &picked))
        div id="charts" {
            h2 { "Finished instances, " (window.says()) }
            (chart::picker(window, live.every))
            (chart::throughput(window, first, &buckets))
            p.note { span style="color:#3c9d5d" { "■ done" } " " span style="color:#d0453a" { "■ failed" } }
            h2 { "How long they took, insert to finish" }
            (chart::latency(window, first, &buckets))
            p.note {
                span style="color:#7a9cc6" { "■ 95% within" } " ─ median. "
                @if window.rolled_up() {
                    "From the collector's per-minute rollup (gd_minutes): minutes are added once they have been over for a minute, by the engines' collectors; durations to the next power of two milliseconds."
                } @else {
                    "From the finished rows themselves, to the current minute."
                }
            }
        }
        @if !expired.is_empty() {
            h2 { "Executing rows whose lease expired" }
            table id="expired" {
                tr { th { "queue" } th { "node" } th { "rows" } th { "oldest expiry" } th { "ids" } }
                @for e in &expired {
                    tr {
                        td { (e.queue) }
                        td { (e.locked_by.as_deref().unwrap_or("-")) }
                        td.n { (e.count) }
                        td { (e.oldest_expiry.as_ref().map_or("-".into(), layout::time)) }
                        td { @for id in &e.ids { (layout::instance_link(*id)) " " } }
                    }
                }
            }
        }
        @if !schedules.is_empty() {
            h2 { "Schedules" }
            table id="schedules" {
                tr {
                    th { "schedule" } th { "pattern" } th { "zone" } th { "catch-up" }
                    th { "next fire" } th { "last fire" } th { "skipped" } th { "last error" }
                }
                @for s in &schedules {
                    tr data-schedule=(s.name) {
                        td { (s.name) }
                        td { code { (s.pattern) } }
                        td { (s.timezone) }
                        td { (s.catch_up) }
                        td { (s.next_fire.as_ref().map_or("never again".into(), layout::time)) }
                        td {
                            @match (s.last_fire, s.last_id) {
                                (Some(t), Some(id)) => { (layout::time(&t)) " → " (layout::instance_link(id)) }
                                (Some(t), None) => (layout::time(&t)),
                                _ => "-",
                            }
                        }
                        td.n { (s.skipped) }
                        td { (s.last_error.as_deref().unwrap_or("-")) }
                    }
                }
            }
        }
        h2 { "Nodes" }
        @if nodes.is_empty() {
            p id="nodes" { "No node has announced itself." }
        } @else {
            table id="nodes" {
                tr { th { "node" } th { "live" } th { "last heartbeat" } th { "started" } th { "queues" } th { "FSMs" } }
                @for n in &nodes {
                    tr {
                        td { (n.node_id) }
                        td { @if n.live { "yes" } @else { span.error { "no" } } }
                        td { (layout::ago(now, n.last_seen_at)) }
                        td { (layout::time(&n.started_at)) }
                        td { (n.queues.join(", ")) }
                        td { (n.fsms.join(", ")) }
                    }
                }
            }
            p.note { "live: announced in the last " (admin::NODE_LIVE_WINDOW_MS / 1000) " s." }
        }
    };
    Ok(Page::new("Overview", body)
        .live(live)
        .viewer(operator.then_some(csrf.0.as_str()), state.token.is_some()))
}

/// The chart's buckets: the last 30 minutes from the finished rows, longer windows from
/// the collector's rollup.
async fn finished(
    pool: &sqlx::PgPool,
    window: chart::Window,
    first: chrono::DateTime<chrono::Utc>,
) -> gen_durable::Result<Vec<chart::Bucket>> {
    if !window.rolled_up() {
        let rows = dashboard::throughput(pool, first).await?;
        return Ok(rows
            .into_iter()
            .map(|r| chart::Bucket {
                at: r.minute,
                done: r.done,
                failed: r.failed,
                took: r
                    .p50_ms
                    .zip(r.p95_ms)
                    .map(|(p50, p95)| chart::Took { p50, p95 }),
            })
            .collect());
    }
    let (_, len) = window.buckets();
    let rows = dashboard::rollup(pool, first, len.num_seconds()).await?;
    Ok(rows
        .into_iter()
        .map(|r| chart::Bucket {
            at: r.at,
            done: r.done,
            failed: r.failed,
            took: chart::quantile(&r.took_ms, 0.5)
                .zip(chart::quantile(&r.took_ms, 0.95))
                .map(|(p50, p95)| chart::Took { p50, p95 }),
        })
        .collect())
}

/// How a figure was obtained, for the cell's `data-figure` (tests and scripts read it).
pub(crate) fn figure_kind(f: Figure) -> &'static str {
    match f {
        Figure::Exact(_) => "exact",
        Figure::AtLeast(_) => "at-least",
        Figure::About(_) => "estimate",
    }
}

/// The note under the queue table: which figures are counted, bounded or estimated.
fn how_counted(c: &counts::Counts) -> String {
    let cap = Figure::Exact(c.cap);
    let counted = format!(
        "runnable, ready now and executing are counted through their indexes up to {cap} \
         (past it: \"{cap}+\", or the sample's estimate \"≈\" when it is higher)"
    );
    if c.sample_percent >= 100.0 {
        format!(
            "Every figure is an exact count: {counted}, the other statuses by reading the \
             whole table ({} pages).",
            Figure::Exact(c.pages)
        )
    } else {
        format!(
            "{counted}. awaiting_signal, awaiting_children, done and failed have no index by \
             queue: \"≈\" figures are estimated from a sample of {:.2}% of the table's {} \
             pages (TABLESAMPLE SYSTEM), so a queue with few such rows may show ≈0. \
             `gen_durable status` counts every row exactly (a full scan).",
            c.sample_percent,
            Figure::Exact(c.pages)
        )
    }
}

/// A query-string value, percent-encoded (queue names are free text).
pub(crate) fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
