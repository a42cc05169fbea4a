//! The steady-state soak: one node (this process: an engine, a producer, a signaller)
//! runs a fixed offered load for a long time with the collector on, and checks that
//! nothing drifts: throughput, latency, table and index sizes, the node's memory.
//!
//! **Workload.** `Steady`, a three-step FSM on queue `steady`: `one` → `two`, which parks
//! on the signal `go` → `finish`, done. A producer inserts `--rate` instances per second,
//! paced by a 10 ms tick: each tick inserts, in one `insert_all`, the instances due since
//! the last one (an open loop: a slow database makes the next batch bigger, never the
//! offered rate lower). The signaller sends `go` to an instance as soon as the engine
//! reports its `await` committed (the `step.stop` event of kind `await`), through
//! `--signal-concurrency` concurrent `signal()` calls; so every signal reaches a parked
//! instance (the early-signal path, a signal stored before the instance parks, is the
//! reliability suite's, not this soak's). Latency is the instance's whole life: from the
//! producer's `insert_all` call to the `step.stop` event of its `done` (the outcome
//! committed), measured in this process; no per-instance query.
//!
//! **The node.** One engine in this process (queue concurrency `--concurrency`, default
//! 32, prefetch `--prefetch`, default 32; pool `--pool`, default 10; the producer's and
//! the signaller's client has a pool of its own, `--client-pool`, default 10) with the
//! collector on: retention `--retention-secs` (default
//! 30), every `--collector-secs` (default 5), so that finished rows are deleted and the
//! table stays bounded. Its memory is this process's RSS (`VmRSS`, /proc/self/status).
//!
//! **Vacuum.** The soak's database inherits the server's autovacuum. When the server
//! runs with `autovacuum = off` (this machine's CI configuration does), nothing would ever
//! vacuum the tables, and that is not a deployment: the soak then stands in for
//! autovacuum with `VACUUM (ANALYZE) gd_instances` and `… gd_signals` every
//! `--vacuum-secs` (default 60 = `autovacuum_naptime`'s default; the migration's scale
//! factor 0.02 makes autovacuum vacuum `gd_instances` at every visit under this churn),
//! throttled as autovacuum is (`vacuum_cost_delay` 2 ms, cost limit 200).
//! `--vacuum-secs 0` turns the stand-in off, e.g. to see the bloat without it; with the
//! server's autovacuum on, there is no stand-in unless `--vacuum-secs` is given. Until the
//! first vacuum (and its analyze) a fresh database's latency rises as the table grows
//! (at 200/s: p50 ~20 ms → 40–80 ms between 30 s and 60 s, back to ~20 ms after it); the
//! CI version vacuums every 15 s, so that it is flat and at its working size within its
//! first minute, and its size check compares the second minute with the first.
//!
//! **Reports.** Every `--report-secs` (default 60; 10 when `--seconds` ≤ 300) one line:
//! elapsed, offered/s and completed/s in the interval, p50/p99/max latency of the
//! instances completed in it, backlog (rows `runnable` + `executing`), parked rows, rows
//! in `gd_instances`, `pg_total_relation_size` of `gd_instances` (heap+indexes) and of
//! `gd_signals`, `n_dead_tup` of each, and the node's RSS. At the end: the first and the
//! last window (`--window-secs`, default 300 s; `--seconds / 4` when the run is shorter
//! than 30 minutes), by completion time, compared — the first one starting after
//! `--warmup-secs` (default 0), so that a fresh database's first minutes can be left out; `pg_stat_user_tables` of both tables
//! (updates, HOT updates, deletes, vacuums) and `pgstattuple`/`pgstatindex` when the
//! extension is available; a markdown table of the reports; a JSON summary.
//!
//! **Checks** (the exit code is 1 if one fails):
//! - throughput: completed/s in the first and in the last window within
//!   `--tolerance` (default 10%) of `--rate`. At half capacity the node keeps up with the
//!   offered load, so this is stable even on a noisy machine; a node that falls behind,
//!   or a producer that cannot offer the rate, fails it;
//! - nothing lost: after the load stops, every inserted instance completes within 60 s
//!   (`done`, none `failed`), and no insert or signal call failed;
//! - p99 latency of the last window ≤ `--max-p99-ms` (default 2,000: a generous absolute
//!   bound — a stall, not noise). The first window's p99 is reported, not bounded: it
//!   holds the fresh table's transient before the first vacuum, which at 480/s reached
//!   a p99 of ~2 s in the first minute. The last/first p99 ratio is always reported; it
//!   is enforced only with `--max-p99-ratio R` (the 30-minute run reports it; on a
//!   shared 2-core machine a 10% bound on a p99 of a few tens of ms is noise-bound);
//! - rows bounded: rows in `gd_instances` at the end ≤ `--rate` × (retention +
//!   2 × collector interval + 10 s): what the collector must keep it to;
//! - sizes bounded: `pg_total_relation_size` of `gd_instances` and of `gd_signals` at the
//!   end ≤ `--size-factor` (default 1.5) × their size at the *reference point* + 1 MiB.
//!   The reference point is the first report at or after the end of the first window
//!   and after retention + collector interval + vacuum interval + one report: by then
//!   rows are deleted as fast as they are inserted and a vacuum has made their space
//!   reusable, so the tables have their working size; unbounded growth (a collector that
//!   stops, space never reused) grows past it;
//! - memory: the node's RSS at the end ≤ `--rss-factor` (default 1.25) × its RSS at
//!   the reference point + `--rss-slack-mib` (default 8): after the warm-up the node
//!   allocates what it freed. A leak per instance exceeds it from ~15 bytes per instance
//!   in the 30-minute run at 480/s (720,000 instances after the reference point), from
//!   ~900 bytes in the CI version (12,000): the CI check catches gross leaks only.
//!
//! ```sh
//! CARGO_TARGET_DIR=… cargo build --release -p gen_durable_suite --bin gd_steady
//! G="--signal-concurrency 64 --client-pool 32"
//! ./target/release/gd_steady --capacity-probe --seconds 150 --probe-skip-secs 70 $G
//! ./target/release/gd_steady --rate 480 --seconds 1800 $G      # 30 minutes, windows of 5
//! cargo run --bin gd_steady -- --rate 200 --seconds 120 --window-secs 30 --vacuum-secs 15   # CI
//! ```
//!
//! **`--capacity-probe`** measures the saturation throughput of this very workload on
//! this node: a closed loop that keeps `--probe-inflight` (default 2,000) instances
//! between insert and `done`, inserting at most 200 per 10 ms tick, for `--seconds`
//! (default 40, report every 5 s); it prints completed/s over the run after its first
//! `--probe-skip-secs` (default 10), and half of it as the `--rate` of a run at 50% of
//! capacity. No check. Skip past the first vacuum (e.g. `--seconds 150
//! --probe-skip-secs 70`): before it, the fresh table's bloat lowers the figure.
//!
//! Other options: `--database-url` (a server; the soak uses its own database
//! `gen_durable_steady`, dropped and created), `--signal-concurrency` (default 16).

mod checks;
mod config;
mod fsm;
mod hist;
mod node;
mod producer;
mod sample;
mod summary;
mod tables;
mod tally;
mod vacuum;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gen_durable_suite::scratch::create_scratch_db;
use gen_durable_suite::worker::Args;
use sqlx::postgres::PgPoolOptions;

use checks::{Figures, Run};
use config::Config;
use node::Node;
use sample::{print_report, sample, Report};
use tally::Shared;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse(std::env::args().skip(1));
    let cfg = Config::from_args(&args)?;

    // Its admin connection stays open for the whole run, as it always has.
    let mut scratch = create_scratch_db(&args, "gen_durable_steady").await?;
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&mut scratch.admin)
        .await?;
    let opts = scratch.opts.clone();
    let stats = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(opts.clone().application_name("gd_steady-stats"))
        .await?;
    gen_durable::migrate_schema(&stats).await?;
    let pgstattuple = sqlx::query("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .execute(&stats)
        .await
        .is_ok();
    let vacuum_secs = cfg.vacuum_secs(&autovacuum)?;

    let shared = Arc::new(Shared {
        t0: Instant::now(),
        window: Duration::from_secs(cfg.window_secs),
        warmup: Duration::from_secs(cfg.warmup_secs),
        end: Duration::from_secs(cfg.seconds),
        tally: Mutex::default(),
        insert_errors: AtomicU64::new(0),
        signal_errors: AtomicU64::new(0),
        collected: AtomicU64::new(0),
    });

    let node = Node::start(&cfg, &opts, &shared, vacuum_secs).await?;

    // The producer: open loop at `rate`, or (probe) closed loop at `probe_inflight`.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = producer::spawn(&cfg, node.gd.clone(), shared.clone(), stop.clone());

    node.print_header(&cfg, &autovacuum, vacuum_secs);

    let mut reports: Vec<Report> = Vec::new();
    let mut since = shared.t0;
    let mut next = shared.t0;
    loop {
        next += Duration::from_secs(cfg.report_secs);
        let at = next.min(shared.t0 + shared.end);
        tokio::time::sleep_until(at.into()).await;
        if at >= shared.t0 + shared.end {
            stop.store(true, Ordering::Relaxed);
        }
        let r = sample(&shared, &stats, &mut since).await?;
        print_report(&r);
        reports.push(r);
        if at >= shared.t0 + shared.end {
            break;
        }
    }
    producer.await?;

    // Drain: every instance inserted must finish.
    let drain_start = Instant::now();
    loop {
        let open = {
            let t = shared.tally();
            t.open.len() + t.early.len()
        };
        if open == 0 || drain_start.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let vacuum_runs = node.vacuum_runs.clone();
    node.shutdown().await;

    let (inserted, completed, failed, open, first, last) = {
        let mut t = shared.tally();
        (
            t.inserted,
            t.completed,
            t.failed,
            t.open.len() + t.early.len(),
            std::mem::take(&mut t.first),
            std::mem::take(&mut t.last),
        )
    };

    if cfg.probe {
        summary::print_capacity(&cfg, &reports);
        stats.close().await;
        return Ok(());
    }

    let tables = tables::collect(&stats, pgstattuple).await?;
    stats.close().await;

    let run = Run {
        reports,
        inserted,
        completed,
        failed,
        open,
        drain_secs,
        first,
        last,
        autovacuum,
        vacuum_secs,
        vacuums: vacuum_runs.lock().expect("vacuum runs").clone(),
    };
    let figures = Figures::compute(&cfg, &run);
    let checks = checks::checks(&cfg, &run, &figures, &shared);
    let ok = summary::print(&cfg, &run, &figures, &checks, &tables, &shared);
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
