//! `gen_durable_bench`: the benchmark harness.
//!
//! ```sh
//! cargo run --release -p gen_durable_bench                      # every scenario, with the ceiling
//! cargo run --release -p gen_durable_bench -- --scenario drain  # one scenario
//! cargo run --release -p gen_durable_bench -- --smoke           # tiny sizes, no ceiling (CI)
//! cargo run --release -p gen_durable_bench -- --processes 1,2,4 --runs 3  # engines in 1, 2, 4 processes
//! ```
//!
//! Creates afresh (and migrates) its own database `gen_durable_bench` on `DATABASE_URL`'s server,
//! runs each scenario on a clean table and prints one JSON line per scenario. The ceiling
//! (`pg-ceiling.sh 100 4 10`, a minimal two-transaction SKIP LOCKED queue) is measured in
//! the same run, and every line carries its ratio to it. Every run checks its own result:
//! each instance `done` exactly once with the expected state, or the harness exits non-zero.
//!
//! `GD_SCHEMA_EXPERIMENT=FILE` runs the SQL in FILE after the migration (a function
//! replaced, a table added: a design tried in the engine before it is built). The drain
//! then checks only that each step ran once, not where the finished rows are.

mod fsms;
mod hook;
mod rss;
mod scenarios;

use std::path::PathBuf;
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Map, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use gen_durable::{Client, Pooler, WakeListener};
use gen_durable_testkit::statements::StatementLog;

/// Benchmark scenarios of gen_durable, one JSON line each.
#[derive(Debug, Parser)]
#[command(name = "gen_durable_bench")]
pub(crate) struct Args {
    /// Tiny sizes and no ceiling: checks correctness only (CI).
    #[arg(long)]
    smoke: bool,
    /// Scenarios to run (repeatable; default: all but drain_sweep). One of: insert,
    /// insert_all, drain, five_step, signal_latency, wait_latency, wake_latency, fan_out,
    /// pick_1m, drain_sweep.
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// Runs of each scenario; with more than one, a `median` line follows the runs.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Don't measure the ceiling (ratios are then null).
    #[arg(long)]
    no_ceiling: bool,
    /// Seconds the ceiling runs (it runs before and after the scenarios; ratios are to
    /// the mean of the two).
    #[arg(long, default_value_t = 10)]
    ceiling_secs: u32,
    /// Queue concurrency of the engine (the ceiling holds 4 × 100 rows at once).
    #[arg(long, default_value_t = 256)]
    pub(crate) concurrency: usize,
    /// Queue prefetch of the engine.
    #[arg(long, default_value_t = 256)]
    pub(crate) prefetch: usize,
    /// Don't pick for fewer free slots than this (the engine's default is 1).
    #[arg(long, default_value_t = 1)]
    pub(crate) min_demand: usize,
    /// Most outcomes per group commit.
    #[arg(long, default_value_t = 512)]
    pub(crate) commit_batch: usize,
    /// Connections in the engine's pool.
    #[arg(long, default_value_t = 20)]
    pub(crate) pool: u32,
    /// Turn off sqlx's ping before every pool acquire (`test_before_acquire(false)`) on
    /// the engine's pool: one round trip less per claim and per commit.
    #[arg(long)]
    pub(crate) no_ping: bool,
    /// Override the instance count of drain / five_step / fan_out.
    #[arg(long)]
    pub(crate) n: Option<usize>,
    /// Pad the state of every instance the scenarios insert with about this many bytes
    /// (a string field), e.g. to measure the history's level `full`.
    #[arg(long, default_value_t = 0)]
    pub(crate) state_bytes: usize,
    /// Run drain and five_step (the default scenarios then) with the engines in this many
    /// worker processes, each with the engine settings above; a list (`1,2,4`) runs each
    /// count in turn, `--runs` times over, interleaved.
    #[arg(long, value_delimiter = ',')]
    processes: Vec<usize>,
    /// Internal: run as worker process K of `--processes`.
    #[arg(long, hide = true)]
    worker: Option<usize>,
    /// A transaction-mode pooler in front of `DATABASE_URL`'s server (e.g.
    /// `postgres://postgres@127.0.0.1:6543/postgres`, `scripts/pgbouncer.sh`): the engines'
    /// and the measured clients' pools go through it, with `Pooler::Transaction`. Setup
    /// and checks stay direct.
    #[arg(long)]
    pooler_url: Option<String>,
    /// Where engines LISTEN: on a connection of the pool's (`pool`, the default without
    /// a pooler), on the server itself (`direct`, the default with `--pooler-url`), or
    /// nowhere (`off`: polling only).
    #[arg(long, value_enum)]
    listener: Option<Listen>,
    /// A shell command run when a drain's backlog is in place, just before its engine
    /// starts (`GD_BENCH_PID`, `GD_BENCH_N` in its environment); see `profile/profile.sh`.
    #[arg(long)]
    pub(crate) before_drain: Option<String>,
    /// A shell command run when a drain's last instance is done, before its engine stops.
    #[arg(long)]
    pub(crate) after_drain: Option<String>,
}

/// See `Args::listener`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Listen {
    Pool,
    Direct,
    Off,
}

/// What every scenario gets.
#[derive(Debug)]
pub(crate) struct Bench {
    pub(crate) args: Args,
    /// Setup, cleaning and verification: statements not counted.
    pub(crate) quiet: PgPool,
    /// Statement logging on: what the engine or the measured client uses (through
    /// `--pooler-url` when given).
    pub(crate) logged: PgConnectOptions,
    /// The bench database on the server itself.
    pub(crate) direct: PgConnectOptions,
    pub(crate) log: StatementLog,
}

impl Bench {
    pub(crate) fn smoke(&self) -> bool {
        self.args.smoke
    }

    /// What the measured pools go through.
    pub(crate) fn pooler(&self) -> Pooler {
        if self.args.pooler_url.is_some() {
            Pooler::Transaction
        } else {
            Pooler::None
        }
    }

    /// Where an engine of this run LISTENs (see `Args::listener`).
    pub(crate) fn listener(&self) -> WakeListener {
        self.listener_for(
            self.args
                .listener
                .unwrap_or(if self.args.pooler_url.is_some() {
                    Listen::Direct
                } else {
                    Listen::Pool
                }),
        )
    }

    pub(crate) fn listener_for(&self, l: Listen) -> WakeListener {
        match l {
            Listen::Pool => WakeListener::Pool,
            Listen::Direct => WakeListener::direct(self.direct.clone().disable_statement_logging()),
            Listen::Off => WakeListener::Off,
        }
    }

    /// A client on `pool` (a measured pool), told what the pool goes through.
    pub(crate) fn client(&self, pool: &PgPool) -> Client {
        Client::new(pool.clone()).with_pooler(self.pooler())
    }

    /// A new pool whose statements are counted.
    pub(crate) async fn logged_pool(&self, size: u32) -> sqlx::Result<PgPool> {
        self.pool(size, true).await
    }

    /// A new pool on the bench database; `counted`: its statements are logged, and so
    /// counted.
    pub(crate) async fn pool(&self, size: u32, counted: bool) -> sqlx::Result<PgPool> {
        let opts = if counted {
            self.logged.clone()
        } else {
            self.logged.clone().disable_statement_logging()
        };
        PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size.min(4))
            .test_before_acquire(!self.args.no_ping)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(opts)
            .await
    }

    /// An empty table for the next scenario.
    pub(crate) async fn clean(&self) -> sqlx::Result<()> {
        sqlx::query("TRUNCATE gd_instances, gd_signals, gd_ready, gd_batches, gd_due RESTART IDENTITY CASCADE")
            .execute(&self.quiet)
            .await?;
        sqlx::query("VACUUM ANALYZE gd_instances")
            .execute(&self.quiet)
            .await?;
        Ok(())
    }
}

/// One scenario's figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) n: u64,
    pub(crate) secs: f64,
    pub(crate) per_s: f64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) statements_per_step: Option<f64>,
    /// Scenario-specific figures, printed after the common ones.
    pub(crate) extra: Map<String, Value>,
}

impl Report {
    /// `n` things in `secs`, with each one's latency in `lat_ms`.
    pub(crate) fn measured(
        n: u64,
        secs: f64,
        lat_ms: &mut [f64],
        statements_per_step: f64,
        extra: Map<String, Value>,
    ) -> Self {
        let (p50, p99) = (
            scenarios::percentile(lat_ms, 0.5),
            scenarios::percentile(lat_ms, 0.99),
        );
        Report::with_percentiles(n, secs, (p50, p99), statements_per_step, extra)
    }

    /// `n` things in `secs`, whose latency percentiles are `(p50, p99)`.
    pub(crate) fn with_percentiles(
        n: u64,
        secs: f64,
        (p50_ms, p99_ms): (Option<f64>, Option<f64>),
        statements_per_step: f64,
        extra: Map<String, Value>,
    ) -> Self {
        Report {
            n,
            secs,
            per_s: n as f64 / secs,
            p50_ms,
            p99_ms,
            statements_per_step: Some(statements_per_step),
            extra,
        }
    }
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ALL: &[&str] = &[
    "insert",
    "insert_all",
    "drain",
    "five_step",
    "signal_latency",
    "wait_latency",
    "wake_latency",
    "fan_out",
    "pick_1m",
];

/// Scenarios run only when named: the drain under flow control (to compare with
/// `drain` in the same run), and the settings sweep.
const EXTRA: &[&str] = &["drain_gated", "drain_rate_limited", "drain_sweep"];

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("gen_durable_bench: FAILED: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), BoxError> {
    fsms::pad_states(args.state_bytes);
    if let Some(k) = args.worker {
        return scenarios::processes::worker(args, k).await;
    }
    let procs = !args.processes.is_empty();
    let scenarios: Vec<String> = if !args.scenarios.is_empty() {
        args.scenarios.clone()
    } else if procs {
        vec!["drain".into(), "five_step".into()]
    } else {
        ALL.iter().map(|s| s.to_string()).collect()
    };
    for s in &scenarios {
        if !ALL.contains(&s.as_str()) && !EXTRA.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s:?} (one of {ALL:?}, {EXTRA:?})").into());
        }
        if procs && !["drain", "five_step", "drain_gated"].contains(&s.as_str()) {
            return Err(
                format!("--processes runs drain, five_step and drain_gated, not {s}").into(),
            );
        }
    }
    if args.processes.contains(&0) {
        return Err("--processes counts start at 1".into());
    }
    let log = StatementLog::new();
    tracing::subscriber::set_global_default(log.clone())?;

    let server = server()?;
    create_database(&server, "gen_durable_bench").await?;
    let direct = server.clone().database("gen_durable_bench");
    let logged = match &args.pooler_url {
        Some(url) => PgConnectOptions::from_str(url)
            .map_err(|e| format!("--pooler-url {url:?}: {e}"))?
            .database("gen_durable_bench"),
        None => direct.clone(),
    };
    let quiet = PgPoolOptions::new()
        .max_connections(10)
        .connect_with(direct.clone().disable_statement_logging())
        .await?;
    gen_durable::migrate_schema(&quiet).await?;
    if let Some(f) = schema_experiment() {
        sqlx::raw_sql(&std::fs::read_to_string(f)?)
            .execute(&quiet)
            .await?;
    }

    let measure = !(args.smoke || args.no_ceiling);
    let secs = args.ceiling_secs;
    let command = format!("bash {} 100 4 {secs}", ceiling_script().display());
    let before = if measure {
        Some(measure_ceiling(&server, secs)?)
    } else {
        None
    };

    let bench = Bench {
        args,
        quiet,
        logged,
        direct,
        log,
    };
    // Lines wait for the second ceiling (measured after the scenarios), so each ratio is
    // to the mean of the ceiling before and after: the machine's load drifts.
    let mut lines: Vec<(String, Report, Option<usize>)> = Vec::new();
    for name in &scenarios {
        if procs {
            scenarios::processes::curve(&bench, name, &mut |r, median_of| {
                if !measure {
                    print_line(name, r, None, median_of);
                }
                lines.push((name.clone(), r.clone(), median_of));
            })
            .await?;
            continue;
        }
        let mut reports = Vec::new();
        for _ in 0..bench.args.runs.max(1) {
            let rs = scenarios::run(&bench, name).await?;
            for r in &rs {
                if !measure {
                    print_line(name, r, None, None);
                }
                lines.push((name.clone(), r.clone(), None));
            }
            if rs.len() == 1 {
                reports.extend(rs);
            }
        }
        if reports.len() > 1 {
            let m = median_report(&reports);
            if !measure {
                print_line(name, &m, None, Some(reports.len()));
            }
            lines.push((name.clone(), m, Some(reports.len())));
        }
    }
    if let Some(before) = before {
        let after = measure_ceiling(&server, secs)?;
        let mean = (before + after) / 2.0;
        println!(
            "{}",
            json!({ "scenario": "ceiling", "command": command, "jobs_per_s": mean,
                    "before": before, "after": after })
        );
        for (name, r, median_of) in &lines {
            print_line(name, r, Some(mean), *median_of);
        }
    }
    Ok(())
}

fn print_line(name: &str, r: &Report, ceiling: Option<f64>, median_of: Option<usize>) {
    let round = |x: f64, d: i32| {
        let f = 10f64.powi(d);
        (x * f).round() / f
    };
    // The common fields first, in a fixed order, then the scenario's own.
    let mut fields: Vec<(String, Value)> = vec![
        ("scenario".into(), json!(name)),
        ("n".into(), json!(r.n)),
        ("secs".into(), json!(round(r.secs, 4))),
        ("per_s".into(), json!(round(r.per_s, 1))),
        ("p50_ms".into(), json!(r.p50_ms.map(|x| round(x, 3)))),
        ("p99_ms".into(), json!(r.p99_ms.map(|x| round(x, 3)))),
        (
            "statements_per_step".into(),
            json!(r.statements_per_step.map(|x| round(x, 4))),
        ),
        ("ceiling_per_s".into(), json!(ceiling)),
        (
            "ratio".into(),
            json!(ceiling.filter(|c| *c > 0.0).map(|c| round(r.per_s / c, 3))),
        ),
    ];
    if let Some(k) = median_of {
        fields.push(("median_of".into(), json!(k)));
    }
    fields.extend(r.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), v))
        .collect();
    println!("{{{}}}", body.join(","));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The run of median rate, with the medians of the latencies.
fn median_report(rs: &[Report]) -> Report {
    let mut by_rate: Vec<&Report> = rs.iter().collect();
    by_rate.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
    let mut m = by_rate[by_rate.len() / 2].clone();
    let lat = |f: fn(&Report) -> Option<f64>| {
        let v: Vec<f64> = rs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    m.p50_ms = lat(|r| r.p50_ms);
    m.p99_ms = lat(|r| r.p99_ms);
    m.extra.insert(
        "runs_per_s".into(),
        json!(rs.iter().map(|r| r.per_s.round()).collect::<Vec<_>>()),
    );
    m
}

/// The server of `DATABASE_URL` (default: `postgres://postgres@127.0.0.1:5432/postgres`).
fn server() -> Result<PgConnectOptions, BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    Ok(PgConnectOptions::from_str(&url)?)
}

async fn create_database(server: &PgConnectOptions, name: &str) -> Result<(), BoxError> {
    let mut admin = server
        .clone()
        .disable_statement_logging()
        .connect()
        .await
        .map_err(|e| {
            format!(
                "cannot reach PostgreSQL at {}:{} ({e}); start it or set DATABASE_URL",
                server.get_host(),
                server.get_port()
            )
        })?;
    // Afresh every run: a schema migrated by another checkout (a migration edited since)
    // would refuse to migrate, and old rows would skew the first scenario.
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    Ok(())
}

/// `$GD_CEILING`, else `../shared/bench/pg-ceiling.sh` from the workspace root.
fn ceiling_script() -> PathBuf {
    if let Ok(p) = std::env::var("GD_CEILING") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/bench/pg-ceiling.sh")
}

/// Runs `pg-ceiling.sh 100 4 SECS` against the same server and parses `jobs_per_s=N`.
fn measure_ceiling(server: &PgConnectOptions, secs: u32) -> Result<f64, BoxError> {
    let script = ceiling_script();
    if !script.exists() {
        return Err(format!(
            "the ceiling script {} is missing: set GD_CEILING, or pass --no-ceiling",
            script.display()
        )
        .into());
    }
    let mut cmd = Command::new("bash");
    cmd.arg(&script).args(["100", "4", &secs.to_string()]);
    // The script talks to the same server as the engine does.
    if std::env::var_os("PGHOST").is_none() {
        cmd.env("PGHOST", server.get_host());
    }
    if std::env::var_os("PGPORT").is_none() {
        cmd.env("PGPORT", server.get_port().to_string());
    }
    if std::env::var_os("PGUSER").is_none() {
        cmd.env("PGUSER", server.get_username());
    }
    eprintln!(
        "measuring the ceiling: bash {} 100 4 {secs}",
        script.display()
    );
    let out = cmd.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the ceiling script failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let n = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("jobs_per_s="))
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no jobs_per_s= in the ceiling's output: {stdout:?}"))?;
    Ok(n)
}

/// The SQL file of `GD_SCHEMA_EXPERIMENT`, if set (see the crate's doc).
pub(crate) fn schema_experiment() -> Option<String> {
    std::env::var("GD_SCHEMA_EXPERIMENT").ok()
}
