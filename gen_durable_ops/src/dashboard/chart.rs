//! The overview's charts over a window the viewer picks (`?window=30m | 6h | 24h | 7d`):
//! done and failed instances per bucket, and how long they took from insert to finish (the
//! median and the 95th percentile), as inline SVG.
//!
//! The last 30 minutes are read from the finished rows themselves (exact, live); longer
//! windows from the collector's per-minute rollup `gd_minutes` (up to the minute that
//! ended a minute ago, durations to a power of two), since a week's finished rows are far
//! too many to read for a page.

use chrono::{DateTime, Duration, Utc};
use maud::{html, Markup};

use super::error::DashboardError;
use super::layout;

/// The windows a chart shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Window {
    Minutes30,
    Hours6,
    Hours24,
    Days7,
}

impl Window {
    pub(crate) const ALL: [Window; 4] = [
        Window::Minutes30,
        Window::Hours6,
        Window::Hours24,
        Window::Days7,
    ];

    /// `?window=`: absent is the last 30 minutes.
    pub(crate) fn parse(given: Option<&str>) -> Result<Self, DashboardError> {
        match given.map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(Window::Minutes30),
            Some(s) => Window::ALL
                .into_iter()
                .find(|w| w.as_str() == s)
                .ok_or_else(|| {
                    DashboardError::BadRequest(format!(
                        "window {s:?}: the charts show 30m, 6h, 24h or 7d"
                    ))
                }),
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Window::Minutes30 => "30m",
            Window::Hours6 => "6h",
            Window::Hours24 => "24h",
            Window::Days7 => "7d",
        }
    }

    /// The window in words.
    pub(crate) fn says(self) -> &'static str {
        match self {
            Window::Minutes30 => "the last 30 minutes",
            Window::Hours6 => "the last 6 hours",
            Window::Hours24 => "the last 24 hours",
            Window::Days7 => "the last 7 days",
        }
    }

    /// How many buckets, and how long each is.
    pub(crate) fn buckets(self) -> (i64, Duration) {
        match self {
            Window::Minutes30 => (30, Duration::minutes(1)),
            Window::Hours6 => (36, Duration::minutes(10)),
            Window::Hours24 => (48, Duration::minutes(30)),
            Window::Days7 => (42, Duration::hours(4)),
        }
    }

    /// Whether it is read from the rollup rather than the finished rows.
    pub(crate) fn rolled_up(self) -> bool {
        self != Window::Minutes30
    }

    /// The start of the first bucket of the window that ends with the bucket holding
    /// `now` (buckets are aligned on the epoch, so they do not move between loads).
    pub(crate) fn first(self, now: DateTime<Utc>) -> DateTime<Utc> {
        let (n, len) = self.buckets();
        let secs = len.num_seconds();
        let start = now.timestamp().div_euclid(secs) * secs;
        DateTime::from_timestamp(start, 0).unwrap_or(now) - len * (n - 1) as i32
    }
}

/// How long the instances of a bucket took from insert to finish, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Took {
    pub(crate) p50: f64,
    pub(crate) p95: f64,
}

/// One bucket of a chart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bucket {
    pub(crate) at: DateTime<Utc>,
    pub(crate) done: i64,
    pub(crate) failed: i64,
    pub(crate) took: Option<Took>,
}

/// The `q` quantile of a rollup's histogram (`took_ms[i]`, 0-based here: `[0]` under 1 ms,
/// `[i]` from 2^(i-1) to 2^i ms), as the upper bound of the slot it falls in; `None` for
/// an empty one.
pub(crate) fn quantile(histogram: &[i64], q: f64) -> Option<f64> {
    let total: i64 = histogram.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as i64;
    let mut seen = 0;
    for (i, n) in histogram.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(2f64.powi(i as i32));
        }
    }
    Some(2f64.powi(histogram.len() as i32 - 1))
}

const WIDTH: i64 = 600;
const HEIGHT: i64 = 150;
/// Room on the left for the scale, below for the time labels.
const LEFT: i64 = 56;
const BOTTOM: i64 = 18;

/// Every bucket of the window from `first`, those without rows zero-high, so the time
/// axis is regular.
fn every_bucket(window: Window, first: DateTime<Utc>, rows: &[Bucket]) -> Vec<Bucket> {
    let (n, len) = window.buckets();
    (0..n)
        .map(|i| {
            let at = first + len * i as i32;
            rows.iter().find(|r| r.at == at).cloned().unwrap_or(Bucket {
                at,
                done: 0,
                failed: 0,
                took: None,
            })
        })
        .collect()
}

/// A bucket's time label: the hour and minute, with the day on a week's chart.
fn label(window: Window, at: DateTime<Utc>) -> String {
    match window {
        Window::Days7 => at.format("%d %H:%M").to_string(),
        _ => at.format("%H:%M").to_string(),
    }
}

/// Done and failed per bucket, stacked (failed on top of done).
pub(crate) fn throughput(window: Window, first: DateTime<Utc>, rows: &[Bucket]) -> Markup {
    let buckets = every_bucket(window, first, rows);
    let max = buckets
        .iter()
        .map(|b| b.done + b.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_h = HEIGHT - BOTTOM;
    let slot = (WIDTH - LEFT) / buckets.len() as i64;
    let y = |v: i64| plot_h - v * (plot_h - 4) / max;
    let total: i64 = buckets.iter().map(|b| b.done + b.failed).sum();
    html! {
        svg id="throughput" data-window=(window.as_str()) xmlns="http://www.w3.org/2000/svg"
            width=(WIDTH) height=(HEIGHT) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img"
            aria-label=(format!("{total} instances finished in {}", window.says())) {
            line x1=(LEFT) y1=(plot_h) x2=(WIDTH) y2=(plot_h) stroke="#9aa5b1" {}
            text x=(LEFT - 4) y="12" text-anchor="end" font-size="10" { (max) }
            text x=(LEFT - 4) y=(plot_h) text-anchor="end" font-size="10" { "0" }
            @for (i, b) in buckets.iter().enumerate() {
                @let x = LEFT + i as i64 * slot + 1;
                @let top_done = y(b.done);
                rect class="bar done" x=(x) y=(top_done) width=(slot - 2)
                    height=(plot_h - top_done) fill="#3c9d5d" {
                    title { (label(window, b.at)) ": " (b.done) " done, " (b.failed) " failed" }
                }
                @if b.failed > 0 {
                    @let top = y(b.done + b.failed);
                    rect class="bar failed" x=(x) y=(top) width=(slot - 2)
                        height=(top_done - top) fill="#d0453a" {}
                }
                @if i % 10 == 0 {
                    text x=(x) y=(HEIGHT - 4) font-size="10" { (label(window, b.at)) }
                } @else if i == buckets.len() - 1 {
                    text x=(WIDTH) y=(HEIGHT - 4) font-size="10" text-anchor="end" { (label(window, b.at)) }
                }
            }
        }
    }
}

/// How long the instances of each bucket took: the 95th percentile as a bar, the median
/// as a mark across it.
pub(crate) fn latency(window: Window, first: DateTime<Utc>, rows: &[Bucket]) -> Markup {
    let buckets = every_bucket(window, first, rows);
    let max = buckets
        .iter()
        .filter_map(|b| b.took.map(|t| t.p95))
        .fold(0.0, f64::max)
        .max(1.0);
    let plot_h = HEIGHT - BOTTOM;
    let slot = (WIDTH - LEFT) / buckets.len() as i64;
    let y = |ms: f64| plot_h - (ms / max * (plot_h - 4) as f64).round() as i64;
    let secs = |ms: f64| layout::span(ms / 1000.0);
    html! {
        svg id="latency" data-window=(window.as_str()) xmlns="http://www.w3.org/2000/svg"
            width=(WIDTH) height=(HEIGHT) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img"
            aria-label=(format!("how long instances took from insert to finish in {}", window.says())) {
            line x1=(LEFT) y1=(plot_h) x2=(WIDTH) y2=(plot_h) stroke="#9aa5b1" {}
            text x=(LEFT - 4) y="12" text-anchor="end" font-size="10" { (secs(max)) }
            text x=(LEFT - 4) y=(plot_h) text-anchor="end" font-size="10" { "0" }
            @for (i, b) in buckets.iter().enumerate() {
                @let x = LEFT + i as i64 * slot + 1;
                @if let Some(t) = b.took {
                    @let top = y(t.p95);
                    rect class="bar p95" x=(x) y=(top) width=(slot - 2) height=(plot_h - top)
                        fill="#7a9cc6" {
                        title { (label(window, b.at)) ": median " (secs(t.p50)) ", 95% within " (secs(t.p95)) }
                    }
                    line class="p50" x1=(x) x2=(x + slot - 2) y1=(y(t.p50)) y2=(y(t.p50))
                        stroke="#1d2a3a" stroke-width="2" {}
                }
                @if i % 10 == 0 {
                    text x=(x) y=(HEIGHT - 4) font-size="10" { (label(window, b.at)) }
                } @else if i == buckets.len() - 1 {
                    text x=(WIDTH) y=(HEIGHT - 4) font-size="10" text-anchor="end" { (label(window, b.at)) }
                }
            }
        }
    }
}

/// The links that pick the window, the current one marked; a live page stays live
/// (`every`: its reload period).
pub(crate) fn picker(current: Window, every: Option<u32>) -> Markup {
    let live = every.map_or(String::new(), |n| format!("&live={n}"));
    html! {
        p id="window" {
            "Window: "
            @for w in Window::ALL {
                @if w == current {
                    strong data-window=(w.as_str()) { (w.as_str()) }
                } @else {
                    a href=(format!("/?window={}{live}", w.as_str())) data-window=(w.as_str()) { (w.as_str()) }
                }
                " "
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bucket_has_a_bar_and_the_tallest_fills_the_plot() {
        let now: DateTime<Utc> = "2026-12-02T10:30:42Z".parse().unwrap();
        let first = Window::Minutes30.first(now);
        assert_eq!(
            first,
            "2026-12-02T10:01:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        let rows = [Bucket {
            at: first,
            done: 10,
            failed: 2,
            took: Some(Took {
                p50: 40.0,
                p95: 2_000.0,
            }),
        }];
        let svg = throughput(Window::Minutes30, first, &rows).into_string();
        assert_eq!(svg.matches("class=\"bar done\"").count(), 30);
        assert_eq!(svg.matches("class=\"bar failed\"").count(), 1);
        assert!(svg.contains("10:01: 10 done, 2 failed"), "{svg}");
        assert!(svg.contains(">12</text>"), "the scale's top is the busiest");
        let svg = latency(Window::Minutes30, first, &rows).into_string();
        assert_eq!(svg.matches("class=\"bar p95\"").count(), 1, "{svg}");
        assert!(svg.contains("median 40ms, 95% within 2.0s"), "{svg}");
    }

    #[test]
    fn windows_are_aligned_buckets_ending_now() {
        let now: DateTime<Utc> = "2026-12-02T10:37:42Z".parse().unwrap();
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(Window::Hours6.first(now), at("2026-12-02T04:40:00Z"));
        assert_eq!(Window::Hours24.first(now), at("2026-12-01T11:00:00Z"));
        assert_eq!(Window::Days7.first(now), at("2026-11-25T12:00:00Z"));
        assert_eq!(Window::parse(None).unwrap(), Window::Minutes30);
        assert_eq!(Window::parse(Some("7d")).unwrap(), Window::Days7);
        assert!(Window::parse(Some("1y")).is_err());
    }

    #[test]
    fn a_quantile_is_the_upper_bound_of_its_slot() {
        // 10 under 1 ms, 80 in [4, 8) ms, 10 in [512, 1024) ms.
        let mut h = vec![0; 32];
        h[0] = 10;
        h[3] = 80;
        h[10] = 10;
        assert_eq!(quantile(&h, 0.05), Some(1.0));
        assert_eq!(quantile(&h, 0.5), Some(8.0));
        assert_eq!(quantile(&h, 0.95), Some(1024.0));
        assert_eq!(quantile(&[0; 32], 0.5), None);
    }
}
