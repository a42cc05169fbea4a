//! Every way a step's outcome is committed.
//!
//! - The group commit: outcomes of many steps, across instances, in one statement (fenced
//!   per row; three in a transaction when the batch spawns children). While a batch
//!   commits, the next accumulates (a second may start beside it once it holds
//!   [`batching::BESIDE`] outcomes, unless the last commit found rows or parents locked), so
//!   batching grows with load and adds no delay when idle. An outcome whose row or parent
//!   was locked is deferred: tried again as soon as the commit running beside it ends (that
//!   commit most likely held the lock: two batches of one fan-in), then with a back-off.
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
//!
//! The files:
//! - `mod.rs`: the service, its handle (the step path's door), a request and its reply,
//!   and which errors split a batch or retry it;
//! - `batching.rs`: the loop — requests gathered into batches, up to two commits at once,
//!   deferred outcomes sent again, a connection kept between commits;
//! - `group.rs`: one group commit — the statement (or the transaction) with its hand-off,
//!   the retries, the batch split around a refused row, the answers;
//! - `own.rs`: the commit in a step's own transaction.

mod batching;
mod group;
mod own;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::handoff::Handoffs;
use crate::engine::service::ServiceHandle;
use crate::engine::shared::Db;
use crate::model::error::{Error, Result};
use crate::model::history::HistoryLevel;
use crate::model::step::{OutcomeKind, StepOutput};
use crate::store::notify::Notifier;
use crate::store::pg::outcome::Committed;
use crate::telemetry::Telemetry;

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
    /// How much of the step its FSM's history records.
    pub(crate) history: HistoryLevel,
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
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn commit(
        &self,
        queue: &Arc<str>,
        id: i64,
        epoch: i64,
        mut output: StepOutput,
        run_ahead: bool,
        key: Option<HeldKey>,
        history: HistoryLevel,
    ) -> Result<CommitReply> {
        let mut keep_state = false;
        if let Some(tx) = output.tx.take() {
            match self
                .committer
                .commit_own(
                    queue,
                    id,
                    epoch,
                    &output,
                    run_ahead,
                    key.as_ref(),
                    history,
                    tx,
                )
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
            history,
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
    /// Starts the committer on `tracker`; once its handle stops it, it answers every
    /// request still sent, then ends.
    pub(crate) fn start(self, tracker: &TaskTracker) -> (CommitterHandle, ServiceHandle) {
        let committer = Arc::new(self);
        let (tx, rx) = mpsc::channel(committer.cfg.batch * 4);
        let stop = CancellationToken::new();
        tracker.spawn(committer.clone().run(rx, stop.clone()));
        (CommitterHandle { committer, tx }, ServiceHandle::new(stop))
    }
}

/// What became of one outcome of a batch.
pub(super) enum Verdict {
    Reply(Result<CommitReply>),
    /// Its row or parent was held by someone else: try again.
    Deferred,
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
