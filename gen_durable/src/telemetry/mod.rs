//! Telemetry: each event is a `tracing` event with target
//! `gen_durable::<group>`, and a typed [`Event`] delivered to the handlers registered
//! with `EngineBuilder::on_event` (and `Client::on_event`, for the client's events).
//!
//! | event | fields |
//! |---|---|
//! | `step.stop` | `duration`; `id, fsm, step, kind` (the committed outcome, also when `handle` produced it) |
//! | `pick.stop` | `count, demand`; `queue, worker` |
//! | `commit.stop` | `duration, count, committed`: one group commit — outcomes sent, outcomes written (the others had lost their lease) |
//! | `scheduler.saturation` | `in_flight, buffer, concurrency, prefetch`; `queue` |
//! | `scheduler.drain` | `released, in_flight`; `queue` |
//! | `partition.contended` | `count`; `id, fsm, partition_key` (rows of a busy key handed back by a pick, or a claim retried after losing a race on a key; rows the pick skips because their key is executing elsewhere are not counted) |
//! | `concurrency.throttled` | `wanted, admitted`; `gate, key, queue`: a pick found more rows of a gate key than the key had free slots and handed the rest back untouched (no attempt counted); rows of a key already full are skipped by the pick and not counted |
//! | `concurrency.handoff` | `count`; `queue`: rows a group commit claimed into the gate slots it freed (each the next runnable row of its key), handed to this queue's picker |
//! | `rate_limit.throttled` | `wanted, admitted`; `limit, key, queue`: a pick found rows of a rate-limit key whose tokens were not there yet and deferred them (each reserved its tokens and runs when they are due; no attempt counted) |
//! | `reaper.reaped` | `count`; `ids` |
//! | `lease.heartbeat` | `held, extended`; `cancelled` (ids): one heartbeat of a node holding leases |
//! | `await.timed_out` | `count`: parked rows past their deadline, made runnable by one sweep |
//! | `collector.deleted` | `count, buckets`: finished rows older than the retention, and rate-limit buckets full again, deleted by one pass |
//! | `listener.connected` | `reconnect`: the wake-up listener is (again) on LISTEN |
//! | `wait.stop` | `duration`; `id, outcome` (`done`, `failed`, `parked`, `busy`, `gone` or `error`): one `Client::wait`, emitted to the client's handlers (`Client::on_event`) |
//! | `lease.lost` | `id, fsm, step, kind`: an outcome that was not committed because the lease had moved on |

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::model::step::OutcomeKind;

/// A telemetry event.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A step's outcome was committed.
    StepStop {
        /// Handler run time (including `handle`), not commit time.
        duration: Duration,
        /// Instance id.
        id: i64,
        /// FSM name.
        fsm: &'static str,
        /// The step that ran.
        step: String,
        /// What the step decided.
        kind: OutcomeKind,
    },
    /// A pick ran.
    PickStop {
        /// Rows claimed.
        count: usize,
        /// Rows asked for.
        demand: usize,
        /// Queue.
        queue: String,
        /// This node's id.
        worker: String,
    },
    /// A group commit ran: one statement (three with children) for many outcomes.
    CommitStop {
        /// From sending the batch to its commit.
        duration: Duration,
        /// Outcomes in the batch.
        count: usize,
        /// Of those, outcomes written; the others had lost their lease.
        committed: usize,
    },
    /// Per-poll gauge of a queue.
    SchedulerSaturation {
        /// Steps running.
        in_flight: usize,
        /// Claimed rows waiting for a slot.
        buffer: usize,
        /// Configured concurrency.
        concurrency: usize,
        /// Configured prefetch.
        prefetch: usize,
        /// Queue.
        queue: String,
    },
    /// A queue drained on shutdown.
    SchedulerDrain {
        /// Buffered rows released at once.
        released: usize,
        /// Steps running when the drain began.
        in_flight: usize,
        /// Queue.
        queue: String,
    },
    /// Rows were handed back because their partition was busy: rows of one key in the
    /// same pick (`id`, `fsm` name the first one), or a claim that lost a race with
    /// another node on that key (`id` 0, `fsm` "": the claim was retried whole).
    PartitionContended {
        /// How many rows.
        count: usize,
        /// The first of them (0 when another node won the race).
        id: i64,
        /// Its FSM ("" when another node won the race).
        fsm: String,
        /// The partition key.
        partition_key: String,
    },
    /// A pick claimed fewer rows of a gate key than it found (`wanted`), for want of
    /// free slots; the others were handed back untouched.
    GateThrottled {
        /// Rows of the key in the pick.
        wanted: usize,
        /// Rows of the key claimed.
        admitted: usize,
        /// The gate.
        gate: String,
        /// The key within it.
        key: String,
        /// The queue picked.
        queue: String,
    },
    /// A group commit claimed rows into the gate slots it freed (each the next runnable
    /// row of the same key) and handed them to this queue's picker.
    GateHandoff {
        /// Rows handed to the picker.
        count: usize,
        /// The queue.
        queue: String,
    },
    /// A pick deferred rows of a rate-limit key until their reserved tokens are due.
    RateLimitThrottled {
        /// Rows of the key in the pick that needed tokens.
        wanted: usize,
        /// Of those, rows that had them and run now.
        admitted: usize,
        /// The rate limit.
        limit: String,
        /// The key within it.
        key: String,
        /// The queue picked.
        queue: String,
    },
    /// A run-ahead chain went on: the `next` from step `from` committed and step `to`
    /// runs at once in the same worker, under the same claim.
    RunAheadContinue {
        /// Instance id.
        id: i64,
        /// FSM name.
        fsm: &'static str,
        /// The step that returned `next`.
        from: String,
        /// The step that runs next.
        to: &'static str,
    },
    /// A run-ahead `next` went back to the picker instead: step `to` needs a claim
    /// (a new concurrency key or tokens) or the transition said `.no_run_ahead()`.
    RunAheadYield {
        /// Instance id.
        id: i64,
        /// FSM name.
        fsm: &'static str,
        /// The step that returned `next`.
        step: String,
        /// The step the picker will run.
        to: &'static str,
        /// Why.
        reason: crate::YieldReason,
    },
    /// The reaper took back expired leases.
    ReaperReaped {
        /// How many.
        count: usize,
        /// Which.
        ids: Vec<i64>,
    },
    /// A step finished but its lease had been lost: its outcome changed nothing.
    LeaseLost {
        /// Instance id.
        id: i64,
        /// FSM name.
        fsm: &'static str,
        /// The step that ran.
        step: String,
        /// The outcome that was not committed.
        kind: OutcomeKind,
    },
    /// `lease.heartbeat`: one heartbeat of a node holding leases.
    LeasesExtended {
        /// Leases held when it began.
        held: usize,
        /// Of those, leases extended (the others finished, were reaped, or were locked by
        /// another transaction: extended at the next beat).
        extended: usize,
        /// Instances whose cancellation it saw; their steps' `ctx.cancelled()` resolved.
        cancelled: Vec<i64>,
    },
    /// `await.timed_out`: parked rows past their deadline, made runnable by one sweep.
    AwaitTimedOut {
        /// Rows woken.
        count: usize,
    },
    /// `collector.deleted`: finished rows older than the retention, deleted by one pass.
    CollectorDeleted {
        /// Rows deleted.
        count: usize,
        /// Rate-limit buckets deleted because they were full again (idle).
        buckets: usize,
    },
    /// `listener.connected`: the wake-up listener is on LISTEN.
    ListenerConnected {
        /// It had been connected before (notifications may have been missed: every
        /// queue is woken).
        reconnect: bool,
    },
    /// `schedule.fired`: a schedule's fire time inserted its instance.
    ScheduleFired {
        /// The schedule's name.
        schedule: String,
        /// The fire time.
        fire_time: chrono::DateTime<chrono::Utc>,
        /// The instance; `None` if its key was already held (inserted before).
        id: Option<i64>,
    },
    /// `schedule.skipped`: fire times a schedule handled without an instance — left out
    /// by its catch-up policy, or whose entry could not be built (`reason` says which).
    ScheduleSkipped {
        /// The schedule's name.
        schedule: String,
        /// Fire times skipped.
        count: usize,
        /// Why.
        reason: String,
    },
    /// `migration.applied`: a node moved a claimed row to a later FSM version before
    /// running its step (written fenced by the claim).
    InstanceMigrated {
        /// Instance id.
        id: i64,
        /// FSM name.
        fsm: &'static str,
        /// The version it was at.
        from: i32,
        /// The version it is at now.
        to: i32,
    },
    /// `migration.failed`: a claimed row's migration failed (the transform returned an
    /// error or panicked); the row stays on `from`, its step replays after a backoff, and
    /// `error` is its `last_error`.
    MigrationFailed {
        /// Instance id.
        id: i64,
        /// FSM name.
        fsm: &'static str,
        /// The version it stays at.
        from: i32,
        /// The version it was to move to.
        to: i32,
        /// Why.
        error: String,
    },
    /// `wait.stop`: a `Client::wait` returned.
    WaitStop {
        /// How long it waited.
        duration: Duration,
        /// The instance it waited on, once resolved (`None` for a key no row had).
        id: Option<i64>,
        /// `done`, `failed`, `parked`, `busy`, `gone`, or `error`.
        outcome: &'static str,
    },
}

/// A registered event handler.
pub type EventHandler = Arc<dyn Fn(&Event) + Send + Sync>;

#[derive(Clone, Default)]
pub(crate) struct Telemetry {
    handlers: Vec<EventHandler>,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("handlers", &self.handlers.len())
            .finish()
    }
}

impl Telemetry {
    pub(crate) fn add(&mut self, h: EventHandler) {
        self.handlers.push(h);
    }

    pub(crate) fn emit(&self, event: Event) {
        match &event {
            Event::StepStop {
                duration,
                id,
                fsm,
                step,
                kind,
            } => tracing::debug!(
                target: "gen_durable::step", duration_us = duration.as_micros() as u64, id, fsm, step, kind = kind.as_str(), "step.stop"),
            Event::PickStop {
                count,
                demand,
                queue,
                worker,
            } => tracing::trace!(
                target: "gen_durable::pick", count, demand, queue, worker, "pick.stop"),
            Event::CommitStop {
                duration,
                count,
                committed,
            } => tracing::trace!(
                target: "gen_durable::commit", duration_us = duration.as_micros() as u64, count, committed, "commit.stop"),
            Event::SchedulerSaturation {
                in_flight,
                buffer,
                concurrency,
                prefetch,
                queue,
            } => tracing::trace!(
                target: "gen_durable::scheduler", in_flight, buffer, concurrency, prefetch, queue, "scheduler.saturation"),
            Event::SchedulerDrain {
                released,
                in_flight,
                queue,
            } => tracing::info!(
                target: "gen_durable::scheduler", released, in_flight, queue, "scheduler.drain"),
            Event::PartitionContended {
                count,
                id,
                fsm,
                partition_key,
            } => tracing::debug!(
                target: "gen_durable::partition", count, id, fsm, partition_key, "partition.contended"),
            Event::GateThrottled {
                wanted,
                admitted,
                gate,
                key,
                queue,
            } => tracing::debug!(
                target: "gen_durable::concurrency", wanted, admitted, gate, key, queue,
                "concurrency.throttled"),
            Event::GateHandoff { count, queue } => tracing::trace!(
                target: "gen_durable::concurrency", count, queue, "concurrency.handoff"),
            Event::RateLimitThrottled {
                wanted,
                admitted,
                limit,
                key,
                queue,
            } => tracing::debug!(
                target: "gen_durable::rate_limit", wanted, admitted, limit, key, queue,
                "rate_limit.throttled"),
            Event::RunAheadContinue { id, fsm, from, to } => tracing::trace!(
                target: "gen_durable::run_ahead", id, fsm, from, to, "run_ahead.continue"),
            Event::RunAheadYield {
                id,
                fsm,
                step,
                to,
                reason,
            } => tracing::debug!(
                target: "gen_durable::run_ahead", id, fsm, step, to, reason = reason.as_str(),
                "run_ahead.yield"),
            Event::ReaperReaped { count, ids } => tracing::warn!(
                target: "gen_durable::reaper", count, ids = ?ids, "reaper.reaped"),
            Event::LeaseLost {
                id,
                fsm,
                step,
                kind,
            } => tracing::warn!(
                target: "gen_durable::lease", id, fsm, step, kind = kind.as_str(), "lease.lost: outcome not committed"),
            Event::LeasesExtended {
                held,
                extended,
                cancelled,
            } => tracing::trace!(
                target: "gen_durable::lease", held, extended, cancelled = ?cancelled, "lease.heartbeat"),
            Event::AwaitTimedOut { count } => tracing::debug!(
                target: "gen_durable::timeouts", count, "await.timed_out"),
            Event::CollectorDeleted { count, buckets } => tracing::debug!(
                target: "gen_durable::collector", count, buckets, "collector.deleted"),
            Event::ScheduleFired {
                schedule,
                fire_time,
                id,
            } => tracing::info!(
                target: "gen_durable::scheduler", schedule, %fire_time, id = ?id, "schedule.fired"),
            Event::ScheduleSkipped {
                schedule,
                count,
                reason,
            } => tracing::warn!(
                target: "gen_durable::scheduler", schedule, count, reason, "schedule.skipped"),
            Event::InstanceMigrated { id, fsm, from, to } => tracing::info!(
                target: "gen_durable::migration", id, fsm, from, to, "migration.applied"),
            Event::MigrationFailed {
                id,
                fsm,
                from,
                to,
                error,
            } => tracing::warn!(
                target: "gen_durable::migration", id, fsm, from, to, error, "migration.failed"),
            Event::ListenerConnected { reconnect } => tracing::debug!(
                target: "gen_durable::listener", reconnect, "listener.connected"),
            Event::WaitStop {
                duration,
                id,
                outcome,
            } => tracing::debug!(
                target: "gen_durable::wait", duration_us = duration.as_micros() as u64, id = ?id, outcome, "wait.stop"),
        }
        for h in &self.handlers {
            h(&event);
        }
    }
}
