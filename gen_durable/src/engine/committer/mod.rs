//! Every way a step's outcome is committed.
//!
//! - The group commit: outcomes of many steps, across instances, in one statement (fenced
//!   per row; three in a transaction when the batch spawns children). While a batch
//!   commits, the next accumulates (a second may start beside it once it holds [`BESIDE`]
//!   outcomes, unless the last commit found rows or parents locked), so batching grows
//!   with load and adds no delay when idle. An outcome whose row or parent was locked is
//!   deferred: tried again as soon as the commit running beside it ends (that commit
//!   most likely held the lock: two batches of one fan-in), then with a back-off.
//! - The own-transaction commit: a step that used `ctx.transaction()` commits its outcome
//!   in that transaction, with its writes ([`CommitterHandle::commit`] routes).
//!
//! Both call the store's `outcome::commit`; a batch the database refuses for one row's
//! values is split until that row is alone, which then commits as `stop`.
//!
//! A group commit that ends rows of a gate key hands their slots on in its transaction
//! (the same one statement, `outcome::commit_and_hand_off`, but for a batch that needs a
//! transaction anyway): the key's next runnable rows are claimed into them
//! (`store::pg::handoff`) and go to their queue's picker ([`Handoffs`]), so a hot key's
//! slot is never free between a commit and the next claim.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Postgres};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::handoff::Handoffs;
use crate::engine::service::ServiceHandle;
use crate::engine::shared::{Db, BEGIN_READ_COMMITTED};
use crate::error::{Error, Result};
use crate::kind::OutcomeKind;
use crate::notify::Notifier;
use crate::pool::can_spare;
use crate::runtime::StepOutput;
use crate::store::pg::claim::Claimed;
use crate::store::pg::handoff::{self, Freed};
use crate::store::pg::outcome::{self, Commit, Committed};
use crate::telemetry::{Event, Telemetry};

/// The committer's settings.
#[derive(Debug, Clone)]
pub(crate) struct CommitterConfig {
    /// Most outcomes committed in one group commit.
    pub(crate) batch: usize,
}

impl CommitterConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::InvalidConfig(
                "commit_batch must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// The committer service: what every commit path needs.
#[derive(Debug)]
pub(crate) struct Committer {
    pub(crate) cfg: CommitterConfig,
    pub(crate) db: Db,
    pub(crate) node_id: String,
    pub(crate) telemetry: Telemetry,
    /// Coalesces the wake-ups of committed outcomes.
    pub(crate) notifier: Arc<Notifier>,
    /// The pickers that take the rows a commit claims into the gate slots it freed.
    pub(crate) handoffs: Arc<Handoffs>,
}

/// The step path's door to the committer: [`CommitterHandle::commit`].
#[derive(Debug, Clone)]
pub(crate) struct CommitterHandle {
    committer: Arc<Committer>,
    tx: mpsc::Sender<CommitRequest>,
}

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
    /// The key its claim holds, if any: when its outcome ends the claim, a gate's slot
    /// is handed to the key's next row, or else the queue is woken for it.
    pub(crate) key: Option<HeldKey>,
    pub(crate) reply: oneshot::Sender<Result<CommitReply>>,
}

/// The key a claim holds: a K = 1 partition key, or a key of a gate.
#[derive(Debug, Clone)]
pub(crate) struct HeldKey {
    pub(crate) gate: Option<String>,
    pub(crate) key: String,
    /// The gate's slot, when the claim said which (a hand-off's rows).
    pub(crate) slot: Option<i16>,
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
    /// The gate slot its claim held went to the key's next row, claimed by this commit.
    pub(crate) handed_off: bool,
}

impl CommitReply {
    pub(crate) fn of(done: &Committed, id: i64) -> Self {
        CommitReply {
            committed: done.fenced.contains(&id),
            continued: done.continued.contains(&id),
            now: done.now,
            handed_off: false,
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

impl CommitterHandle {
    /// Commits through the group committer, or in the step's own transaction when it used
    /// `ctx.transaction()` (its writes and the outcome commit together or not at all). An
    /// outcome the database refuses in the step's transaction takes the step's writes with
    /// it, and the instance stops through the committer, naming the refusal.
    pub(crate) async fn commit(
        &self,
        queue: &Arc<str>,
        id: i64,
        epoch: i64,
        mut output: StepOutput,
        run_ahead: bool,
        key: Option<HeldKey>,
    ) -> Result<CommitReply> {
        let mut keep_state = false;
        if let Some(tx) = output.tx.take() {
            match self
                .committer
                .commit_own(queue, id, epoch, &output, run_ahead, key.as_ref(), tx)
                .await
            {
                Err(e) if isolable(&e) => {
                    tracing::warn!(target: "gen_durable::commit", id, error = %e,
                    "the database refused a step's outcome; the instance stops");
                    output = StepOutput::stopped(crate::runtime::refused(&e));
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
            key,
            reply,
        };
        if self.tx.send(req).await.is_err() {
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
}

impl Committer {
    /// Commits one outcome in the step's own transaction. An error aborts the transaction,
    /// and with it the writes the outcome was to commit with; the row runs again after its
    /// lease expires. A row someone else holds (deferred) is tried again in the same
    /// transaction, backing off as the committer does. A gate slot the outcome frees is
    /// handed on in the same transaction, as a group commit does (in a savepoint: a
    /// hand-off that fails leaves the step's writes and outcome to commit without it).
    #[allow(clippy::too_many_arguments)]
    async fn commit_own(
        &self,
        queue: &Arc<str>,
        id: i64,
        epoch: i64,
        output: &StepOutput,
        run_ahead: bool,
        key: Option<&HeldKey>,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<CommitReply> {
        fail::fail_point!("gd::before_commit", |_| Err(injected("before commit")));
        let batch = [Commit {
            id,
            epoch,
            output,
            run_ahead,
            keep_state: false,
        }];
        let notify = if may_run_again(output) {
            self.notifier.claim([&**queue])
        } else {
            Vec::new()
        };
        let started = std::time::Instant::now();
        let mut deferrals = 0;
        let done = loop {
            let conn = self.db.pooler.on(&mut *tx);
            let done = outcome::commit(conn, &self.node_id, &batch, &notify, self.db.now()).await?;
            if !done.deferred.contains(&id) {
                break done;
            }
            if deferrals == MAX_DEFERRALS {
                return Err(Error::CommitFailed {
                    id,
                    reason: "its row stayed locked by another transaction".into(),
                });
            }
            deferrals += 1;
            tokio::time::sleep(defer_delay(deferrals)).await;
        };
        if !done.fenced.contains(&id) {
            tx.rollback().await.ok();
            return Ok(CommitReply::default());
        }
        let gated = self.gated(queue, id, key);
        let mut handed = Vec::new();
        if let Some(freed) = gated.filter(|_| ended(&done, id)) {
            let mut savepoint = tx.begin().await?;
            let params = self.handoffs.params(&self.node_id, self.db.now());
            let conn = self.db.pooler.on(&mut *savepoint);
            match handoff::handoff(conn, &params, &[freed]).await {
                Ok(rows) => {
                    savepoint.commit().await?;
                    handed = rows;
                    // Outcome, the step's writes and hand-off written, not committed.
                    fail::fail_point!("gd::handoff", |_| Err(injected("in the hand-off")));
                }
                Err(e) => {
                    tracing::warn!(target: "gen_durable::commit", id, error = %e,
                        "the hand-off of a gate slot failed; committing without it");
                    savepoint.rollback().await?;
                }
            }
        }
        tx.commit().await?;
        self.telemetry.emit(Event::CommitStop {
            duration: started.elapsed(),
            count: 1,
            committed: 1,
        });
        let mut reply = CommitReply::of(&done, id);
        reply.handed_off = !handed.is_empty();
        if reply.handed_off {
            self.deliver(handed).await;
        } else if key.is_some() && ended(&done, id) {
            self.notifier.wake([&**queue]);
        }
        fail::fail_point!("gd::after_commit", |_| Err(injected("after commit")));
        Ok(reply)
    }
}

/// A committer's connection, kept while commits follow each other (no pool acquire, and
/// no ping, per batch) and handed back to the pool after [`HOLD`] without one, or at
/// once when the pool has nothing else to give.
type Held = Option<PoolConnection<Postgres>>;

/// How long the committer keeps its connection with nothing to commit.
const HOLD: Duration = Duration::from_millis(250);

impl Committer {
    /// Commits `batch` — one statement, with the hand-off of the slots of the rows of
    /// `gated` it ends, or a transaction when it spawns children (or the connection must
    /// set its isolation, or the pooler takes no named statements) — retrying a deadlock
    /// or a dropped connection a few times. A hand-off that fails is given up: the batch
    /// commits again without it (any other error of the one statement is taken for the
    /// hand-off's; if it was the apply's, the apply alone meets it again).
    async fn commit_batch(
        &self,
        held: &mut Held,
        batch: &[Commit<'_>],
        notify: &[String],
        gated: &[Freed],
    ) -> Result<(Committed, Vec<(String, Claimed)>)> {
        let mut tries = 0;
        let mut hand = !gated.is_empty();
        loop {
            let attempt = async {
                fail::fail_point!("gd::before_commit", |_| Err(
                    injected("before commit").into()
                ));
                let conn = match held {
                    Some(c) => c,
                    None => held.insert(self.db.pool.acquire().await?),
                };
                let (node, now) = (&self.node_id, self.db.now());
                let pooler = self.db.pooler;
                let done = if hand
                    && !outcome::needs_transaction(batch)
                    && !self.db.set_isolation
                    && !pooler.unnamed()
                {
                    // One statement: the apply and the hand-off, committing by itself.
                    fail::fail_point!("gd::handoff", |_| Err(Failed::Handoff(injected(
                        "in the hand-off"
                    ))));
                    let params = self.handoffs.params(node, now);
                    outcome::commit_and_hand_off(
                        pooler.on(&mut **conn),
                        node,
                        batch,
                        notify,
                        &params,
                        gated,
                    )
                    .await
                    .map_err(|e| {
                        if retryable(&e) {
                            Failed::Commit(e)
                        } else {
                            Failed::Handoff(e)
                        }
                    })?
                } else if hand
                    || outcome::needs_transaction(batch)
                    || self.db.set_isolation
                    || pooler.unnamed()
                {
                    let mut tx = conn.begin_with(BEGIN_READ_COMMITTED).await?;
                    let fenced =
                        outcome::commit(pooler.on(&mut *tx), node, batch, notify, now).await?;
                    let freed: Vec<Freed> = gated
                        .iter()
                        .filter(|f| hand && ended(&fenced, f.id))
                        .cloned()
                        .collect();
                    let mut handed = Vec::new();
                    if !freed.is_empty() {
                        let params = self.handoffs.params(node, now);
                        handed = handoff::handoff(pooler.on(&mut *tx), &params, &freed)
                            .await
                            .map_err(Failed::Handoff)?;
                        // Outcomes and hand-off written, not committed.
                        fail::fail_point!("gd::handoff", |_| Err(Failed::Handoff(injected(
                            "in the hand-off"
                        ))));
                    }
                    tx.commit().await?;
                    (fenced, handed)
                } else {
                    // One statement: it commits by itself.
                    let fenced =
                        outcome::commit(pooler.on(&mut **conn), node, batch, notify, now).await?;
                    (fenced, Vec::new())
                };
                fail::fail_point!("gd::after_commit", |_| Err(injected("after commit").into()));
                Ok::<_, Failed>(done)
            };
            match attempt.await {
                Ok(done) => return Ok(done),
                Err(Failed::Handoff(e)) => {
                    // The transaction rolls back, the outcomes with it (sqlx sends the
                    // ROLLBACK first thing on this connection, which stays: closing it
                    // could leave its locks held a moment, and the next attempt would
                    // find its own rows locked): commit them again, leaving the slots to
                    // the pickers' claims.
                    tracing::warn!(target: "gen_durable::commit", error = %e,
                        "the hand-off of gate slots failed; committing without it");
                    hand = false;
                }
                Err(Failed::Commit(e)) => {
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
}

/// Why an attempt at a group commit failed.
enum Failed {
    /// The commit's statements (or its connection).
    Commit(Error),
    /// The hand-off after them.
    Handoff(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Commit(e)
    }
}

impl From<sqlx::Error> for Failed {
    fn from(e: sqlx::Error) -> Self {
        Failed::Commit(e.into())
    }
}

/// Whether an outcome can make its row runnable, so that its commit wakes the row's
/// queue: one that leads to a step (a `done` or a `stop` is the end).
fn may_run_again(output: &StepOutput) -> bool {
    !matches!(output.outcome.kind(), OutcomeKind::Done | OutcomeKind::Stop)
}

/// Whether the commit `done` ended the claim of `id`: its outcome was written and the row
/// does not run ahead.
fn ended(done: &Committed, id: i64) -> bool {
    done.fenced.contains(&id) && !done.continued.contains(&id)
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
        // A child or a transition naming an undeclared gate or rate limit, or a weight
        // above its limit's burst (a foreign key or the row's check, class 23, typed).
        Error::UnknownGate { .. } | Error::UnknownRateLimit { .. } => true,
        Error::InvalidInput { what, .. } => *what == "rate limit weight",
        _ => false,
    }
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

/// How often an outcome is deferred and tried again without waiting: the first times,
/// when the lock it met was most likely another commit of this engine's (two batches with
/// children of one parent), which has ended by then.
const FAST_DEFERRALS: u32 = 3;

/// When a deferred outcome is tried again after its fast tries: soon, then backing off to
/// 200 ms.
pub(crate) fn defer_delay(deferrals: u32) -> Duration {
    Duration::from_millis((2u64 << deferrals.min(7)).min(200))
}

impl Committer {
    /// Starts the committer on `tracker`; once its handle stops it, it answers every
    /// request still sent, then ends.
    pub(crate) fn start(self, tracker: &TaskTracker) -> (CommitterHandle, ServiceHandle) {
        let committer = Arc::new(self);
        let (tx, rx) = mpsc::channel(committer.cfg.batch * 4);
        let stop = CancellationToken::new();
        tracker.spawn(committer.clone().run(rx, stop.clone()));
        (CommitterHandle { committer, tx }, ServiceHandle::new(stop))
    }

    /// The loop: runs until `stop` and its channel is drained.
    async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<CommitRequest>, stop: CancellationToken) {
        let max = self.cfg.batch;
        let mut pending: Vec<CommitRequest> = Vec::with_capacity(max);
        // Outcomes to try again once `later_at` has passed.
        let mut later: Vec<CommitRequest> = Vec::new();
        let mut later_at = tokio::time::Instant::now();
        // Outcomes deferred while another commit of ours ran: most often that commit held
        // their rows' parent (two batches of one fan-in). Tried again when it ends.
        let mut after_flight: Vec<CommitRequest> = Vec::new();
        // The last commit that ended deferred some of its rows: commit one batch at a time
        // until one ends without, so that two batches do not keep meeting on one parent.
        let mut contended = false;
        // Connections kept between commits, and the commits running.
        let mut idle: Vec<PoolConnection<Postgres>> = Vec::new();
        let mut flying: JoinSet<(Held, Vec<CommitRequest>)> = JoinSet::new();
        let mut open = true;
        loop {
            while !pending.is_empty()
                && (flying.is_empty()
                    || (flying.len() < IN_FLIGHT
                        && !contended
                        && (pending.len() >= BESIDE || !open)))
            {
                let batch = std::mem::replace(&mut pending, Vec::with_capacity(max));
                flying.spawn(self.clone().run_once(idle.pop(), batch));
            }
            if !open
                && pending.is_empty()
                && flying.is_empty()
                && later.is_empty()
                && after_flight.is_empty()
            {
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
                    // A commit ended: what waited for it goes again now.
                    pending.append(&mut after_flight);
                    if let Ok((held, deferred)) = done {
                        contended = !deferred.is_empty();
                        // Keep the connection for the next commit unless a claim or a step
                        // could be left waiting for it (a small pool).
                        if let Some(conn) = held {
                            if can_spare(&self.db.pool) {
                                idle.push(conn);
                            }
                        }
                        // Deferred for the first times: at once if no commit of ours is
                        // running any more (it may have held them), or when the one still
                        // running ends. Often deferred: a caller's transaction holds them,
                        // so back off.
                        let (fast, deferred): (Vec<_>, Vec<_>) =
                            deferred.into_iter().partition(|r| r.deferrals <= FAST_DEFERRALS);
                        if flying.is_empty() {
                            pending.extend(fast);
                        } else {
                            after_flight.extend(fast);
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

    /// One group commit: commits `pending`, answers each of its steps (and emits
    /// `commit.stop`), and hands back the connection and the outcomes to try again.
    pub(crate) async fn run_once(
        self: Arc<Self>,
        mut held: Held,
        pending: Vec<CommitRequest>,
    ) -> (Held, Vec<CommitRequest>) {
        // The statement wakes a queue where a row of it becomes runnable: only an outcome
        // that leads to a step can do that (a `done` or a `stop` is the end).
        let mut queues: Vec<&str> = pending
            .iter()
            .filter(|r| may_run_again(&r.output))
            .map(|r| &*r.queue)
            .collect();
        queues.sort_unstable();
        queues.dedup();
        let notify = self.notifier.claim(queues);
        let started = std::time::Instant::now();
        let mut handed = Vec::new();
        let mut verdicts = self
            .commit_isolating(&mut held, &pending, &notify, &mut handed)
            .await;
        if !handed.is_empty() {
            self.hand_on(&pending, &mut verdicts, handed).await;
        }
        self.wake_for_freed_keys(&pending, &verdicts);
        let committed = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Reply(Ok(r)) if r.committed))
            .count();
        self.telemetry.emit(Event::CommitStop {
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
        &self,
        held: &mut Held,
        reqs: &[CommitRequest],
        notify: &[String],
        handed: &mut Vec<(String, Claimed)>,
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
        let gated: Vec<Freed> = reqs
            .iter()
            .filter_map(|r| self.gated(&r.queue, r.id, r.key.as_ref()))
            .collect();
        match self.commit_batch(held, &batch, notify, &gated).await {
            Ok((done, rows)) => {
                handed.extend(rows);
                reqs.iter()
                    .map(|r| {
                        if done.deferred.contains(&r.id) {
                            Verdict::Deferred
                        } else {
                            Verdict::Reply(Ok(CommitReply::of(&done, r.id)))
                        }
                    })
                    .collect()
            }
            Err(e) if isolable(&e) && reqs.len() > 1 => {
                let (a, b) = reqs.split_at(reqs.len() / 2);
                let mut v = Box::pin(self.commit_isolating(held, a, notify, handed)).await;
                v.extend(Box::pin(self.commit_isolating(held, b, notify, handed)).await);
                v
            }
            Err(e) if isolable(&e) && !reqs[0].keep_state => {
                let r = &reqs[0];
                tracing::warn!(target: "gen_durable::commit", id = r.id, error = %e,
                "the database refused a step's outcome; the instance stops");
                let output = StepOutput::stopped(crate::runtime::refused(&e));
                let stop = [Commit {
                    id: r.id,
                    epoch: r.epoch,
                    output: &output,
                    run_ahead: false,
                    keep_state: true,
                }];
                match self.commit_batch(held, &stop, notify, &[]).await {
                    Ok((done, _)) if done.deferred.contains(&r.id) => vec![Verdict::Deferred],
                    Ok((done, _)) => vec![Verdict::Reply(Ok(CommitReply::of(&done, r.id)))],
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
}

/// What became of one outcome of a batch.
pub(super) enum Verdict {
    Reply(Result<CommitReply>),
    /// Its row or parent was held by someone else: try again.
    Deferred,
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
