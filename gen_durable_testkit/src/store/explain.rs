//! The facts of `TestKit::explain`, read from the in-memory rows as the statement
//! `EXPLAIN` of `gen_durable::store::pg::explain` reads them from the tables, bounds
//! included; `gen_durable::backend::ExplainFacts::explain` decides the reason for both.
//!
//! What the kit does not have, it does not report: there are no nodes (`nodes: None`):
//! the kit runs every FSM it knows, so
//! "no live node" is never its answer (a due row of an FSM it does not know makes
//! `run_until_idle` panic instead). A row claimed by `TestKit::claim` is held by node
//! [`KIT_NODE`], live, with a lease of [`KIT_LEASE`] from its claim.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gen_durable::backend::ExplainFacts;
use gen_durable::{ChildState, Holder, Status, EXPLAIN_COUNT_LIMIT, EXPLAIN_LIST_LIMIT};

use super::{after, Row, Store};

/// The node that holds the rows `TestKit::claim` claims.
pub const KIT_NODE: &str = "testkit";

/// The lease of a row `TestKit::claim` claims: the engine's default `lease_ttl`.
pub const KIT_LEASE: Duration = Duration::from_secs(30);

const LIST: usize = EXPLAIN_LIST_LIMIT as usize;

impl Row {
    /// The pick's order: `(priority, eligible_at, id)`.
    fn pick_order(&self) -> (i16, DateTime<Utc>, i64) {
        (self.priority, self.eligible_at, self.id)
    }
}

/// At most `EXPLAIN_COUNT_LIMIT`, as `count(*)` over `LIMIT $4`.
fn bounded(n: usize) -> i64 {
    (n as i64).min(EXPLAIN_COUNT_LIMIT)
}

impl Store {
    /// The facts of instance `id` at `now`; `None` if there is none.
    pub(crate) fn explain_facts(&self, id: i64, now: DateTime<Utc>) -> Option<ExplainFacts> {
        let r = self.rows.get(&id)?;
        let claimed_at = r.claimed_at.unwrap_or(now);
        let unrelated: Vec<String> = self
            .inbox(id)
            .into_iter()
            .filter(|s| !r.awaits.contains(&s.name))
            .map(|s| s.name)
            .collect();
        let mut names = unrelated.clone();
        names.sort();
        names.dedup();
        names.truncate(LIST);
        let waiting_on = self
            .children(id)
            .filter(|c| !c.status.is_terminal())
            .take(LIST)
            .map(|c| ChildState {
                id: c.id,
                fsm: c.fsm.clone(),
                step: c.step.clone(),
                status: c.status,
            })
            .collect();
        // A K = 1 key's holder; a gate key has K slots, not one holder.
        let holder = r
            .partition_key
            .as_ref()
            .filter(|_| r.gate.is_none())
            .and_then(|k| {
                self.rows
                    .values()
                    .find(|e| {
                        e.id != id
                            && e.status == Status::Executing
                            && e.gate.is_none()
                            && e.partition_key.as_ref() == Some(k)
                    })
                    .map(|e| Holder {
                        id: e.id,
                        step: e.step.clone(),
                        node: Some(KIT_NODE.to_string()),
                        lease_until: e.claimed_at.map(|t| after(t, KIT_LEASE)),
                    })
            });
        let ahead = self
            .rows
            .values()
            .filter(|a| a.queue == r.queue && a.status == Status::Runnable && a.eligible_at <= now)
            .filter(|a| a.pick_order() < r.pick_order())
            .count();
        Some(ExplainFacts {
            id,
            fsm: r.fsm.clone(),
            version: r.version,
            queue: r.queue.clone(),
            status: r.status,
            step: r.step.clone(),
            attempt: r.attempt,
            now,
            eligible_at: r.eligible_at,
            result: r.result.clone(),
            last_error: r.last_error.clone(),
            awaits: r.awaits.clone(),
            await_deadline: r.await_deadline,
            locked_by: r.claimed_at.map(|_| KIT_NODE.to_string()),
            lease_expires_at: r.claimed_at.map(|t| after(t, KIT_LEASE)),
            since: claimed_at,
            cancel_requested: false,
            node_live: true,
            node_seen_at: r.claimed_at.map(|_| now),
            unrelated: bounded(unrelated.len()),
            unrelated_names: names,
            children_pending: r.children_pending,
            children_total: bounded(self.children(id).count()),
            waiting_on,
            paused: self
                .paused
                .get(&r.queue)
                .map(|p| (p.paused_at, p.reason.clone())),
            partition_key: r.partition_key.clone(),
            holder,
            gate: r
                .gate
                .as_ref()
                .filter(|_| r.status == Status::Runnable)
                .and_then(|g| {
                    let limit = i64::from(self.gate(g)?);
                    let running = self
                        .rows
                        .values()
                        .filter(|e| {
                            e.status == Status::Executing
                                && e.gate.as_ref() == Some(g)
                                && e.partition_key == r.partition_key
                        })
                        .count() as i64;
                    Some((g.clone(), limit, running))
                }),
            rate_wait: r.rate_limit.clone().filter(|_| r.rate_paid),
            nodes: None,
            rows_ahead: bounded(ahead),
            recent: self
                .history
                .iter()
                .rev()
                .filter(|(i, _)| *i == id)
                .take(gen_durable::EXPLAIN_HISTORY_LIMIT as usize)
                .map(|(_, e)| (e.kind, e.step.clone(), e.error.clone()))
                .collect(),
        })
    }
}
