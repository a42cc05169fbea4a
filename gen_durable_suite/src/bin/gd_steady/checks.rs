//! The final check: the first and the last window compared, the reference point, and
//! the pass/fail checks of the crate doc (throughput, nothing lost, p99, rows, sizes,
//! memory).

use std::sync::atomic::Ordering;

use crate::config::Config;
use crate::hist::Hist;
use crate::sample::{mib, Report};
use crate::tally::Shared;

/// What the run did, once the node has stopped.
pub(crate) struct Run {
    /// Every report, in order.
    pub(crate) reports: Vec<Report>,
    pub(crate) inserted: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    /// Instances inserted and not finished after the drain.
    pub(crate) open: usize,
    pub(crate) drain_secs: f64,
    /// Latencies of the instances finished in the first and in the last window.
    pub(crate) first: Hist,
    pub(crate) last: Hist,
    /// The server's `autovacuum`, and the stand-in's interval (0: none) and run times.
    pub(crate) autovacuum: String,
    pub(crate) vacuum_secs: u64,
    pub(crate) vacuums: Vec<f64>,
}

/// The windows' figures, and the reports at the reference point and at the end.
pub(crate) struct Figures {
    /// The window, s.
    pub(crate) w: f64,
    pub(crate) thr_first: f64,
    pub(crate) thr_last: f64,
    pub(crate) p99_first: f64,
    pub(crate) p99_last: f64,
    pub(crate) p50_first: f64,
    pub(crate) p50_last: f64,
    pub(crate) p99_ratio: f64,
    pub(crate) end: Report,
    pub(crate) refr: Report,
}

impl Figures {
    /// The comparisons.
    pub(crate) fn compute(cfg: &Config, run: &Run) -> Figures {
        let (first, last, reports) = (&run.first, &run.last, &run.reports);
        let w = cfg.window_secs as f64;
        let thr_first = first.n as f64 / w;
        let thr_last = last.n as f64 / w;
        let (p99_first, p99_last) = (first.quantile_ms(0.99), last.quantile_ms(0.99));
        let (p50_first, p50_last) = (first.quantile_ms(0.50), last.quantile_ms(0.50));
        let p99_ratio = p99_last / p99_first.max(1e-3);
        let end = reports.last().cloned().unwrap_or_default();
        let ref_at = (cfg.warmup_secs as f64 + w)
            .max((cfg.retention + cfg.collector_secs + run.vacuum_secs + cfg.report_secs) as f64);
        let refr = reports
            .iter()
            .find(|r| r.t >= ref_at - 0.5)
            .cloned()
            .unwrap_or_else(|| end.clone());
        Figures {
            w,
            thr_first,
            thr_last,
            p99_first,
            p99_last,
            p50_first,
            p50_last,
            p99_ratio,
            end,
            refr,
        }
    }
}

/// A check: its name, the value, the bound, whether it holds.
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) value: String,
    pub(crate) bound: String,
    pub(crate) ok: bool,
}

fn check(checks: &mut Vec<Check>, name: &str, value: String, bound: String, ok: bool) {
    checks.push(Check {
        name: name.into(),
        value,
        bound,
        ok,
    });
}

/// The checks, in the order they are printed.
pub(crate) fn checks(cfg: &Config, run: &Run, f: &Figures, shared: &Shared) -> Vec<Check> {
    let Config {
        rate,
        retention,
        collector_secs,
        tolerance,
        max_p99_ms,
        max_p99_ratio,
        size_factor,
        rss_factor,
        rss_slack,
        ..
    } = *cfg;
    let Run {
        inserted,
        completed,
        failed,
        open,
        drain_secs,
        ..
    } = *run;
    let Figures {
        thr_first,
        thr_last,
        p99_first,
        p99_last,
        p99_ratio,
        ref end,
        ref refr,
        ..
    } = *f;

    let rate_f = rate as f64;
    let mut checks = Vec::new();
    for (name, thr) in [
        ("throughput, first window", thr_first),
        ("throughput, last window", thr_last),
    ] {
        check(
            &mut checks,
            name,
            format!("{thr:.1}/s"),
            format!("{rate} ± {:.0}%", tolerance * 100.0),
            (thr - rate_f).abs() <= tolerance * rate_f,
        );
    }
    check(
        &mut checks,
        "nothing lost",
        format!(
            "inserted {inserted}, done {completed}, failed {failed}, unfinished {open} after a {drain_secs:.1}s drain; insert errors {}, signal errors {}",
            shared.insert_errors.load(Ordering::Relaxed),
            shared.signal_errors.load(Ordering::Relaxed)
        ),
        "all done, no error".into(),
        inserted == completed
            && failed == 0
            && open == 0
            && shared.insert_errors.load(Ordering::Relaxed) == 0
            && shared.signal_errors.load(Ordering::Relaxed) == 0,
    );
    // The first window's p99 is reported, not bounded: it holds the fresh table's
    // transient before its first vacuum (see the crate doc, main.rs).
    check(
        &mut checks,
        "p99, last window",
        format!("{p99_last:.1} ms (first window: {p99_first:.1} ms)"),
        format!("≤ {max_p99_ms} ms"),
        p99_last <= max_p99_ms,
    );
    if let Some(max) = max_p99_ratio {
        check(
            &mut checks,
            "p99 last/first",
            format!("{p99_ratio:.2}"),
            format!("≤ {max}"),
            p99_ratio <= max,
        );
    }
    let rows_bound = rate_f * (retention + 2 * collector_secs + 10) as f64;
    check(
        &mut checks,
        "rows in gd_instances at the end",
        end.rows.to_string(),
        format!("≤ {rows_bound:.0}"),
        (end.rows as f64) <= rows_bound,
    );
    let one_mib = 1024.0 * 1024.0;
    for (name, at_end, at_ref) in [
        (
            "gd_instances size at the end",
            end.inst_total,
            refr.inst_total,
        ),
        ("gd_signals size at the end", end.sig_total, refr.sig_total),
    ] {
        let bound = size_factor * at_ref as f64 + one_mib;
        check(
            &mut checks,
            name,
            format!("{:.2} MiB", mib(at_end)),
            format!(
                "≤ {size_factor} × {:.2} MiB (t={:.0}s) + 1 MiB = {:.2} MiB",
                mib(at_ref),
                refr.t,
                bound / one_mib
            ),
            at_end as f64 <= bound,
        );
    }
    let rss_bound = rss_factor * refr.rss + rss_slack;
    check(
        &mut checks,
        "node RSS at the end",
        format!("{:.1} MiB", end.rss),
        format!(
            "≤ {rss_factor} × {:.1} MiB (t={:.0}s) + {rss_slack} MiB = {rss_bound:.1} MiB",
            refr.rss, refr.t
        ),
        end.rss <= rss_bound,
    );
    checks
}
