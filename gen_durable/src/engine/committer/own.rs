//! The commit in a step's own transaction: a step that used `ctx.transaction()` commits
//! its outcome there, with its writes, and hands on the gate slot it frees in a savepoint.

use std::sync::Arc;

use sqlx::Connection;

use super::batching::{defer_delay, MAX_DEFERRALS};
use super::{ended, may_run_again, CommitReply, Committer, HeldKey};
use crate::model::error::{Error, Result};
use crate::model::history::HistoryLevel;
use crate::model::step::StepOutput;
use crate::store::pg::handoff;
use crate::store::pg::outcome::{self, Commit};
use crate::telemetry::Event;

impl Committer {
    /// Commits one outcome in the step's own transaction. An error aborts the transaction,
    /// and with it the writes the outcome was to commit with; the row runs again after its
    /// lease expires. A row someone else holds (deferred) is tried again in the same
    /// transaction, backing off as the committer does. A gate slot the outcome frees is
    /// handed on in the same transaction, as a group commit does (in a savepoint: a
    /// hand-off that fails leaves the step's writes and outcome to commit without it).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_own(
        &self,
        queue: &Arc<str>,
        id: i64,
        epoch: i64,
        output: &StepOutput,
        run_ahead: bool,
        key: Option<&HeldKey>,
        history: HistoryLevel,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<CommitReply> {
        fail::fail_point!("gd::before_commit", |_| Err(super::injected(
            "before commit"
        )));
        let batch = [Commit {
            id,
            epoch,
            output,
            run_ahead,
            keep_state: false,
            history,
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
                    fail::fail_point!("gd::handoff", |_| Err(super::injected("in the hand-off")));
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
        fail::fail_point!("gd::after_commit", |_| Err(super::injected("after commit")));
        Ok(reply)
    }
}
