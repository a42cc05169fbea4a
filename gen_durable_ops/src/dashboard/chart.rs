//! The overview's throughput chart: done and failed rows per minute, as inline SVG.

use chrono::{DateTime, Duration, Utc};
use maud::{html, Markup};

use crate::store::dashboard::MinuteRow;

/// Minutes the chart shows, the current one included.
pub(crate) const MINUTES: i64 = 30;

const WIDTH: i64 = 600;
const HEIGHT: i64 = 150;
/// Room on the left for the scale, below for the time labels.
const LEFT: i64 = 40;
const BOTTOM: i64 = 18;

/// The first minute of the chart ending at `now`'s minute.
pub(crate) fn first_minute(now: DateTime<Utc>) -> DateTime<Utc> {
    let minute = now
        - Duration::seconds(now.timestamp().rem_euclid(60))
        - Duration::nanoseconds(i64::from(now.timestamp_subsec_nanos()));
    minute - Duration::minutes(MINUTES - 1)
}

/// A bar pair per minute from `first`, stacked (failed on top of done); every minute has
/// its bars, zero-high when nothing finished, so the time axis is regular.
pub(crate) fn throughput(first: DateTime<Utc>, rows: &[MinuteRow]) -> Markup {
    let per_minute: Vec<(DateTime<Utc>, i64, i64)> = (0..MINUTES)
        .map(|i| {
            let m = first + Duration::minutes(i);
            let r = rows.iter().find(|r| r.minute == m);
            (m, r.map_or(0, |r| r.done), r.map_or(0, |r| r.failed))
        })
        .collect();
    let max = per_minute
        .iter()
        .map(|(_, d, f)| d + f)
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_h = HEIGHT - BOTTOM;
    let slot = (WIDTH - LEFT) / MINUTES;
    let y = |v: i64| plot_h - v * (plot_h - 4) / max;
    let total: i64 = per_minute.iter().map(|(_, d, f)| d + f).sum();
    html! {
        svg id="throughput" xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(HEIGHT)
            viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img"
            aria-label=(format!("{total} rows finished in the last {MINUTES} minutes")) {
            line x1=(LEFT) y1=(plot_h) x2=(WIDTH) y2=(plot_h) stroke="#9aa5b1" {}
            text x=(LEFT - 4) y="12" text-anchor="end" font-size="10" { (max) }
            text x=(LEFT - 4) y=(plot_h) text-anchor="end" font-size="10" { "0" }
            @for (i, (m, done, failed)) in per_minute.iter().enumerate() {
                @let x = LEFT + i as i64 * slot + 1;
                @let top_done = y(*done);
                rect class="bar done" x=(x) y=(top_done) width=(slot - 2)
                    height=(plot_h - top_done) fill="#3c9d5d" {
                    title { (m.format("%H:%M")) ": " (done) " done, " (failed) " failed" }
                }
                @if *failed > 0 {
                    @let top = y(done + failed);
                    rect class="bar failed" x=(x) y=(top) width=(slot - 2)
                        height=(top_done - top) fill="#d0453a" {}
                }
                @if i % 10 == 0 || i as i64 == MINUTES - 1 {
                    text x=(x) y=(HEIGHT - 4) font-size="10" { (m.format("%H:%M")) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_minute_has_a_bar_and_the_tallest_fills_the_plot() {
        let now: DateTime<Utc> = "2026-12-02T10:30:42Z".parse().unwrap();
        let first = first_minute(now);
        assert_eq!(
            first,
            "2026-12-02T10:01:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        let rows = [MinuteRow {
            minute: first,
            done: 10,
            failed: 2,
        }];
        let svg = throughput(first, &rows).into_string();
        assert_eq!(svg.matches("class=\"bar done\"").count(), MINUTES as usize);
        assert_eq!(svg.matches("class=\"bar failed\"").count(), 1);
        assert!(svg.contains("10:01: 10 done, 2 failed"), "{svg}");
        assert!(
            svg.contains(">12</text>"),
            "the scale's top is the busiest minute"
        );
    }
}
