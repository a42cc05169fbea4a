//! The producer: an open loop at `--rate`, or (capacity probe) a closed loop keeping
//! `--probe-inflight` instances in flight; one `insert_all` per 10 ms tick.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gen_durable::{Client, Entry};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::fsm::Steady;
use crate::tally::Shared;

/// Spawns the producer; it inserts until `stop` is set.
pub(crate) fn spawn(
    cfg: &Config,
    gd: Client,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let (probe, rate, probe_inflight) = (cfg.probe, cfg.rate, cfg.probe_inflight);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let n = if probe {
                let open = shared.tally().open.len();
                probe_inflight.saturating_sub(open).min(200) as u64
            } else {
                let due = (rate as f64 * shared.t0.elapsed().as_secs_f64()) as u64;
                due.saturating_sub(sent).min(5000)
            };
            if n == 0 {
                continue;
            }
            let start = Instant::now();
            match gd
                .insert_all::<Steady>((0..n).map(|_| Entry::new(())))
                .await
            {
                Ok(ids) => {
                    shared.inserted(&ids, start);
                    sent += n;
                }
                Err(e) => {
                    eprintln!("steady: insert of {n} failed: {e}");
                    shared.insert_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
}
