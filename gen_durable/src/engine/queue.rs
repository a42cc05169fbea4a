//! One queue on one node: the picker, its local buffer, and the steps it runs
//! (spec §7.2). The runner owns its buffer and in-flight set; nothing is shared but
//! the lease table the heartbeat reads.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::engine::committer::{self, CommitReply, CommitRequest};
use crate::engine::{QueueConfig, Shared};
use crate::error::{Error, Result};
use crate::registry::FsmEntry;
use crate::runtime::{Outcome, StepInput, StepOutput};
use crate::store::pg::outcome::{self, Commit};
use crate::store::pg::{claim, lease, UNIQUE_VIOLATION};
use crate::telemetry::Event;

/// How a queue drained.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueDrain {
    /// The queue.
    pub queue: String,
    /// Buffered rows released to `runnable` at once.
    pub released: usize,
    /// Steps running when the drain began.
    pub in_flight: usize,
    /// Of those, steps still running at the deadline, cancelled and released.
    pub cancelled: usize,
}

pub(crate) struct QueueRunner {
    pub(crate) name: String,
    pub(crate) cfg: QueueConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) wake: Arc<Notify>,
    /// Cancelled when the engine stops picking: running steps then stop running ahead.
    pub(crate) draining: CancellationToken,
    /// The queue's name, shared with its steps.
    pub(crate) queue: Arc<str>,
}

/// A claim in flight, beside the runner's loop: finished steps are collected and their
/// slots refilled from the buffer while it runs. Yields the demand and the rows.
type Claiming<'a> = Pin<Box<dyn Future<Output = (usize, Result<Vec<claim::Claimed>>)> + Send + 'a>>;

struct Running {
    id: i64,
    epoch: i64,
    cancel: CancellationToken,
    /// The row has a partition key, which its end frees.
    partitioned: bool,
}

impl QueueRunner {
    pub(crate) async fn run(
        self,
        stop_picking: CancellationToken,
        deadline: watch::Receiver<Option<Instant>>,
    ) -> QueueDrain {
        let mut buffer: VecDeque<claim::Claimed> = VecDeque::new();
        let mut tasks: JoinSet<Option<Duration>> = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, Running> = HashMap::new();
        let mut poll = self.cfg.poll_interval;
        let mut pick_now = true;
        let mut maybe_more = true;
        let mut wake_at: Option<Instant> = None;
        let mut claiming: Option<Claiming<'_>> = None;
        let this = &self;

        loop {
            self.dispatch(&mut buffer, &mut tasks, &mut running);
            if pick_now && claiming.is_none() && !stop_picking.is_cancelled() {
                pick_now = false;
                let demand = (self.cfg.concurrency + self.cfg.prefetch)
                    .saturating_sub(tasks.len() + buffer.len());
                if demand >= self.cfg.min_demand {
                    claiming = Some(Box::pin(async move { (demand, this.claim(demand).await) }));
                } else {
                    // Not enough free slots to pick now; the queue may well hold more.
                    maybe_more = true;
                }
            }
            self.shared.telemetry.emit(Event::SchedulerSaturation {
                in_flight: tasks.len(),
                buffer: buffer.len(),
                concurrency: self.cfg.concurrency,
                prefetch: self.cfg.prefetch,
                queue: self.name.clone(),
            });
            let next_poll = Instant::now() + poll;
            let sleep_until = wake_at.map_or(next_poll, |w| w.min(next_poll));
            tokio::select! {
                _ = stop_picking.cancelled() => break,
                (demand, got) = async { claiming.as_mut().expect("a claim").await }, if claiming.is_some() => {
                    claiming = None;
                    match got {
                        Ok(rows) => {
                            let count = rows.len();
                            buffer.extend(rows);
                            // A full claim: the queue may hold more, claim again at once.
                            maybe_more = count == demand;
                            pick_now |= maybe_more;
                            poll = if count == 0 {
                                (poll * 2).min(self.cfg.max_poll_interval)
                            } else {
                                self.cfg.poll_interval
                            };
                        }
                        Err(e) => {
                            tracing::warn!(target: "gen_durable::pick", queue = %self.name, error = %e, "pick failed");
                            maybe_more = false;
                            poll = self.cfg.poll_interval;
                        }
                    }
                }
                _ = self.wake.notified() => pick_now = true,
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    // A group commit finishes many steps at once: collect every step that
                    // is done by now, then refill their slots with one claim.
                    tokio::task::yield_now().await;
                    let mut done = Some(done);
                    while let Some(d) = done.take().or_else(|| tasks.try_join_next_with_id()) {
                        let task_id = match d {
                            Ok((tid, replay)) => {
                                if let Some(d) = replay {
                                    let at = Instant::now() + d;
                                    wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                                }
                                tid
                            }
                            Err(e) => e.id(),
                        };
                        // A partition freed: the key's next row can run now, not at the
                        // next poll (a claim hands back all but one row of a key).
                        if running.remove(&task_id).is_some_and(|r| r.partitioned) {
                            pick_now = true;
                        }
                    }
                    pick_now |= maybe_more || !buffer.is_empty();
                }
                _ = tokio::time::sleep_until(sleep_until) => {
                    if wake_at.is_some_and(|w| w <= Instant::now()) {
                        wake_at = None;
                    }
                    pick_now = true;
                }
            }
        }
        // A claim still in flight has taken its rows: buffer them, so the drain releases them.
        if let Some(c) = claiming.take() {
            if let (_, Ok(rows)) = c.await {
                buffer.extend(rows);
            }
        }
        drop(claiming);
        self.drain(buffer, tasks, running, deadline).await
    }

    /// One claim of up to `demand` rows; the rows join this node's lease table.
    async fn claim(&self, demand: usize) -> Result<Vec<claim::Claimed>> {
        let rows = self.claim_rows(demand).await?;
        let count = rows.len();
        // Rows are claimed (leases recorded in the database) but not yet known here.
        if count > 0 {
            fail::fail_point!("gd::after_claim");
        }
        self.shared.telemetry.emit(Event::PickStop {
            count,
            demand,
            queue: self.name.clone(),
            worker: self.shared.cfg.node_id.clone(),
        });
        if let Some(first) = rows.first() {
            self.contended(&first.contended.0);
        }
        for r in &rows {
            self.shared.hold(r.id, r.lease_epoch);
        }
        Ok(rows)
    }

    /// One claim statement, retried when two nodes race on a partition key (the loser's
    /// whole statement fails on the partition index and claims nothing).
    async fn claim_rows(&self, demand: usize) -> Result<Vec<claim::Claimed>> {
        let mut contended = 0;
        loop {
            let params = claim::ClaimParams {
                queue: &self.name,
                names: &self.shared.names,
                versions: &self.shared.versions,
                demand: demand as i64,
                node: &self.shared.cfg.node_id,
                lease_ttl_ms: crate::store::pg::millis(self.shared.cfg.lease_ttl),
                now: self.shared.clock.now_param(),
            };
            let claimed = async {
                let mut conn = self.shared.conn().await?;
                let rows = claim::claim(conn.get(), &params).await?;
                conn.finish().await?;
                Ok(rows)
            };
            match claimed.await {
                Err(Error::Database(sqlx::Error::Database(db)))
                    if db.code().as_deref() == Some(UNIQUE_VIOLATION) && contended < 5 =>
                {
                    // Another node claimed a row of the same key at the same moment: this
                    // whole claim rolled back (nothing was taken), so just claim again.
                    contended += 1;
                    let key = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail())
                        .and_then(partition_key_of)
                        .unwrap_or_default();
                    self.shared.telemetry.emit(Event::PartitionContended {
                        count: 1,
                        id: 0,
                        fsm: String::new(),
                        partition_key: key,
                    });
                }
                other => return other,
            }
        }
    }

    /// Reports rows a pick handed back because their partition was taken: one event
    /// per key, naming its first row.
    fn contended(&self, rows: &[claim::Contended]) {
        let mut by_key: Vec<(&claim::Contended, usize)> = Vec::new();
        for r in rows {
            match by_key
                .iter_mut()
                .find(|(first, _)| first.partition_key == r.partition_key)
            {
                Some((_, n)) => *n += 1,
                None => by_key.push((r, 1)),
            }
        }
        for (first, count) in by_key {
            self.shared.telemetry.emit(Event::PartitionContended {
                count,
                id: first.id,
                fsm: first.fsm.clone(),
                partition_key: first.partition_key.clone(),
            });
        }
    }

    fn dispatch(
        &self,
        buffer: &mut VecDeque<claim::Claimed>,
        tasks: &mut JoinSet<Option<Duration>>,
        running: &mut HashMap<tokio::task::Id, Running>,
    ) {
        while tasks.len() < self.cfg.concurrency {
            let Some(row) = buffer.pop_front() else { break };
            let cancel = CancellationToken::new();
            let (id, epoch, partitioned) = (row.id, row.lease_epoch, row.partitioned);
            self.shared
                .running
                .lock()
                .expect("running table")
                .insert(id, (epoch, cancel.clone()));
            let handle = tasks.spawn(run_step(
                self.shared.clone(),
                row,
                cancel.clone(),
                self.draining.clone(),
                self.queue.clone(),
            ));
            running.insert(
                handle.id(),
                Running {
                    id,
                    epoch,
                    cancel,
                    partitioned,
                },
            );
        }
    }

    async fn drain(
        self,
        buffer: VecDeque<claim::Claimed>,
        mut tasks: JoinSet<Option<Duration>>,
        mut running: HashMap<tokio::task::Id, Running>,
        mut deadline: watch::Receiver<Option<Instant>>,
    ) -> QueueDrain {
        let buffered: Vec<(i64, i64)> = buffer.iter().map(|r| (r.id, r.lease_epoch)).collect();
        let released = self.release(&buffered).await;
        let in_flight = tasks.len();
        let until = loop {
            if let Some(t) = *deadline.borrow() {
                break t;
            }
            if deadline.changed().await.is_err() {
                break Instant::now();
            }
        };
        let mut cancelled = 0;
        loop {
            tokio::select! {
                done = tasks.join_next_with_id() => match done {
                    None => break,
                    Some(Ok((tid, _))) => { running.remove(&tid); }
                    Some(Err(e)) => { running.remove(&e.id()); }
                },
                _ = tokio::time::sleep_until(until) => {
                    // Past the deadline: ask steps to stop, then take them away and give
                    // their rows back without counting an attempt.
                    for r in running.values() {
                        r.cancel.cancel();
                    }
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    let left: Vec<(i64, i64)> = running.values().map(|r| (r.id, r.epoch)).collect();
                    cancelled = self.release(&left).await;
                    break;
                }
            }
        }
        let report = QueueDrain {
            queue: self.name.clone(),
            released,
            in_flight,
            cancelled,
        };
        self.shared.telemetry.emit(Event::SchedulerDrain {
            released,
            in_flight,
            queue: self.name.clone(),
        });
        report
    }

    async fn release(&self, leases: &[(i64, i64)]) -> usize {
        if leases.is_empty() {
            return 0;
        }
        for &(id, epoch) in leases {
            self.shared.unhold(id, epoch);
        }
        let released = async {
            let mut conn = self.shared.conn().await?;
            let ids = lease::release(
                conn.get(),
                leases,
                &self.shared.cfg.node_id,
                self.shared.clock.now_param(),
            )
            .await?;
            conn.finish().await?;
            Ok::<_, Error>(ids)
        };
        match released.await {
            Ok(ids) => ids.len(),
            Err(e) => {
                tracing::warn!(target: "gen_durable::scheduler", error = %e, "release failed; rows return when their leases expire");
                0
            }
        }
    }
}

/// Runs one claimed row's step and commits its outcome; with run-ahead, goes on with
/// the next steps under the same claim while they return `next`. Returns the delay of a
/// committed `replay`, so the runner can pick it up on time rather than at the next poll.
async fn run_step(
    shared: Arc<Shared>,
    row: claim::Claimed,
    cancel: CancellationToken,
    draining: CancellationToken,
    queue: Arc<str>,
) -> Option<Duration> {
    let (id, epoch) = (row.id, row.lease_epoch);
    let replay_after = match shared.registry.get(&row.fsm, row.fsm_version).copied() {
        Some(entry) => {
            let input = StepInput {
                id,
                step: row.step,
                state: row.state,
                attempt: row.attempt,
                awaits: row.awaits,
                inbox: row.inbox.0,
                childs: row.childs.0,
                now: row.now,
                cancel: cancel.clone(),
                pool: Some(shared.pool.clone()),
            };
            run_chain(&shared, &queue, entry, epoch, input, &draining).await
        }
        None => {
            // Claims only ask for registered pairs; if this happens, leave it to the reaper.
            tracing::error!(target: "gen_durable::step", id, fsm = %row.fsm, "claimed a row of an unregistered FSM");
            None
        }
    };
    shared.unhold(id, epoch);
    replay_after
}

/// The steps one claim runs: one, or several with run-ahead.
async fn run_chain(
    shared: &Shared,
    queue: &Arc<str>,
    entry: FsmEntry,
    epoch: i64,
    mut input: StepInput,
    draining: &CancellationToken,
) -> Option<Duration> {
    let id = input.id;
    loop {
        let step = input.step.clone();
        let span = tracing::info_span!("gen_durable.step", id, fsm = entry.name, step = %step, attempt = input.attempt);
        // What a run-ahead step after this one will see of the inbox and children.
        let (inbox, childs, cancel) = (
            input.inbox.clone(),
            input.childs.clone(),
            input.cancel.clone(),
        );
        let output = entry.run(input).instrument(span).await;
        let kind = output.outcome.kind();
        let parks_with_timeout = matches!(
            output.outcome,
            Outcome::Await {
                timeout: Some(_),
                ..
            }
        );
        let replay_after = match output.outcome {
            Outcome::Replay { delay } => Some(delay),
            _ => None,
        };
        // Never run ahead into a drain or a cancellation: hand the row back instead.
        let run_ahead = output.run_ahead && !draining.is_cancelled() && !cancel.is_cancelled();
        let next = match (&output.outcome, run_ahead) {
            (Outcome::Next { step }, true) => {
                Some((*step, output.state.clone(), output.awaited.clone()))
            }
            _ => None,
        };
        let duration = output.duration;
        match commit(shared, queue, id, epoch, output, run_ahead).await {
            Ok(reply) if reply.committed => {
                if parks_with_timeout {
                    shared.timeouts_wake.notify_one();
                }
                shared.telemetry.emit(Event::StepStop {
                    duration,
                    id,
                    fsm: entry.name,
                    step,
                    kind,
                });
                match next {
                    Some((step, state, consumed)) if reply.continued => {
                        input = StepInput {
                            id,
                            step: step.to_string(),
                            state,
                            attempt: 0,
                            awaits: Vec::new(),
                            inbox: inbox
                                .into_iter()
                                .filter(|s| !consumed.contains(&s.id))
                                .collect(),
                            childs,
                            now: reply.now.unwrap_or_else(chrono::Utc::now),
                            cancel,
                            pool: Some(shared.pool.clone()),
                        };
                    }
                    _ => return replay_after,
                }
            }
            Ok(_) => {
                shared.telemetry.emit(Event::LeaseLost {
                    id,
                    fsm: entry.name,
                    step,
                    kind,
                });
                return None;
            }
            Err(e) => {
                tracing::error!(target: "gen_durable::step", id, error = %e,
                    "outcome not committed; the step will run again once its lease expires");
                return None;
            }
        }
    }
}

/// Commits through the group committer, or in the step's own transaction when it used
/// `ctx.transaction()` (its writes and the outcome commit together or not at all). An
/// outcome the database refuses in the step's transaction takes the step's writes with
/// it, and the instance stops through the committer, naming the refusal.
async fn commit(
    shared: &Shared,
    queue: &Arc<str>,
    id: i64,
    epoch: i64,
    mut output: StepOutput,
    run_ahead: bool,
) -> Result<CommitReply> {
    let mut keep_state = false;
    if let Some(tx) = output.tx.take() {
        match commit_own(shared, queue, id, epoch, &output, run_ahead, tx).await {
            Err(e) if committer::isolable(&e) => {
                tracing::warn!(target: "gen_durable::commit", id, error = %e,
                    "the database refused a step's outcome; the instance stops");
                output = StepOutput::stopped(committer::refused(&e));
                keep_state = true;
            }
            other => return other,
        }
    }
    let (reply, rx) = oneshot::channel();
    let req = CommitRequest {
        id,
        epoch,
        output,
        run_ahead,
        queue: queue.clone(),
        keep_state,
        deferrals: 0,
        reply,
    };
    if shared.committer.send(req).await.is_err() {
        return Err(Error::CommitFailed {
            id,
            reason: "the engine's committer has stopped".into(),
        });
    }
    rx.await.unwrap_or_else(|_| {
        Err(Error::CommitFailed {
            id,
            reason: "the committer dropped the request".into(),
        })
    })
}

/// Commits one outcome in the step's own transaction. An error aborts the transaction,
/// and with it the writes the outcome was to commit with; the row runs again after its
/// lease expires. A row someone else holds (deferred) is tried again in the same
/// transaction, backing off as the committer does.
async fn commit_own(
    shared: &Shared,
    queue: &Arc<str>,
    id: i64,
    epoch: i64,
    output: &StepOutput,
    run_ahead: bool,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
) -> Result<CommitReply> {
    fail::fail_point!("gd::before_commit", |_| Err(committer::injected(
        "before commit"
    )));
    let batch = [Commit {
        id,
        epoch,
        output,
        run_ahead,
        keep_state: false,
    }];
    let notify = shared.notifier.claim([&**queue]);
    let started = std::time::Instant::now();
    let mut deferrals = 0;
    let done = loop {
        let done = outcome::commit(
            &mut tx,
            &shared.cfg.node_id,
            &batch,
            &notify,
            shared.clock.now_param(),
        )
        .await?;
        if !done.deferred.contains(&id) {
            break done;
        }
        if deferrals == committer::MAX_DEFERRALS {
            return Err(Error::CommitFailed {
                id,
                reason: "its row stayed locked by another transaction".into(),
            });
        }
        deferrals += 1;
        tokio::time::sleep(committer::defer_delay(deferrals)).await;
    };
    if !done.fenced.contains(&id) {
        tx.rollback().await.ok();
        return Ok(CommitReply::default());
    }
    tx.commit().await?;
    shared.telemetry.emit(Event::CommitStop {
        duration: started.elapsed(),
        count: 1,
        committed: 1,
    });
    fail::fail_point!("gd::after_commit", |_| Err(committer::injected(
        "after commit"
    )));
    Ok(CommitReply::of(&done, id))
}

/// The key in Postgres' unique-violation detail, `Key (partition_key)=(acct:1) already exists.`
fn partition_key_of(detail: &str) -> Option<String> {
    let rest = detail.strip_prefix("Key (partition_key)=(")?;
    let end = rest.rfind(") already exists")?;
    Some(rest[..end].to_string())
}
