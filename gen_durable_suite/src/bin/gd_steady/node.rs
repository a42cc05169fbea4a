//! The node under test: the engine (its events feeding the tally and the signaller),
//! the client, the signaller, and the vacuum stand-in; their start, header and shutdown.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::{Event, OutcomeKind, QueueConfig};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::tally::Shared;
use crate::vacuum::vacuum_loop;

/// The running node, and the client the producer and the signaller share.
pub(crate) struct Node {
    engine: Engine,
    pool: PgPool,
    client_pool: PgPool,
    pub(crate) gd: Client,
    signaller: JoinHandle<()>,
    vacuum: Option<JoinHandle<()>>,
    /// The vacuum stand-in's run times, s.
    pub(crate) vacuum_runs: Arc<Mutex<Vec<f64>>>,
}

impl Node {
    /// Starts the engine, the client, the signaller and (`vacuum_secs` > 0) the vacuum
    /// stand-in on the database `opts`.
    pub(crate) async fn start(
        cfg: &Config,
        opts: &PgConnectOptions,
        shared: &Arc<Shared>,
        vacuum_secs: u64,
    ) -> Result<Node, Box<dyn std::error::Error>> {
        // The node: one engine whose events feed the signaller and the latency tally.
        let (parked_tx, mut parked_rx) = mpsc::unbounded_channel::<i64>();
        let pool = PgPoolOptions::new()
            .max_connections(cfg.engine_pool)
            .connect_with(opts.clone().application_name("gd_steady-engine"))
            .await?;
        let on_event = {
            let shared = shared.clone();
            move |e: &Event| match e {
                Event::StepStop { id, kind, .. } => match kind {
                    OutcomeKind::Await => {
                        let _ = parked_tx.send(*id);
                    }
                    OutcomeKind::Done => shared.finished(*id, false, Instant::now()),
                    OutcomeKind::Stop => shared.finished(*id, true, Instant::now()),
                    _ => {}
                },
                Event::CollectorDeleted { count, .. } => {
                    shared.collected.fetch_add(*count as u64, Ordering::Relaxed);
                }
                _ => {}
            }
        };
        let engine = Engine::builder(pool.clone())
            .with_node_id("gd_steady")
            .queue_with(
                "steady",
                QueueConfig::new(cfg.concurrency).with_prefetch(cfg.prefetch),
            )
            .with_retention(Duration::from_secs(cfg.retention))
            .with_collector_schedule(Duration::from_secs(cfg.collector_secs), 1000)
            .on_event(on_event)
            .start()
            .await?;

        let client_pool = PgPoolOptions::new()
            .max_connections(cfg.client_pool)
            .connect_with(opts.clone().application_name("gd_steady-client"))
            .await?;
        let gd = Client::new(client_pool.clone());

        // The signaller: `go` to every instance whose await committed.
        let signaller = {
            let (gd, shared) = (gd.clone(), shared.clone());
            let signal_concurrency = cfg.signal_concurrency;
            tokio::spawn(async move {
                let permits = Arc::new(Semaphore::new(signal_concurrency));
                while let Some(id) = parked_rx.recv().await {
                    let permit = permits.clone().acquire_owned().await.expect("permits");
                    let (gd, shared) = (gd.clone(), shared.clone());
                    tokio::spawn(async move {
                        if let Err(e) = gd.signal(id, "go", json!({})).await {
                            eprintln!("steady: signal to {id} failed: {e}");
                            shared.signal_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(permit);
                    });
                }
            })
        };

        let vacuum_runs = Arc::new(Mutex::new(Vec::new()));
        let vacuum = (vacuum_secs > 0).then(|| {
            let (opts, runs) = (opts.clone(), vacuum_runs.clone());
            tokio::spawn(async move {
                if let Err(e) = vacuum_loop(opts, Duration::from_secs(vacuum_secs), runs).await {
                    eprintln!("steady: the vacuum stand-in failed: {e}");
                }
            })
        });

        Ok(Node {
            engine,
            pool,
            client_pool,
            gd,
            signaller,
            vacuum,
            vacuum_runs,
        })
    }

    /// The run's first line: its mode and settings.
    pub(crate) fn print_header(&self, cfg: &Config, autovacuum: &str, vacuum_secs: u64) {
        let Config {
            probe,
            rate,
            seconds,
            window_secs,
            report_secs,
            concurrency,
            prefetch,
            engine_pool,
            signal_concurrency,
            retention,
            collector_secs,
            probe_inflight,
            ..
        } = *cfg;
        println!(
            "steady: {} rate={} s={seconds} window={window_secs}s report={report_secs}s \
             concurrency={concurrency} prefetch={prefetch} pool={engine_pool}+{} signal_concurrency={signal_concurrency} \
             retention={retention}s collector every {collector_secs}s; server autovacuum={autovacuum}; vacuum stand-in: {}",
            if probe { "capacity probe (closed loop)" } else { "steady state" },
            if probe { format!("closed loop of {probe_inflight}") } else { format!("{rate}/s") },
            self.client_pool.options().get_max_connections(),
            if vacuum_secs > 0 { format!("every {vacuum_secs}s") } else { "none".into() },
        );
    }

    /// Stops the engine (a graceful drain), the signaller and the vacuum stand-in, and
    /// closes the pools.
    pub(crate) async fn shutdown(self) {
        self.engine.shutdown(Duration::from_secs(10)).await;
        self.signaller.abort();
        if let Some(v) = self.vacuum {
            v.abort();
        }
        self.gd.flush().await;
        self.pool.close().await;
        self.client_pool.close().await;
    }
}
