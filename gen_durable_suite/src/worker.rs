//! A worker process for the reliability suite and the soak: runs the [`crate::fsms`]
//! on one queue until SIGTERM (graceful drain) or SIGKILL (a crash).
//!
//! `gd_worker --database-url URL [--concurrency N] [--lease-ttl-ms MS] [--reaper-ms MS]
//! [--drain-ms MS] [--node NAME]`; `FAILPOINTS="gd::after_commit=return"` sets
//! failpoints (see the `fail` crate). Prints `ready NODE` once running, and
//! `drained released=R in_flight=F` after a SIGTERM drain.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use gen_durable::{Engine, QueueConfig};
use sqlx::postgres::PgPoolOptions;

/// Parsed `--key value` arguments.
#[derive(Debug, Default)]
pub struct Args(HashMap<String, String>);

impl Args {
    /// Parses `--key value` pairs.
    pub fn parse(args: impl Iterator<Item = String>) -> Args {
        let mut map = HashMap::new();
        let mut it = args.peekable();
        while let Some(a) = it.next() {
            if let Some(k) = a.strip_prefix("--") {
                let v = it
                    .next_if(|n| !n.starts_with("--"))
                    .unwrap_or_else(|| "true".into());
                map.insert(k.to_string(), v);
            }
        }
        Args(map)
    }

    /// A string argument.
    pub fn str(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// A numeric argument with a default.
    pub fn num(&self, k: &str, default: u64) -> u64 {
        self.str(k).and_then(|v| v.parse().ok()).unwrap_or(default)
    }
}

/// Runs the worker; returns when drained.
pub async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let _failpoints = fail::FailScenario::setup();
    let url = args
        .str("database-url")
        .map(str::to_string)
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .ok_or("--database-url or DATABASE_URL is required")?;
    let node = args
        .str("node")
        .map(str::to_string)
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    std::env::set_var("GD_NODE", &node);
    // The application name lets tests find this worker's backends.
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(args.num("pool", 8) as u32)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options.application_name(&node))
        .await?;
    let engine = Engine::builder(pool)
        .with_node_id(node.clone())
        .queue_with(
            "audited",
            QueueConfig::new(args.num("concurrency", 8) as usize)
                .with_prefetch(args.num("prefetch", 0) as usize)
                .with_poll_interval(Duration::from_millis(args.num("poll-ms", 100))),
        )
        .with_lease_ttl(Duration::from_millis(args.num("lease-ttl-ms", 2000)))
        .with_reaper_interval(Duration::from_millis(args.num("reaper-ms", 200)))
        .on_event(|e| {
            if let gen_durable::Event::LeaseLost { id, step, kind, .. } = e {
                println!("lease.lost id={id} step={step} kind={kind}");
                let _ = std::io::stdout().flush();
            }
        })
        .start()
        .await?;
    println!("ready {node}");
    // The process's own wall clock, for tests that skew it: the engine never uses it.
    println!("clock {}", chrono::Utc::now().to_rfc3339());
    std::io::stdout().flush()?;

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let report = engine
        .shutdown(Duration::from_millis(args.num("drain-ms", 5000)))
        .await;
    println!(
        "drained released={} in_flight={}",
        report.released(),
        report.in_flight()
    );
    std::io::stdout().flush()?;
    Ok(())
}
