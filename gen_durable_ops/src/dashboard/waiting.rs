//! The overview's "What waits, and why": every queue's rows that are not running, by the
//! reason `explain` would give each of them and in its order — a paused queue first
//! (nothing of it runs), then rows not due yet (rate-limit tokens, scheduled, a retry's
//! backoff), due rows their key holds back (a running partition key, a full gate), due rows
//! no live node picks or that wait for a worker, and parked rows (signals, children) —
//! with how many and the first of each.
//!
//! The figures are the overview's counts (`gen_durable::backend::counts`) and
//! `counts::waiting` (the statement `WAITING`), each bounded per lane.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::layout;
use super::overview::urlencode;
use gen_durable::backend::counts::{Counts, Figure, QueueCounts, WaitReason, Waiting};
use gen_durable::Status;

/// When a line's time is: the first row due later, or the longest waiting since.
enum First {
    Due(DateTime<Utc>),
    Since(DateTime<Utc>),
    /// The oldest of a sample's rows: a sample of a large table may miss older ones.
    SampledSince(DateTime<Utc>),
    None,
}

/// One line of the table: a queue, a reason (`explain`'s name) and its rows.
struct Line {
    reason: &'static str,
    says: &'static str,
    rows: Figure,
    first: First,
    /// The status its rows have, for the link to them.
    status: Status,
}

/// The table, or a sentence when nothing waits.
pub(crate) fn table(
    now: DateTime<Utc>,
    counts: &Counts,
    waiting: &[Waiting],
    paused: &BTreeMap<&str, DateTime<Utc>>,
    picked: &BTreeSet<&str>,
) -> Markup {
    let exact_sample = counts.sample_percent >= 100.0;
    let lines: Vec<(&str, Line)> = counts
        .queues
        .iter()
        .flat_map(|q| {
            let mut of_queue: Vec<&Waiting> =
                waiting.iter().filter(|w| w.queue == q.queue).collect();
            // In `explain`'s order.
            of_queue.sort_by_key(|w| w.reason);
            let paused = paused.get(q.queue.as_str()).copied();
            let picked = picked.contains(q.queue.as_str());
            lines(q, &of_queue, paused, picked, exact_sample)
                .into_iter()
                .map(|l| (q.queue.as_str(), l))
        })
        .collect();
    html! {
        @if lines.is_empty() {
            p id="waiting" { "No row waits." }
        } @else {
            table id="waiting" {
                tr { th { "queue" } th { "why its rows wait" } th { "rows" } th { "first" } }
                @for (queue, l) in &lines {
                    tr data-queue=(queue) data-reason=(l.reason) {
                        td { (queue) }
                        td { (l.says) }
                        td.n data-figure=(super::overview::figure_kind(l.rows)) {
                            a href=(format!("/instances?queue={}&status={}", urlencode(queue), l.status.as_str())) { (l.rows) }
                        }
                        td {
                            @match l.first {
                                First::Due(t) => { "due " (layout::when(now, t)) }
                                First::Since(t) => { "waiting since " (layout::when(now, t)) }
                                First::SampledSince(t) => { "≈ waiting since " (layout::when(now, t)) " (oldest sampled)" }
                                First::None => "-",
                            }
                        }
                    }
                }
            }
            p.note {
                "The reasons are " code { "explain" } "'s, checked in its order: a paused queue \
                 holds every runnable row; then rows not due yet, due rows their key holds back, \
                 and the rest wait for a live node that picks the queue, or for a worker. Each \
                 kind is read up to " (Figure::Exact(counts.cap)) " rows per lane (past it: \"N+\"); parked \
                 rows are the counts above, their first from the same sample."
            }
        }
    }
}

/// One queue's lines, in `explain`'s order.
fn lines(
    q: &QueueCounts,
    waiting: &[&Waiting],
    paused: Option<DateTime<Utc>>,
    picked: bool,
    exact_sample: bool,
) -> Vec<Line> {
    let figure = |s: Status| q.by_status.get(&s).copied().unwrap_or(Figure::Exact(0));
    let runnable = figure(Status::Runnable);
    let mut out = Vec::new();
    if let Some(since) = paused.filter(|_| runnable.value() > 0) {
        out.push(Line {
            reason: "queue_paused",
            says: "its queue is paused",
            rows: runnable,
            first: First::Since(since),
            status: Status::Runnable,
        });
    } else {
        let mut held = 0;
        let mut held_exact = true;
        for w in waiting {
            if w.reason.is_due() {
                held += w.rows.value();
                held_exact &= matches!(w.rows, Figure::Exact(_));
            }
            out.push(Line {
                reason: w.reason.as_str(),
                says: says(w.reason),
                rows: w.rows,
                first: match w.first {
                    Some(t) if w.reason.is_due() => First::Since(t),
                    Some(t) => First::Due(t),
                    None => First::None,
                },
                status: Status::Runnable,
            });
        }
        // The due rows nothing holds back: exact only when both figures are; otherwise
        // neither a bound nor a count, so an estimate.
        let free = match q.ready {
            Figure::Exact(n) if held_exact => Figure::Exact((n - held).max(0)),
            f => Figure::About((f.value() - held).max(0)),
        };
        if free.value() > 0 {
            let (reason, says) = if picked {
                ("runnable", "ready: waiting for a worker")
            } else {
                (
                    "no_node_for_queue",
                    "due, but no live node picks this queue",
                )
            };
            out.push(Line {
                reason,
                says,
                rows: free,
                first: q.oldest_ready.map_or(First::None, First::Since),
                status: Status::Runnable,
            });
        }
    }
    for (status, reason, says) in [
        (
            Status::AwaitingSignal,
            "awaiting_signals",
            "parked: awaiting signals",
        ),
        (
            Status::AwaitingChildren,
            "awaiting_children",
            "parked: awaiting children",
        ),
    ] {
        let rows = figure(status);
        if rows.value() > 0 {
            let first = q.oldest.get(&status).copied();
            out.push(Line {
                reason,
                says,
                rows,
                // Parked since its row last changed: the sample's oldest, exact only when
                // the sample is the whole table.
                first: match first {
                    Some(t) if exact_sample => First::Since(t),
                    Some(t) => First::SampledSince(t),
                    None => First::None,
                },
                status,
            });
        }
    }
    out
}

/// What a reason's rows wait for, in words.
fn says(reason: WaitReason) -> &'static str {
    match reason {
        WaitReason::RateLimited => "not due: waiting for the rate-limit tokens they reserved",
        WaitReason::Scheduled => "not due: scheduled for later",
        WaitReason::Backoff => "not due: backing off before a retry",
        WaitReason::PartitionBlocked => "due: another instance of their partition key runs",
        WaitReason::GateFull => "due: their gate key runs as many steps as the gate allows",
        WaitReason::NoNodeForVersion => "due: no live node runs their FSM's version",
        _ => "not due",
    }
}
