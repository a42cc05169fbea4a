//! The kit's INSERT (`gen_durable::store::pg::insert`): rows in unique-key order, a row
//! whose key is occupied dropped, and what the database's foreign keys and checks refuse
//! of a row before anything is written.

use chrono::{DateTime, Utc};
use gen_durable::backend::NewInstance;
use gen_durable::{Error, Status};

use super::{after, guard, Row, Store};

impl Store {
    /// INSERT: rows go in in unique-key order (NULLS LAST, then input order), which is
    /// also the order their ids are drawn in; a row whose key is occupied — by a stored
    /// row or an earlier row of the batch — is dropped. Returns the inserted ids,
    /// ascending, each with its parent.
    pub(crate) fn insert(
        &mut self,
        rows: Vec<(NewInstance, Option<i64>)>,
        now: DateTime<Utc>,
    ) -> Vec<(i64, Option<i64>)> {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| {
            let (ka, kb) = (&rows[a].0.unique_key, &rows[b].0.unique_key);
            match (ka, kb) {
                (Some(x), Some(y)) => x.cmp(y).then(a.cmp(&b)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a.cmp(&b),
            }
        });
        let mut slots: Vec<Option<(NewInstance, Option<i64>)>> =
            rows.into_iter().map(Some).collect();
        let mut inserted = Vec::new();
        for i in order {
            let (new, parent) = slots[i].take().expect("each row once");
            if let Some(key) = guard(&new.unique_key, &new.unique_scope, Status::Runnable) {
                if self.rows.values().any(|r| r.guard() == Some(key)) {
                    continue;
                }
            }
            self.last_id += 1;
            let id = self.last_id;
            let eligible_at = new
                .eligible_at
                .unwrap_or_else(|| after(now, new.delay.unwrap_or_default()));
            self.rows.insert(
                id,
                Row {
                    id,
                    fsm: new.fsm,
                    version: new.version,
                    rate_step: new.rate_limit.as_ref().map(|_| new.step.clone()),
                    step: new.step,
                    status: Status::Runnable,
                    state: new.state,
                    result: None,
                    awaits: Vec::new(),
                    await_deadline: None,
                    queue: new.queue,
                    priority: new.priority,
                    partition_key: new.partition_key,
                    gate: new.gate,
                    rate_limit: new.rate_limit,
                    rate_weight: new.rate_weight,
                    rate_paid: false,
                    eligible_at,
                    attempt: 0,
                    last_error: None,
                    parent_id: parent,
                    children_pending: 0,
                    unique_key: new.unique_key,
                    unique_scope: new.unique_scope,
                    reaps: 0,
                    max_reaps: new.max_reaps,
                    claimed_at: None,
                    updated_at: now,
                    inserted_at: now,
                },
            );
            inserted.push((id, parent));
        }
        inserted.sort_unstable();
        inserted
    }

    /// What the database refuses of a row naming `gate` and rate limit `rate` (its name
    /// and weight): the foreign keys to the declared gates and limits, and the row's
    /// check of a weight above the burst.
    pub(crate) fn refusal(&self, gate: Option<&str>, rate: Option<(&str, f64)>) -> Option<Error> {
        if let Some(g) = gate.filter(|g| !self.gates.contains_key(*g)) {
            return Some(Error::UnknownGate { name: g.into() });
        }
        let (name, weight) = rate?;
        match self.rate_limit(name) {
            None => Some(Error::UnknownRateLimit { name: name.into() }),
            Some((_, burst)) if weight > burst => Some(Error::InvalidInput {
                what: "rate limit weight",
                reason: "exceeds its rate limit's burst, so its tokens could never all be \
                         there at once"
                    .into(),
            }),
            Some(_) => None,
        }
    }

    /// [`Store::refusal`] of a row to insert.
    pub(crate) fn refusal_of(&self, r: &NewInstance) -> Option<Error> {
        let rate = r
            .rate_limit
            .as_ref()
            .map(|(n, _)| (n.as_str(), r.rate_weight));
        self.refusal(r.gate.as_deref(), rate)
    }
}
