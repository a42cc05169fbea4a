//! Rows per queue and status at a bounded cost: what the dashboard's overview shows and
//! what `metrics::observe_queues` exports. Each figure says how it was obtained, so that
//! a reader never takes an estimate for a count.
//!
//! - **runnable**, **ready** (due now) and the **lag** of the oldest due row: counted
//!   through the pick index, exactly up to a cap (then at least the cap, or the sample's
//!   estimate if it is higher);
//! - **executing**: counted through the lease index, exactly up to a cap in all queues;
//! - **awaiting_signal**, **awaiting_children**, **done**, **failed**: no index gives
//!   them by queue, so they come from a sample of about `SAMPLE_PAGES` pages of the table
//!   — exact while the table is that small (the sample is the whole table), an estimate
//!   past it.
//!
//! The statements are `store::pg::counts`; none reads more than the caps and the sample,
//! however large the table.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::model::error::Result;
use crate::store::pg::counts;
use crate::Status;

/// How one number was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// Counted, every row.
    Exact(i64),
    /// Counting stopped at the cap: at least this many.
    AtLeast(i64),
    /// Scaled from a sample of the table.
    About(i64),
}

impl Figure {
    /// The number to export or compare: the count, the lower bound or the estimate.
    pub fn value(self) -> i64 {
        match self {
            Figure::Exact(n) | Figure::AtLeast(n) | Figure::About(n) => n,
        }
    }
}

impl fmt::Display for Figure {
    /// `1,234`, `1,000+` or `≈1,200` (an estimate keeps two significant digits: the
    /// sample cannot tell more).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Figure::Exact(n) => f.write_str(&grouped(n)),
            Figure::AtLeast(n) => write!(f, "{}+", grouped(n)),
            Figure::About(n) => write!(f, "≈{}", grouped(two_digits(n))),
        }
    }
}

/// `n` rounded to two significant digits.
fn two_digits(n: i64) -> i64 {
    let mut scale = 1;
    while n / scale >= 100 {
        scale *= 10;
    }
    (n + scale / 2) / scale * scale
}

/// `1234567` as `1,234,567`.
fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One queue's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueCounts {
    /// The queue.
    pub queue: String,
    /// Every status of [`Status::ALL`].
    pub by_status: BTreeMap<Status, Figure>,
    /// Runnable rows due now.
    pub ready: Figure,
    /// The oldest due runnable row's `eligible_at` (exact: the first entry of the index).
    pub oldest_ready: Option<DateTime<Utc>>,
    /// The oldest `updated_at` of each status's rows in the sample (for a parked row,
    /// when it parked): exact when [`Counts::sample_percent`] is 100, else the oldest
    /// of the rows sampled.
    pub oldest: BTreeMap<Status, DateTime<Utc>>,
    /// The priorities of its lanes that hold runnable rows, ascending ([`waiting`] reads
    /// them lane by lane).
    pub priorities: Vec<i16>,
}

/// Every queue's figures, and how the sampled ones were obtained.
#[derive(Debug, Clone, PartialEq)]
pub struct Counts {
    /// By queue name.
    pub queues: Vec<QueueCounts>,
    /// The share of the table's pages the sample read, in percent (100: every row, the
    /// sampled figures are exact).
    pub sample_percent: f64,
    /// The table's size in pages.
    pub pages: i64,
    /// Where exact counting stops.
    pub cap: i64,
    /// The clock the figures are relative to (due rows, lag): the database's unless given.
    pub now: DateTime<Utc>,
}

/// Reads the figures of every queue that has rows in the pick index, the lease index or
/// the sample, and of each queue of `also` (nodes' queues, paused ones), as of `now` (the
/// database's clock when `None`). `cap` bounds each exact count: the statements read at
/// most `cap` index entries per lane, `cap` executing rows and the sample.
pub async fn queue_counts(
    pool: &PgPool,
    now: Option<DateTime<Utc>>,
    cap: i64,
    also: &[&str],
) -> Result<Counts> {
    // One clock for every figure: due rows and the lag are relative to it.
    let now = match now {
        Some(t) => t,
        None => crate::store::pg::admin::db_now(pool, None).await?,
    };
    // Three independent reads, each on its own connection: the page waits for the
    // slowest, not for their sum.
    let sampled = async {
        let pages = counts::table_pages(pool).await?;
        let percent = counts::sample_percent(pages);
        let rows = counts::sample_by_queue(pool, percent, Some(now)).await?;
        Ok::<_, crate::Error>((pages, percent, rows))
    };
    let (lanes, executing, (pages, percent, sample)) = tokio::try_join!(
        counts::lanes(pool, cap, Some(now)),
        counts::executing(pool, cap),
        sampled,
    )?;
    Ok(combine(
        &lanes, &executing, &sample, also, percent, pages, cap, now,
    ))
}

/// What one queue's statements found, before the figures are chosen.
#[derive(Debug, Default)]
struct Found {
    runnable: i64,
    runnable_capped: bool,
    ready: i64,
    ready_capped: bool,
    oldest_ready: Option<DateTime<Utc>>,
    executing: i64,
    /// Sampled rows by status, their oldest `updated_at`, and sampled due runnable rows.
    sampled: BTreeMap<Status, i64>,
    sampled_oldest: BTreeMap<Status, DateTime<Utc>>,
    sampled_ready: i64,
    priorities: Vec<i16>,
}

#[allow(clippy::too_many_arguments)]
fn combine(
    lanes: &[counts::LaneRow],
    executing: &[counts::ExecutingRow],
    sample: &[counts::SampleRow],
    also: &[&str],
    percent: f64,
    pages: i64,
    cap: i64,
    now: DateTime<Utc>,
) -> Counts {
    let mut found: BTreeMap<String, Found> = also
        .iter()
        .map(|q| (q.to_string(), Found::default()))
        .collect();
    for l in lanes {
        let f = found.entry(l.queue.clone()).or_default();
        f.priorities.push(l.priority);
        f.runnable += l.runnable;
        f.runnable_capped |= l.runnable >= cap;
        f.ready += l.ready;
        f.ready_capped |= l.ready >= cap;
        if let Some(t) = l.oldest.filter(|t| *t <= now) {
            f.oldest_ready = Some(f.oldest_ready.map_or(t, |o| o.min(t)));
        }
    }
    let executing_capped = executing.iter().map(|e| e.executing).sum::<i64>() >= cap;
    for e in executing {
        found.entry(e.queue.clone()).or_default().executing = e.executing;
    }
    for s in sample {
        let f = found.entry(s.queue.clone()).or_default();
        f.sampled.insert(s.status, s.rows);
        if let Some(t) = s.oldest {
            f.sampled_oldest.insert(s.status, t);
        }
        f.sampled_ready += s.ready;
    }
    let exact_sample = percent >= 100.0;
    let scale = |n: i64| (n as f64 * 100.0 / percent).round() as i64;
    // A count the index stopped at the cap: the sample's estimate if it is higher, else
    // the lower bound.
    let bounded = |counted: i64, capped: bool, sampled: i64| {
        if !capped {
            Figure::Exact(counted)
        } else if exact_sample {
            Figure::Exact(sampled)
        } else if scale(sampled) > counted {
            Figure::About(scale(sampled))
        } else {
            Figure::AtLeast(counted)
        }
    };
    let queues = found
        .into_iter()
        .map(|(queue, f)| {
            let sampled = |s: Status| f.sampled.get(&s).copied().unwrap_or(0);
            let by_status = Status::ALL
                .into_iter()
                .map(|s| {
                    let figure = match s {
                        Status::Runnable => {
                            bounded(f.runnable, f.runnable_capped, sampled(Status::Runnable))
                        }
                        Status::Executing => {
                            bounded(f.executing, executing_capped, sampled(Status::Executing))
                        }
                        _ if exact_sample => Figure::Exact(sampled(s)),
                        _ => Figure::About(scale(sampled(s))),
                    };
                    (s, figure)
                })
                .collect();
            QueueCounts {
                ready: bounded(f.ready, f.ready_capped, f.sampled_ready),
                oldest_ready: f.oldest_ready,
                oldest: f.sampled_oldest,
                priorities: f.priorities,
                by_status,
                queue,
            }
        })
        .collect();
    Counts {
        queues,
        sample_percent: percent,
        pages,
        cap,
        now,
    }
}

/// Why runnable rows wait when a worker is not what they wait for: the names and the
/// order of `explain`'s reasons ([`crate::Reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum WaitReason {
    /// Waiting for the rate-limit tokens they reserved ([`crate::Reason::RateLimited`]).
    RateLimited,
    /// Inserted, or moved on, to run later ([`crate::Reason::Scheduled`]).
    Scheduled,
    /// Waiting out the delay of a retry ([`crate::Reason::Backoff`]).
    Backoff,
    /// Due, while another instance of their partition key executes
    /// ([`crate::Reason::PartitionBlocked`]).
    PartitionBlocked,
    /// Due, while their gate key runs as many steps as the gate allows
    /// ([`crate::Reason::GateFull`]).
    GateFull,
    /// Due, while the live nodes that pick their queue run none of their FSM's version
    /// ([`crate::Reason::NoNodeForVersion`]).
    NoNodeForVersion,
}

impl WaitReason {
    /// `explain`'s name for it (its JSON `kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::RateLimited => "rate_limited",
            WaitReason::Scheduled => "scheduled",
            WaitReason::Backoff => "backoff",
            WaitReason::PartitionBlocked => "partition_blocked",
            WaitReason::GateFull => "gate_full",
            WaitReason::NoNodeForVersion => "no_node_for_version",
        }
    }

    /// Whether its rows are due (held back by their key) rather than not due yet.
    pub fn is_due(self) -> bool {
        matches!(
            self,
            WaitReason::PartitionBlocked | WaitReason::GateFull | WaitReason::NoNodeForVersion
        )
    }

    /// Every reason, in `explain`'s order.
    pub const ALL: [WaitReason; 6] = [
        WaitReason::RateLimited,
        WaitReason::Scheduled,
        WaitReason::Backoff,
        WaitReason::PartitionBlocked,
        WaitReason::GateFull,
        WaitReason::NoNodeForVersion,
    ];

    fn parse(s: &str) -> Option<Self> {
        WaitReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// Rows of one queue waiting for one [`WaitReason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The queue.
    pub queue: String,
    /// Why they wait.
    pub reason: WaitReason,
    /// How many: exact, or at least this many when a lane's reading stopped at the cap.
    pub rows: Figure,
    /// The first `eligible_at` among them: when the first is due (not due yet), or since
    /// when the longest held back has waited (due).
    pub first: Option<DateTime<Utc>>,
}

/// The runnable rows of `counts`' queues that wait for something other than a worker, by
/// reason, as of `counts.now`, reading at most `cap` index entries per lane and kind
/// (`WAITING`). A figure is a lower bound ([`Figure::AtLeast`]) when a part it was read
/// from stopped at the cap.
pub async fn waiting(pool: &PgPool, counts: &Counts, cap: i64) -> Result<Vec<Waiting>> {
    let lanes: Vec<(String, i16)> = counts
        .queues
        .iter()
        .flat_map(|q| q.priorities.iter().map(|p| (q.queue.clone(), *p)))
        .collect();
    let queues: Vec<String> = counts.queues.iter().map(|q| q.queue.clone()).collect();
    let rows = counts::waiting(pool, cap, counts.now, &lanes, &queues).await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let reason = WaitReason::parse(&r.reason)?;
            let rows = if r.capped {
                Figure::AtLeast(r.rows)
            } else {
                Figure::Exact(r.rows)
            };
            Some(Waiting {
                queue: r.queue,
                reason,
                rows,
                first: r.first,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pg::counts::{ExecutingRow, LaneRow, SampleRow};

    #[test]
    fn figures_print_how_they_were_obtained() {
        assert_eq!(Figure::Exact(1_234_567).to_string(), "1,234,567");
        assert_eq!(Figure::Exact(12).to_string(), "12");
        assert_eq!(Figure::AtLeast(1000).to_string(), "1,000+");
        assert_eq!(Figure::About(204_861).to_string(), "≈200,000");
        assert_eq!(Figure::About(2_561).to_string(), "≈2,600");
        assert_eq!(Figure::About(87).to_string(), "≈87");
    }

    fn lane(queue: &str, priority: i16, runnable: i64, ready: i64) -> LaneRow {
        LaneRow {
            queue: queue.into(),
            priority,
            runnable,
            ready,
            oldest: Some(Utc::now() - chrono::Duration::seconds(5)),
        }
    }

    fn sampled(queue: &str, status: Status, rows: i64) -> SampleRow {
        let ready = if status == Status::Runnable { rows } else { 0 };
        SampleRow {
            queue: queue.into(),
            status,
            rows,
            ready,
            oldest: None,
        }
    }

    #[test]
    fn capped_counts_become_bounds_or_estimates_and_a_whole_table_sample_is_exact() {
        let now = Utc::now();
        let lanes = [
            lane("a", 0, 10, 10),
            lane("b", 0, 100, 100),
            lane("b", 1, 3, 0),
        ];
        let executing = [ExecutingRow {
            queue: "a".into(),
            executing: 2,
        }];
        let sample = [
            sampled("a", Status::Done, 5),
            sampled("b", Status::Runnable, 3),
            sampled("c", Status::Failed, 1),
        ];
        // A 1% sample and a cap of 100: b's runnable count stopped at the cap.
        let c = combine(&lanes, &executing, &sample, &[], 1.0, 10_000, 100, now);
        let q: BTreeMap<&str, &QueueCounts> =
            c.queues.iter().map(|q| (q.queue.as_str(), q)).collect();
        assert_eq!(q["a"].by_status[&Status::Runnable], Figure::Exact(10));
        assert_eq!(q["a"].by_status[&Status::Executing], Figure::Exact(2));
        assert_eq!(q["a"].by_status[&Status::Done], Figure::About(500));
        assert_eq!(q["b"].by_status[&Status::Runnable], Figure::About(300));
        assert_eq!(q["b"].ready, Figure::About(300));
        assert_eq!(q["c"].by_status[&Status::Failed], Figure::About(100));
        assert_eq!(q["c"].by_status[&Status::Runnable], Figure::Exact(0));
        assert!(q["a"].oldest_ready.is_some() && q["c"].oldest_ready.is_none());

        // A sample too small to beat the bound: at least the cap.
        let low = [sampled("b", Status::Runnable, 0)];
        let c = combine(&lanes, &[], &low, &["d"], 1.0, 10_000, 100, now);
        assert_eq!(
            c.queues[1].by_status[&Status::Runnable],
            Figure::AtLeast(103)
        );
        // A queue known only from a node: nothing runnable (the index says so), the rest
        // estimated at zero.
        assert_eq!(c.queues[2].queue, "d");
        assert_eq!(c.queues[2].by_status[&Status::Runnable], Figure::Exact(0));
        assert_eq!(c.queues[2].by_status[&Status::Done], Figure::About(0));

        // A table read whole: every figure exact.
        let c = combine(&lanes, &executing, &sample, &[], 100.0, 10, 100, now);
        let q: BTreeMap<&str, &QueueCounts> =
            c.queues.iter().map(|q| (q.queue.as_str(), q)).collect();
        assert_eq!(q["a"].by_status[&Status::Done], Figure::Exact(5));
        assert_eq!(q["b"].by_status[&Status::Runnable], Figure::Exact(3));
    }
}
