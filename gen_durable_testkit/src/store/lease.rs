//! Leases in memory (`gen_durable::store::pg::lease`): a lease lost and its row reaped,
//! and await deadlines that have passed (EXPIRE_AWAITS).

use chrono::{DateTime, Utc};
use gen_durable::{HistoryKind, Status};

use super::history::Extra;
use super::{Store, KIT_NODE};

impl Store {
    /// EXPIRE_AWAITS: parked rows past their deadline become runnable at their next
    /// step with `awaits` cleared, so that step sees nothing awaited.
    pub(crate) fn expire_awaits(&mut self, now: DateTime<Utc>) -> usize {
        let mut n = 0;
        for r in self.rows.values_mut() {
            if r.status == Status::AwaitingSignal && r.await_deadline.is_some_and(|d| d <= now) {
                r.status = Status::Runnable;
                r.awaits.clear();
                r.await_deadline = None;
                r.eligible_at = now;
                r.updated_at = now;
                n += 1;
            }
        }
        n
    }

    /// A lost lease (`gd_reap`): a worker claimed runnable row `id` and died before its
    /// outcome committed, and the reaper took the row back — runnable again with
    /// `attempt + 1`, or failed with "lease lost N times" once `reaps` reaches `max_reaps`
    /// (its inbox deleted, its parent counted down). False unless it was runnable and due,
    /// or claimed by `claim`.
    pub(crate) fn lose_lease(&mut self, id: i64, now: DateTime<Utc>) -> bool {
        let Some(row) = self.rows.get_mut(&id) else {
            return false;
        };
        let due = row.status == Status::Runnable && row.eligible_at <= now;
        if !due && row.claimed_at.is_none() {
            return false;
        }
        row.claimed_at = None;
        row.status = Status::Runnable;
        row.updated_at = now;
        row.attempt += 1;
        row.reaps += 1;
        row.eligible_at = now;
        let failed = row.reaps >= row.max_reaps;
        if failed {
            row.status = Status::Failed;
            row.last_error = Some(format!(
                "lease lost {} times (max_reaps = {}): the step at '{}' never committed an outcome",
                row.reaps, row.max_reaps, row.step
            ));
        } else {
            // The engine names the lost node and epoch; the kit has neither.
            row.last_error = Some("lease lost; retrying".to_string());
        }
        // The reaper's entry, at every history level.
        let (step, attempt, error, parent) = (
            row.step.clone(),
            row.attempt,
            row.last_error.clone(),
            row.parent_id,
        );
        self.note(
            id,
            now,
            HistoryKind::LeaseLost,
            &step,
            attempt,
            Extra {
                node: Some(KIT_NODE.to_string()),
                error,
                ..Extra::default()
            },
        );
        if failed {
            self.finished(id, parent, now);
        }
        true
    }
}
