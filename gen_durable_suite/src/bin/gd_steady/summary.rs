//! The end-of-run printout: the capacity probe's figure, or the reports as a markdown
//! table, the windows compared, the JSON summary, each check and the verdict.

use std::sync::atomic::Ordering;

use gen_durable::prelude::json;

use crate::checks::{Check, Figures, Run};
use crate::config::Config;
use crate::sample::{mib, Report};
use crate::tables::TableStats;
use crate::tally::Shared;

/// The capacity probe's result: completed/s after `--probe-skip-secs`, and half of it.
pub(crate) fn print_capacity(cfg: &Config, reports: &[Report]) {
    let (skip, probe_inflight) = (cfg.probe_skip_secs, cfg.probe_inflight);
    let from = reports.iter().find(|r| r.t >= skip - 0.5);
    let to = reports.last();
    let (capacity, t_to) = match (from, to) {
        (Some(a), Some(b)) if b.t > a.t => {
            ((b.done_total - a.done_total) as f64 / (b.t - a.t), b.t)
        }
        _ => (0.0, 0.0),
    };
    println!(
        "steady: capacity probe: {capacity:.0} instances/s completed (3 steps and a signal each) \
         over t={skip:.0}..{t_to:.0}s with {probe_inflight} in flight; half: --rate {:.0}",
        capacity / 2.0
    );
}

/// Prints the steady-state run's results; whether every check holds.
pub(crate) fn print(
    cfg: &Config,
    run: &Run,
    f: &Figures,
    checks: &[Check],
    tables: &TableStats,
    shared: &Shared,
) -> bool {
    let Config {
        rate,
        seconds,
        window_secs,
        warmup_secs,
        ..
    } = *cfg;
    let Run {
        ref reports,
        inserted,
        completed,
        failed,
        ref autovacuum,
        vacuum_secs,
        ref vacuums,
        ..
    } = *run;
    let Figures {
        w,
        thr_first,
        thr_last,
        p99_first,
        p99_last,
        p50_first,
        p50_last,
        p99_ratio,
        ref end,
        ref refr,
    } = *f;
    let TableStats {
        ref tables,
        ref bloat,
        hot_ratio,
    } = *tables;

    println!("steady: reports");
    println!("| t (s) | offered/s | completed/s | p50 ms | p99 ms | max ms | backlog | parked | rows | gd_instances MiB (heap + idx) | dead | gd_signals MiB | dead | RSS MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        println!(
            "| {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {:.2} ({:.2} + {:.2}) | {} | {:.2} | {} | {:.1} |",
            r.t, r.offered, r.completed, r.p50, r.p99, r.max, r.backlog, r.parked, r.rows,
            mib(r.inst_total), mib(r.inst_heap), mib(r.inst_idx), r.inst_dead, mib(r.sig_total), r.sig_dead, r.rss
        );
    }
    println!(
        "steady: first window [{warmup_secs}s, {:.0}s): {thr_first:.1}/s, p50 {p50_first:.1} ms, p99 {p99_first:.1} ms; \
         last window [{:.0}s, {seconds}s): {thr_last:.1}/s, p50 {p50_last:.1} ms, p99 {p99_last:.1} ms; \
         ratios last/first: throughput {:.3}, p99 {p99_ratio:.3}",
        warmup_secs as f64 + w,
        seconds as f64 - w,
        thr_last / thr_first.max(1e-9)
    );
    println!(
        "steady: gd_instances HOT updates {:.1}%; collector deleted {}; vacuums {} ({})",
        hot_ratio * 100.0,
        shared.collected.load(Ordering::Relaxed),
        vacuums.len(),
        vacuums
            .iter()
            .map(|s| format!("{s:.1}s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let summary = json!({
        "rate": rate, "seconds": seconds, "window_secs": window_secs, "warmup_secs": warmup_secs,
        "inserted": inserted, "completed": completed, "failed": failed,
        "first": { "per_sec": thr_first, "p50_ms": p50_first, "p99_ms": p99_first },
        "last": { "per_sec": thr_last, "p50_ms": p50_last, "p99_ms": p99_last },
        "throughput_ratio": thr_last / thr_first.max(1e-9), "p99_ratio": p99_ratio,
        "reference": { "t": refr.t, "gd_instances_bytes": refr.inst_total, "gd_signals_bytes": refr.sig_total, "rss_mib": refr.rss },
        "end": { "t": end.t, "gd_instances_bytes": end.inst_total, "gd_instances_heap": end.inst_heap,
                 "gd_instances_indexes": end.inst_idx, "gd_instances_dead": end.inst_dead,
                 "gd_signals_bytes": end.sig_total, "gd_signals_dead": end.sig_dead, "rows": end.rows, "rss_mib": end.rss },
        "rss_first_report_mib": reports.first().map(|r| r.rss),
        "max_rss_mib": reports.iter().map(|r| r.rss).fold(0.0, f64::max),
        "tables": tables, "bloat": bloat,
        "vacuum_secs": vacuum_secs, "vacuum_runs": vacuums,
        "collector_deleted": shared.collected.load(Ordering::Relaxed),
        "server_autovacuum": autovacuum,
    });
    println!("{summary}");
    let ok = checks.iter().all(|c| c.ok);
    for c in checks {
        println!(
            "steady: {} {}: {} ({})",
            if c.ok { "ok  " } else { "FAIL" },
            c.name,
            c.value,
            c.bound
        );
    }
    println!(
        "steady: {}",
        if ok {
            "steady state holds"
        } else {
            "STEADY STATE BROKEN"
        }
    );
    ok
}
