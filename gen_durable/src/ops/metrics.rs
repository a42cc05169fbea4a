//! Metrics (feature `metrics`): every telemetry [`Event`] recorded through the `metrics`
//! facade, queue gauges read from the database, and a Prometheus recorder to render them.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> gen_durable::Result<()> {
//! let prometheus = gen_durable::metrics::install_prometheus()?;
//! let engine = gen_durable::Engine::builder(pool.clone())
//!     .queue("default", 16)
//!     .on_event(gen_durable::metrics::record)
//!     .start()
//!     .await?;
//! // On each scrape (your HTTP handler, or the dashboard's `/metrics`):
//! gen_durable::metrics::observe_queues(&pool).await?;
//! let text = prometheus.render();
//! # Ok(()) }
//! ```
//!
//! What is exported (names as Prometheus shows them):
//! - `gen_durable_step_duration_seconds{fsm,step,kind}` (histogram) and
//!   `gen_durable_steps_total{fsm,kind}`: each committed step, by outcome kind;
//! - `gen_durable_picks_total{queue}`, `gen_durable_picked_rows_total{queue}`,
//!   `gen_durable_handed_off_rows_total{queue}` (rows claimed by a commit into the gate
//!   slots it freed);
//! - `gen_durable_commits_total`, `gen_durable_committed_outcomes_total`,
//!   `gen_durable_commit_duration_seconds` (histogram): group commits;
//! - `gen_durable_saturation{queue}` (steps running / concurrency) and
//!   `gen_durable_buffered{queue}` (claimed rows waiting for a slot);
//! - `gen_durable_reaped_total`, `gen_durable_lease_lost_total{fsm}`,
//!   `gen_durable_await_timed_out_total`, `gen_durable_collected_total`,
//!   `gen_durable_partition_contended_total`, `gen_durable_migrations_total{fsm,result}`,
//!   `gen_durable_schedule_fired_total{schedule}`, `gen_durable_schedule_skipped_total{schedule}`;
//! - from [`observe_queues`]: `gen_durable_queue_depth{queue,status}` for every status
//!   (`runnable`, `executing`, `awaiting_signal`, `awaiting_children`, `done`, `failed`)
//!   and `ready` (runnable and due now), and `gen_durable_queue_lag_seconds{queue}` (age of
//!   the oldest due runnable row). A scrape reads at a bounded cost, never the whole table:
//!   runnable, ready and executing rows are counted through the pick and lease indexes,
//!   exactly up to [`QUEUE_COUNT_CAP`] (past it, the larger of the cap and the sample's
//!   estimate); parked and finished rows, which no index gives by queue, come from a
//!   sample of about 128 pages of the table — exact while the table is that small (about
//!   4,000 rows), an estimate scaled from the sample past it, so a small queue's count
//!   may read 0. `gen_durable_queue_depth_sample_ratio` is the share of the table the
//!   sample read (1: every figure is exact). The lag is always exact (the first entry of
//!   the pick index). Rates of finished steps are exact in `gen_durable_steps_total`.

use std::time::Duration;

use metrics::{counter, gauge, histogram};
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqlx::PgPool;

use crate::model::error::{Error, Result};
use crate::telemetry::Event;

/// Histogram buckets (seconds) of the step and commit durations: 100 µs to 60 s.
pub const DURATION_BUCKETS: &[f64] = &[
    0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
];

/// Installs a Prometheus recorder as this process's `metrics` recorder and returns the
/// handle whose `render()` is the text exposition. Once per process: a second call, or a
/// process that installed another recorder, gets [`Error::InvalidConfig`].
pub fn install_prometheus() -> Result<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
        .map_err(|e| Error::InvalidConfig(format!("prometheus buckets: {e}")))?
        .install_recorder()
        .map_err(|e| Error::InvalidConfig(format!("cannot install the Prometheus recorder: {e}")))
}

fn secs(d: &Duration) -> f64 {
    d.as_secs_f64()
}

/// Records one telemetry event as metrics through the `metrics` facade (whatever recorder
/// is installed). Pass it to `EngineBuilder::on_event`.
pub fn record(event: &Event) {
    match event {
        Event::StepStop {
            duration,
            fsm,
            step,
            kind,
            ..
        } => {
            let (fsm, kind) = (*fsm, kind.as_str());
            histogram!("gen_durable_step_duration_seconds", "fsm" => fsm, "step" => step.clone(), "kind" => kind)
                .record(secs(duration));
            counter!("gen_durable_steps_total", "fsm" => fsm, "kind" => kind).increment(1);
        }
        Event::PickStop { count, queue, .. } => {
            counter!("gen_durable_picks_total", "queue" => queue.clone()).increment(1);
            counter!("gen_durable_picked_rows_total", "queue" => queue.clone())
                .increment(*count as u64);
        }
        Event::GateHandoff { count, queue } => {
            counter!("gen_durable_handed_off_rows_total", "queue" => queue.clone())
                .increment(*count as u64);
        }
        Event::CommitStop {
            duration,
            committed,
            ..
        } => {
            counter!("gen_durable_commits_total").increment(1);
            counter!("gen_durable_committed_outcomes_total").increment(*committed as u64);
            histogram!("gen_durable_commit_duration_seconds").record(secs(duration));
        }
        Event::SchedulerSaturation {
            in_flight,
            buffer,
            concurrency,
            queue,
            ..
        } => {
            let used = *in_flight as f64 / (*concurrency).max(1) as f64;
            gauge!("gen_durable_saturation", "queue" => queue.clone()).set(used);
            gauge!("gen_durable_buffered", "queue" => queue.clone()).set(*buffer as f64);
        }
        Event::ReaperReaped { count, .. } => {
            counter!("gen_durable_reaped_total").increment(*count as u64);
        }
        Event::LeaseLost { fsm, .. } => {
            counter!("gen_durable_lease_lost_total", "fsm" => *fsm).increment(1);
        }
        Event::AwaitTimedOut { count } => {
            counter!("gen_durable_await_timed_out_total").increment(*count as u64);
        }
        Event::CollectorDeleted { count, .. } => {
            counter!("gen_durable_collected_total").increment(*count as u64);
        }
        Event::PartitionContended { count, .. } => {
            counter!("gen_durable_partition_contended_total").increment(*count as u64);
        }
        Event::GateThrottled {
            wanted,
            admitted,
            gate,
            ..
        } => {
            counter!("gen_durable_gate_throttled_total", "gate" => gate.clone())
                .increment(wanted.saturating_sub(*admitted) as u64);
        }
        Event::RateLimitThrottled {
            wanted,
            admitted,
            limit,
            ..
        } => {
            counter!("gen_durable_rate_limit_deferred_total", "limit" => limit.clone())
                .increment(wanted.saturating_sub(*admitted) as u64);
        }
        Event::RunAheadContinue { fsm, .. } => {
            counter!("gen_durable_run_ahead_continue_total", "fsm" => *fsm).increment(1);
        }
        Event::RunAheadYield { fsm, reason, .. } => {
            counter!("gen_durable_run_ahead_yield_total", "fsm" => *fsm, "reason" => reason.as_str())
                .increment(1);
        }
        Event::InstanceMigrated { fsm, .. } => {
            counter!("gen_durable_migrations_total", "fsm" => *fsm, "result" => "applied")
                .increment(1);
        }
        Event::MigrationFailed { fsm, .. } => {
            counter!("gen_durable_migrations_total", "fsm" => *fsm, "result" => "failed")
                .increment(1);
        }
        Event::ScheduleFired { schedule, .. } => {
            counter!("gen_durable_schedule_fired_total", "schedule" => schedule.clone())
                .increment(1);
        }
        Event::ScheduleSkipped {
            schedule, count, ..
        } => {
            counter!("gen_durable_schedule_skipped_total", "schedule" => schedule.clone())
                .increment(*count as u64);
        }
        Event::SchedulerDrain { .. }
        | Event::LeasesExtended { .. }
        | Event::ListenerConnected { .. }
        | Event::WaitStop { .. } => {}
    }
}

/// Where exact counting stops for the queue gauges: at most this many index entries per
/// queue and priority (runnable, ready) and executing rows in all.
pub const QUEUE_COUNT_CAP: i64 = 1_000;

/// Sets the queue gauges from the database (see the module's list): a few statements of
/// bounded cost (`store::pg::counts`). Call it on each scrape.
pub async fn observe_queues(pool: &PgPool) -> Result<()> {
    let counts = crate::ops::counts::queue_counts(pool, None, QUEUE_COUNT_CAP, &[]).await?;
    for q in counts.queues {
        let queue = q.queue;
        for (status, figure) in &q.by_status {
            gauge!("gen_durable_queue_depth", "queue" => queue.clone(), "status" => status.as_str())
                .set(figure.value() as f64);
        }
        gauge!("gen_durable_queue_depth", "queue" => queue.clone(), "status" => "ready")
            .set(q.ready.value() as f64);
        let lag = q.oldest_ready.map_or(0.0, |t| {
            (counts.now - t).num_milliseconds().max(0) as f64 / 1000.0
        });
        gauge!("gen_durable_queue_lag_seconds", "queue" => queue).set(lag);
    }
    gauge!("gen_durable_queue_depth_sample_ratio").set(counts.sample_percent / 100.0);
    Ok(())
}
