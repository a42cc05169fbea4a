//! Group commit: outcomes of many steps, across instances, in one statement (fenced per
//! row; three in a transaction when the batch spawns children). While a batch commits,
//! the next accumulates (a second may start beside it once it holds [`BESIDE`]
//! outcomes), so batching grows with load and adds no delay when idle.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Postgres};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::engine::{Shared, BEGIN_READ_COMMITTED};
use crate::error::{Error, Result};
use crate::pool::can_spare;
use crate::runtime::StepOutput;
use crate::store::pg::outcome::{self, Commit, Committed};
use crate::telemetry::Event;

/// One outcome waiting to be committed, and where to report whether it was.
#[derive(Debug)]
pub(crate) struct CommitRequest {
    pub(crate) id: i64,
    pub(crate) epoch: i64,
    pub(crate) output: StepOutput,
    pub(crate) run_ahead: bool,
    /// The queue the step ran on, for its wake-up.
    pub(crate) queue: Arc<str>,
    /// Commit it as `stop` keeping the stored state: the database refused its outcome.
    pub(crate) keep_state: bool,
    /// How many times it was deferred (its row or parent held by someone else).
    pub(crate) deferrals: u32,
    pub(crate) reply: oneshot::Sender<Result<CommitReply>>,
}

/// What happened to one outcome.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CommitReply {
    /// The outcome was written (false: the lease had moved on; nothing was written).
    pub(crate) committed: bool,
    /// It was a run-ahead `next` and the row is still claimed by this worker.
    pub(crate) continued: bool,
    /// The clock's time at commit.
    pub(crate) now: Option<chrono::DateTime<chrono::Utc>>,
}

impl CommitReply {
    pub(crate) fn of(done: &Committed, id: i64) -> Self {
        CommitReply {
            committed: done.fenced.contains(&id),
            continued: done.continued.contains(&id),
            now: done.now,
        }
    }
}

/// True for errors after which the same transaction may simply be tried again: the
/// fence makes a retry safe even if an earlier attempt did commit.
pub(crate) fn retryable(err: &Error) -> bool {
    match err {
        Error::Database(sqlx::Error::Database(db)) => {
            matches!(db.code().as_deref(), Some("40P01" | "40001"))
        }
        Error::Database(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut) => true,
        _ => false,
    }
}

/// A committer's connection, kept while commits follow each other (no pool acquire, and
/// no ping, per batch) and handed back to the pool after [`HOLD`] without one, or at
/// once when the pool has nothing else to give.
type Held = Option<PoolConnection<Postgres>>;

/// How long the committer keeps its connection with nothing to commit.
const HOLD: Duration = Duration::from_millis(250);

/// Commits `batch` — one statement, or a transaction when it spawns children — retrying
/// a deadlock or a dropped connection a few times.
pub(crate) async fn commit_batch(
    shared: &Shared,
    held: &mut Held,
    batch: &[Commit<'_>],
    notify: &[String],
) -> Result<Committed> {
    let mut tries = 0;
    loop {
        let attempt = async {
            fail::fail_point!("gd::before_commit", |_| Err(injected("before commit")));
            let conn = match held {
                Some(c) => c,
                None => held.insert(shared.pool.acquire().await?),
            };
            let (node, now) = (&shared.cfg.node_id, shared.clock.now_param());
            let fenced = if outcome::needs_transaction(batch) || shared.set_isolation {
                let mut tx = conn.begin_with(BEGIN_READ_COMMITTED).await?;
                let fenced = outcome::commit(&mut tx, node, batch, notify, now).await?;
                tx.commit().await?;
                fenced
            } else {
                // One statement: it commits by itself.
                outcome::commit(conn, node, batch, notify, now).await?
            };
            fail::fail_point!("gd::after_commit", |_| Err(injected("after commit")));
            Ok::<_, Error>(fenced)
        };
        match attempt.await {
            Ok(f) => return Ok(f),
            Err(e) => {
                // The connection may be broken: close it rather than reuse it.
                if let Some(c) = held.take() {
                    let _ = c.close().await;
                }
                if tries < 5 && retryable(&e) {
                    tries += 1;
                    tracing::debug!(target: "gen_durable::commit", error = %e, tries, "retrying commit");
                    tokio::time::sleep(Duration::from_millis(10 << tries)).await;
                } else {
                    return Err(e);
                }
            }
        }
    }
}

/// True for a database error that one row's values can cause (a data exception, an
/// integrity or a program-limit error, or a value that would not encode): the batch is
/// split until the row is found, and the others commit. Every other error — a lost
/// connection, a timeout, a missing function — concerns the whole batch.
pub(crate) fn isolable(err: &Error) -> bool {
    match err {
        Error::Database(sqlx::Error::Database(db)) => {
            matches!(
                db.code().as_deref().map(|c| &c[..2]),
                Some("22" | "23" | "54")
            )
        }
        Error::Database(sqlx::Error::Encode(_)) => true,
        _ => false,
    }
}

/// What the database refused, as the `stop` reason that replaces the outcome.
pub(crate) fn refused(err: &Error) -> String {
    format!("the step's outcome was refused by the database, so the instance stops: {err}")
}

/// The error a failpoint injects (only with the `failpoints` feature).
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) fn injected(at: &str) -> Error {
    Error::CommitFailed {
        id: 0,
        reason: format!("failpoint: injected failure {at}"),
    }
}

/// Commits running at once. A second starts beside the first only for a batch of at
/// least [`BESIDE`] outcomes, so that batches stay large while the commit path keeps
/// both the database's cores busy.
const IN_FLIGHT: usize = 2;

/// The smallest batch that starts while another commit runs.
const BESIDE: usize = 32;

/// How often an outcome is deferred (its row or its parent held by a caller's
/// transaction) before it is given up as not committed: about 20 s of tries.
pub(crate) const MAX_DEFERRALS: u32 = 100;

/// When a deferred outcome is tried again: soon, then backing off to 200 ms.
pub(crate) fn defer_delay(deferrals: u32) -> Duration {
    Duration::from_millis((2u64 << deferrals.min(7)).min(200))
}

/// The committer service: runs until `stop` and its channel is drained.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<CommitRequest>,
    stop: CancellationToken,
) {
    let max = shared.cfg.commit_batch;
    let mut pending: Vec<CommitRequest> = Vec::with_capacity(max);
    // Outcomes to try again once `later_at` has passed.
    let mut later: Vec<CommitRequest> = Vec::new();
    let mut later_at = tokio::time::Instant::now();
    // Connections kept between commits, and the commits running.
    let mut idle: Vec<PoolConnection<Postgres>> = Vec::new();
    let mut flying: JoinSet<(Held, Vec<CommitRequest>)> = JoinSet::new();
    let mut open = true;
    loop {
        while !pending.is_empty()
            && (flying.is_empty()
                || (flying.len() < IN_FLIGHT && (pending.len() >= BESIDE || !open)))
        {
            let batch = std::mem::replace(&mut pending, Vec::with_capacity(max));
            flying.spawn(commit_task(shared.clone(), idle.pop(), batch));
        }
        if !open && pending.is_empty() && flying.is_empty() && later.is_empty() {
            return;
        }
        tokio::select! {
            r = next_request(&mut rx, &stop), if open && pending.len() < max => match r {
                Some(r) => {
                    pending.push(r);
                    while pending.len() < max {
                        match rx.try_recv() {
                            Ok(r) => pending.push(r),
                            Err(_) => break,
                        }
                    }
                }
                None => open = false,
            },
            Some(done) = flying.join_next(), if !flying.is_empty() => {
                if let Ok((held, deferred)) = done {
                    // Keep the connection for the next commit unless a claim or a step
                    // could be left waiting for it (a small pool).
                    if let Some(conn) = held {
                        if can_spare(&shared.pool) {
                            idle.push(conn);
                        }
                    }
                    if let Some(n) = deferred.iter().map(|r| r.deferrals).max() {
                        let at = tokio::time::Instant::now() + defer_delay(n);
                        later_at = if later.is_empty() { at } else { later_at.min(at) };
                        later.extend(deferred);
                    }
                }
            }
            _ = tokio::time::sleep_until(later_at), if !later.is_empty() => {
                pending.append(&mut later);
            }
            // Idle: give the connections back.
            _ = tokio::time::sleep(HOLD), if flying.is_empty() && pending.is_empty() && !idle.is_empty() => {
                idle.clear();
            }
        }
    }
}

/// What became of one outcome of a batch.
enum Verdict {
    Reply(Result<CommitReply>),
    /// Its row or parent was held by someone else: try again.
    Deferred,
}

/// Commits one batch, answers each of its steps, and hands back the connection and the
/// outcomes to try again.
async fn commit_task(
    shared: Arc<Shared>,
    mut held: Held,
    pending: Vec<CommitRequest>,
) -> (Held, Vec<CommitRequest>) {
    let mut queues: Vec<&str> = pending.iter().map(|r| &*r.queue).collect();
    queues.sort_unstable();
    queues.dedup();
    let notify = shared.notifier.claim(queues);
    let started = std::time::Instant::now();
    let verdicts = commit_isolating(&shared, &mut held, &pending, &notify).await;
    let committed = verdicts
        .iter()
        .filter(|v| matches!(v, Verdict::Reply(Ok(r)) if r.committed))
        .count();
    shared.telemetry.emit(Event::CommitStop {
        duration: started.elapsed(),
        count: pending.len(),
        committed,
    });
    let mut again = Vec::new();
    for (mut r, v) in pending.into_iter().zip(verdicts) {
        match v {
            Verdict::Deferred if r.deferrals < MAX_DEFERRALS => {
                r.deferrals += 1;
                again.push(r);
            }
            Verdict::Deferred => {
                let _ = r.reply.send(Err(Error::CommitFailed {
                    id: r.id,
                    reason: "its row stayed locked by another transaction".into(),
                }));
            }
            Verdict::Reply(reply) => {
                let _ = r.reply.send(reply);
            }
        }
    }
    (held, again)
}

/// Commits `reqs`, and when the database refuses the batch for what one row holds, splits
/// it in halves until that row is alone — then commits it as `stop`, naming the refusal,
/// so that it fails once instead of being reaped and rerun, and every other row commits.
async fn commit_isolating(
    shared: &Shared,
    held: &mut Held,
    reqs: &[CommitRequest],
    notify: &[String],
) -> Vec<Verdict> {
    let batch: Vec<Commit<'_>> = reqs
        .iter()
        .map(|r| Commit {
            id: r.id,
            epoch: r.epoch,
            output: &r.output,
            run_ahead: r.run_ahead,
            keep_state: r.keep_state,
        })
        .collect();
    match commit_batch(shared, held, &batch, notify).await {
        Ok(done) => reqs
            .iter()
            .map(|r| {
                if done.deferred.contains(&r.id) {
                    Verdict::Deferred
                } else {
                    Verdict::Reply(Ok(CommitReply::of(&done, r.id)))
                }
            })
            .collect(),
        Err(e) if isolable(&e) && reqs.len() > 1 => {
            let (a, b) = reqs.split_at(reqs.len() / 2);
            let mut v = Box::pin(commit_isolating(shared, held, a, notify)).await;
            v.extend(Box::pin(commit_isolating(shared, held, b, notify)).await);
            v
        }
        Err(e) if isolable(&e) && !reqs[0].keep_state => {
            let r = &reqs[0];
            tracing::warn!(target: "gen_durable::commit", id = r.id, error = %e,
                "the database refused a step's outcome; the instance stops");
            let output = StepOutput::stopped(refused(&e));
            let stop = [Commit {
                id: r.id,
                epoch: r.epoch,
                output: &output,
                run_ahead: false,
                keep_state: true,
            }];
            match commit_batch(shared, held, &stop, notify).await {
                Ok(done) if done.deferred.contains(&r.id) => vec![Verdict::Deferred],
                Ok(done) => vec![Verdict::Reply(Ok(CommitReply::of(&done, r.id)))],
                Err(e) => vec![Verdict::Reply(Err(Error::CommitFailed {
                    id: r.id,
                    reason: e.to_string(),
                }))],
            }
        }
        Err(e) => reqs
            .iter()
            .map(|r| {
                Verdict::Reply(Err(Error::CommitFailed {
                    id: r.id,
                    reason: e.to_string(),
                }))
            })
            .collect(),
    }
}
/// The next request, or None once the engine stops and every request is handled.
async fn next_request(
    rx: &mut mpsc::Receiver<CommitRequest>,
    stop: &CancellationToken,
) -> Option<CommitRequest> {
    tokio::select! {
        biased;
        r = rx.recv() => r,
        _ = stop.cancelled() => {
            // Steps still running report through their own channel clone; when the
            // engine stops us every sender is gone, so drain what is left.
            rx.close();
            rx.recv().await
        }
    }
}
