//! The operator actions on one instance (`gen_durable::store::pg::control`): cancel (the
//! instance and its live descendants), retry, and restart at a step — each returning the
//! same `…Found` value as its statement, so `TestKit` and `Client` answer alike.

use chrono::{DateTime, Utc};
use gen_durable::backend::{CancelFound, RestartFound, RetryFound};
use gen_durable::{HistoryKind, Status};
use serde_json::Value;

use super::history::Extra;
use super::{guard, Store};

impl Store {
    /// Cancel (`store::pg::control`, CANCEL_TREE then CANCEL_APPLY): the instance and
    /// its live descendants fail with "cancelled" at once — their inboxes go, and every
    /// parent counts each of its cancelled children down (one outside the tree wakes at
    /// zero), so `children_pending` keeps counting live children. Returns how many
    /// failed. The kit runs no step between calls, so none is `executing`.
    pub(crate) fn cancel(&mut self, id: i64, now: DateTime<Utc>) -> CancelFound {
        match self.rows.get(&id) {
            None => return CancelFound::NotFound,
            Some(row) if row.status.is_terminal() => return CancelFound::Finished(row.status),
            Some(_) => {}
        }
        let mut tree = vec![id];
        let mut i = 0;
        while i < tree.len() {
            let live: Vec<i64> = self
                .children(tree[i])
                .filter(|c| !c.status.is_terminal())
                .map(|c| c.id)
                .collect();
            tree.extend(
                live.into_iter()
                    .filter(|c| !tree.contains(c))
                    .collect::<Vec<_>>(),
            );
            i += 1;
        }
        tree.sort_unstable();
        let mut failed = Vec::new();
        for &t in &tree {
            self.refund(t);
            let row = self.rows.get_mut(&t).expect("tree rows exist");
            if matches!(
                row.status,
                Status::Runnable | Status::AwaitingSignal | Status::AwaitingChildren
            ) {
                row.status = Status::Failed;
                row.last_error = Some("cancelled".to_string());
                row.await_deadline = None;
                row.updated_at = now;
                failed.push((t, row.parent_id, row.step.clone(), row.attempt + 1));
            }
        }
        for (t, parent, step, attempt) in &failed {
            self.finished(*t, *parent, now);
            self.note(
                *t,
                now,
                HistoryKind::Cancelled,
                step,
                *attempt,
                Extra {
                    error: Some("cancelled".to_string()),
                    by_operator: true,
                    ..Extra::default()
                },
            );
        }
        CancelFound::Cancelled {
            failed: failed.len(),
            flagged: 0,
        }
    }

    /// RETRY: a failed instance goes back to where the step it failed in began, now, with
    /// `attempt` and `reaps` reset: it awaits its children again if some are still live
    /// (`children_pending` recounted), awaits its signals again if the step was woken by
    /// one (`awaits` kept; the failure deleted the inbox), else it is runnable. A child is retried only while its
    /// parent awaits its children, and re-arms it. `KeyTaken` if its unique key was taken
    /// meanwhile (the guard's unique index refuses the update).
    pub(crate) fn retry(&mut self, id: i64, now: DateTime<Utc>) -> RetryFound {
        let Some(row) = self.rows.get(&id) else {
            return RetryFound::NotFound;
        };
        if row.status != Status::Failed {
            return RetryFound::NotFailed(row.status);
        }
        let rearm = match row.parent_id.and_then(|p| self.rows.get(&p)) {
            Some(p) if p.status == Status::AwaitingChildren => Some(p.id),
            Some(p) => {
                return RetryFound::ParentMovedOn {
                    parent: p.id,
                    status: p.status,
                }
            }
            None => None,
        };
        let live = self
            .children(id)
            .filter(|c| !c.status.is_terminal())
            .count() as i32;
        let signalled = self
            .signals
            .values()
            .any(|s| s.target == id && row.awaits.contains(&s.signal.name));
        let status = if live > 0 {
            Status::AwaitingChildren
        } else if !row.awaits.is_empty() && !signalled {
            Status::AwaitingSignal
        } else {
            Status::Runnable
        };
        if let Some(key) = guard(&row.unique_key, &row.unique_scope, status) {
            if self
                .rows
                .values()
                .any(|r| r.id != id && r.guard() == Some(key))
            {
                return RetryFound::KeyTaken;
            }
        }
        let row = self.rows.get_mut(&id).expect("checked above");
        let step = row.step.clone();
        row.status = status;
        row.rate_paid = false;
        row.attempt = 0;
        row.reaps = 0;
        row.children_pending = live;
        row.await_deadline = None;
        row.eligible_at = now;
        row.updated_at = now;
        if let Some(p) = rearm.and_then(|p| self.rows.get_mut(&p)) {
            p.children_pending += 1;
            p.updated_at = now;
        }
        self.note(
            id,
            now,
            HistoryKind::Retried,
            &step,
            1,
            Extra {
                by_operator: true,
                ..Extra::default()
            },
        );
        RetryFound::Retried
    }

    /// RETRY with a step (a restart): an instance that is not executing and has no live
    /// children becomes runnable now at `step` — attempt and reaps 0, nothing awaited, no
    /// deadline, no result, inbox kept. A finished child is taken back only while its
    /// parent awaits its children, and re-arms it. `KeyTaken` if it comes back into its
    /// key's scope while another row holds the key.
    ///
    /// With `from` (a history entry's id and state), it also takes that state, and its
    /// entry says so.
    pub(crate) fn restart(
        &mut self,
        id: i64,
        step: &str,
        from: Option<(i64, &Value)>,
        now: DateTime<Utc>,
    ) -> RestartFound {
        let Some(row) = self.rows.get(&id) else {
            return RestartFound::NotFound;
        };
        if row.status == Status::Executing {
            return RestartFound::Executing;
        }
        if self.children(id).any(|c| !c.status.is_terminal()) {
            return RestartFound::LiveChildren(row.status);
        }
        let finished = row.status.is_terminal();
        let rearm = match row.parent_id.and_then(|p| self.rows.get(&p)) {
            Some(p) if finished && p.status != Status::AwaitingChildren => {
                return RestartFound::ParentMovedOn {
                    parent: p.id,
                    status: p.status,
                }
            }
            Some(p) if finished => Some(p.id),
            _ => None,
        };
        if let Some(key) = guard(&row.unique_key, &row.unique_scope, Status::Runnable) {
            if self
                .rows
                .values()
                .any(|r| r.id != id && r.guard() == Some(key))
            {
                return RestartFound::KeyTaken;
            }
        }
        let keeps = self.rows[&id].rate_step.as_deref() == Some(step);
        if !keeps || self.rows[&id].status != Status::Runnable {
            self.refund(id);
        }
        let row = self.rows.get_mut(&id).expect("checked above");
        let was = std::mem::replace(&mut row.step, step.to_string());
        if let Some((_, state)) = from {
            row.state = state.clone();
        }
        row.status = Status::Runnable;
        row.attempt = 0;
        row.reaps = 0;
        row.awaits.clear();
        row.await_deadline = None;
        row.result = None;
        row.children_pending = 0;
        row.eligible_at = now;
        row.updated_at = now;
        if let Some(p) = rearm.and_then(|p| self.rows.get_mut(&p)) {
            p.children_pending += 1;
            p.updated_at = now;
        }
        self.note(
            id,
            now,
            HistoryKind::Restarted,
            &was,
            1,
            Extra {
                next_step: Some(step.to_string()),
                by_operator: true,
                detail: from.map(|(entry, _)| format!("with the state of entry {entry}")),
                ..Extra::default()
            },
        );
        RestartFound::Restarted
    }
}
