//! One group commit: the batch's outcomes in one statement (or a transaction when it
//! spawns children or hands gate slots on), split around a row whose values the database
//! refuses, retried after a deadlock or a dropped connection, then each step answered.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;

use super::batching::{Held, MAX_DEFERRALS};
use super::{
    ended, isolable, may_run_again, retryable, CommitReply, CommitRequest, Committer, Verdict,
};
use crate::model::error::{Error, Result};
use crate::model::step::StepOutput;
use crate::store::pg::claim::Claimed;
use crate::store::pg::handoff::{self, Freed};
use crate::store::pg::outcome::{self, Commit, Committed};
use crate::store::pg::BEGIN_READ_COMMITTED;
use crate::telemetry::Event;

impl Committer {
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
                history: r.history,
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
                    history: r.history,
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
                fail::fail_point!("gd::before_commit", |_| Err(super::injected(
                    "before commit"
                )
                .into()));
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
                    fail::fail_point!("gd::handoff", |_| Err(Failed::Handoff(super::injected(
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
                        fail::fail_point!("gd::handoff", |_| Err(Failed::Handoff(
                            super::injected("in the hand-off")
                        )));
                    }
                    tx.commit().await?;
                    (fenced, handed)
                } else {
                    // One statement: it commits by itself.
                    let fenced =
                        outcome::commit(pooler.on(&mut **conn), node, batch, notify, now).await?;
                    (fenced, Vec::new())
                };
                fail::fail_point!("gd::after_commit", |_| Err(
                    super::injected("after commit").into()
                ));
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
