//! The tracker: follows steps and commits through the engine's telemetry; starts the engine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::{Event, OutcomeKind, QueueConfig};
use serde_json::{Map, Value};
use sqlx::PgPool;
use tokio::sync::Notify;

use super::done_ids::DoneIds;
use super::latencies::Latencies;
use super::{percentile, EngineCfg, R};
use crate::fsms::PROBE;

/// Follows committed outcomes through the engine's telemetry.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    target_done: AtomicU64,
    pub(super) done: AtomicU64,
    pub(super) steps: AtomicU64,
    pub(super) lost: AtomicU64,
    pub(super) commits: AtomicU64,
    pub(super) committed: AtomicU64,
    pub(super) commit_ms: Mutex<Vec<f64>>,
    /// Sums of the queue's in-flight steps and buffered rows over its saturation events.
    pub(super) saturation: Mutex<(u64, u64, u64)>,
    pub(super) last: Mutex<Option<Instant>>,
    pub(super) latencies_ms: Mutex<Latencies>,
    pub(super) done_ids: Mutex<DoneIds>,
    pub(super) first_schedule: Mutex<Option<Instant>>,
    notify: Notify,
}

impl Tracker {
    pub(super) fn new(target_done: u64) -> Arc<Self> {
        let t = Tracker::default();
        t.target_done.store(target_done, Ordering::Relaxed);
        Arc::new(t)
    }

    fn on(&self, e: &Event) {
        match e {
            Event::StepStop { id, kind, .. } => {
                let now = Instant::now();
                self.steps.fetch_add(1, Ordering::Relaxed);
                *self.last.lock().expect("last") = Some(now);
                let start = PROBE
                    .lock()
                    .expect("probe")
                    .as_mut()
                    .and_then(|p| p.starts.remove(id));
                if let Some(s) = start {
                    self.latencies_ms
                        .lock()
                        .expect("lat")
                        .record((now - s).as_secs_f64() * 1e3);
                }
                if *kind == OutcomeKind::ScheduleChildren {
                    self.first_schedule
                        .lock()
                        .expect("sched")
                        .get_or_insert(now);
                }
                if *kind == OutcomeKind::Done {
                    self.done_ids.lock().expect("ids").add(*id, 1);
                    let d = self.done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d >= self.target_done.load(Ordering::Relaxed) {
                        self.notify.notify_one();
                    }
                }
            }
            Event::LeaseLost { .. } => {
                self.lost.fetch_add(1, Ordering::Relaxed);
            }
            Event::SchedulerSaturation {
                in_flight, buffer, ..
            } => {
                let mut g = self.saturation.lock().expect("saturation");
                g.0 += 1;
                g.1 += *in_flight as u64;
                g.2 += *buffer as u64;
            }
            Event::CommitStop {
                committed,
                duration,
                ..
            } => {
                self.commit_ms
                    .lock()
                    .expect("commit_ms")
                    .push(duration.as_secs_f64() * 1e3);
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.committed
                    .fetch_add(*committed as u64, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    pub(super) async fn wait_done(&self, limit: Duration) -> R<()> {
        let deadline = tokio::time::Instant::now() + limit;
        while self.done.load(Ordering::Relaxed) < self.target_done.load(Ordering::Relaxed) {
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                return Err(format!(
                    "timed out after {limit:?}: {} of {} instances done",
                    self.done.load(Ordering::Relaxed),
                    self.target_done.load(Ordering::Relaxed)
                )
                .into());
            }
        }
        Ok(())
    }

    /// Outcomes per group commit, from the engine's `commit.stop` events.
    pub(super) fn commit_stats(&self, extra: &mut Map<String, Value>) {
        let commits = self.commits.load(Ordering::Relaxed);
        if commits > 0 {
            let avg = self.committed.load(Ordering::Relaxed) as f64 / commits as f64;
            extra.insert("commits".into(), json!(commits));
            extra.insert(
                "outcomes_per_commit".into(),
                json!((avg * 10.0).round() / 10.0),
            );
            let (n, f, b) = *self.saturation.lock().expect("saturation");
            if let (Some(f), Some(b)) = (f.checked_div(n), b.checked_div(n)) {
                extra.insert("mean_in_flight".into(), json!(f));
                extra.insert("mean_buffer".into(), json!(b));
            }
            let mut ms = std::mem::take(&mut *self.commit_ms.lock().expect("commit_ms"));
            extra.insert("commit_p50_ms".into(), json!(percentile(&mut ms, 0.5)));
        }
    }

    /// Every id done exactly once, and no lease lost.
    pub(super) fn check_exactly_once(&self, expected: usize) -> R<()> {
        let ids = self.done_ids.lock().expect("ids");
        let twice: Vec<_> = ids.not_once().take(5).collect();
        if ids.len() != expected || !twice.is_empty() {
            return Err(format!(
                "expected {expected} instances done once each; {} done, some more than once: {twice:?}",
                ids.len()
            )
            .into());
        }
        let lost = self.lost.load(Ordering::Relaxed);
        if lost > 0 {
            return Err(format!("{lost} leases lost during the run").into());
        }
        Ok(())
    }
}

pub(super) async fn start_engine(
    pool: &PgPool,
    cfg: &EngineCfg,
    tracker: &Arc<Tracker>,
) -> R<Engine> {
    let t = tracker.clone();
    Ok(Engine::builder(pool.clone())
        .with_pooler(cfg.pooler)
        .with_listener(cfg.listener.clone())
        .queue_with(
            "bench",
            QueueConfig::new(cfg.concurrency)
                .with_prefetch(cfg.prefetch)
                .with_min_demand(cfg.min_demand.clamp(1, cfg.concurrency + cfg.prefetch)),
        )
        .with_commit_batch(cfg.commit_batch)
        .on_event(move |e| t.on(e))
        .start()
        .await?)
}
