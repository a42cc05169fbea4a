//! The way from the committer to the pickers for rows a group commit claimed into the
//! gate slots it freed (`store::pg::handoff`): one channel per queue, open while its
//! picker claims. A picker that stops claiming closes its channel and releases what is in
//! it; rows the committer cannot deliver it releases itself. Also the committer's side of
//! it: which rows of a commit hold a gate's slot, and what becomes of the rows handed on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::engine::committer::{CommitRequest, Committer, HeldKey, Verdict};
use crate::engine::shared::on_conn;
use crate::store::pg::claim::Claimed;
use crate::store::pg::handoff::{Freed, HandoffParams};
use crate::store::pg::lease;

/// Rows handed to one queue's picker by one commit.
pub(crate) type Handed = mpsc::UnboundedReceiver<Vec<Claimed>>;

/// The pickers that take handed-off rows, and what the hand-off claims for.
#[derive(Debug)]
pub(crate) struct Handoffs {
    queues: Mutex<HashMap<Arc<str>, mpsc::UnboundedSender<Vec<Claimed>>>>,
    /// The `(name, version)` pairs this node runs, as the claim's parameters.
    pub(crate) names: Vec<String>,
    pub(crate) versions: Vec<i32>,
    pub(crate) lease_ttl_ms: i64,
}

impl Handoffs {
    pub(crate) fn new(names: Vec<String>, versions: Vec<i32>, lease_ttl_ms: i64) -> Self {
        Handoffs {
            queues: Mutex::default(),
            names,
            versions,
            lease_ttl_ms,
        }
    }

    /// Opens `queue`'s channel: its picker reads it while it claims.
    pub(crate) fn open(&self, queue: &Arc<str>) -> Handed {
        let (tx, rx) = mpsc::unbounded_channel();
        self.queues
            .lock()
            .expect("hand-off table")
            .insert(queue.clone(), tx);
        rx
    }

    /// A channel that never delivers: for a queue without the hand-off.
    pub(crate) fn closed() -> Handed {
        mpsc::unbounded_channel().1
    }

    /// Whether `queue`'s picker takes handed-off rows now.
    pub(crate) fn open_for(&self, queue: &str) -> bool {
        self.queues
            .lock()
            .expect("hand-off table")
            .get(queue)
            .is_some_and(|tx| !tx.is_closed())
    }

    /// Hands `rows` to their queues' pickers; returns those no picker took.
    pub(crate) fn deliver(&self, rows: Vec<(String, Claimed)>) -> Vec<Claimed> {
        let mut by_queue: HashMap<String, Vec<Claimed>> = HashMap::new();
        for (queue, row) in rows {
            by_queue.entry(queue).or_default().push(row);
        }
        let queues = self.queues.lock().expect("hand-off table");
        let mut left = Vec::new();
        for (queue, rows) in by_queue {
            match queues.get(queue.as_str()) {
                Some(tx) => {
                    if let Err(back) = tx.send(rows) {
                        left.extend(back.0);
                    }
                }
                None => left.extend(rows),
            }
        }
        left
    }

    /// The hand-off's parameters for a commit by `node` at `now`.
    pub(crate) fn params<'a>(
        &'a self,
        node: &'a str,
        now: Option<chrono::DateTime<chrono::Utc>>,
    ) -> HandoffParams<'a> {
        HandoffParams {
            names: &self.names,
            versions: &self.versions,
            node,
            lease_ttl_ms: self.lease_ttl_ms,
            now,
        }
    }
}

impl Committer {
    /// The slot the claim of `id` holds, to hand on if its outcome ends the claim: when
    /// it holds a gate's key and its queue's picker takes handed-off rows.
    pub(super) fn gated(&self, queue: &str, id: i64, key: Option<&HeldKey>) -> Option<Freed> {
        let key = key?;
        let gate = key.gate.as_ref()?;
        self.handoffs.open_for(queue).then(|| Freed {
            id,
            queue: queue.to_string(),
            gate: gate.clone(),
            key: key.key.clone(),
            slot: key.slot,
        })
    }

    /// Wakes the queues of the keys this commit freed and did not hand on: their next rows
    /// may run now, on any node (this node's pickers know already).
    pub(super) fn wake_for_freed_keys(&self, reqs: &[CommitRequest], verdicts: &[Verdict]) {
        let mut queues: Vec<&str> = reqs
            .iter()
            .zip(verdicts)
            .filter(|(r, v)| {
                r.key.is_some()
                    && matches!(v, Verdict::Reply(Ok(reply))
                        if reply.committed && !reply.continued && !reply.handed_off)
            })
            .map(|(r, _)| &*r.queue)
            .collect();
        if queues.is_empty() {
            return;
        }
        queues.sort_unstable();
        queues.dedup();
        self.notifier.wake(queues);
    }

    /// Sends the rows a commit claimed into freed gate slots to their pickers, and marks
    /// as handed off the outcomes whose slot went on (as many per key as rows took one),
    /// so their pickers do not claim for them. Rows no picker takes any more (it stopped
    /// claiming meanwhile) are released.
    pub(super) async fn hand_on(
        &self,
        reqs: &[CommitRequest],
        verdicts: &mut [Verdict],
        handed: Vec<(String, Claimed)>,
    ) {
        let mut taken: HashMap<(&str, &str, &str), usize> = HashMap::new();
        for (queue, row) in &handed {
            if let (Some(gate), Some(key)) = (&row.gate, &row.partition_key) {
                *taken.entry((queue, gate, key)).or_default() += 1;
            }
        }
        for (r, v) in reqs.iter().zip(verdicts.iter_mut()) {
            let (Some(held), Verdict::Reply(Ok(reply))) = (&r.key, v) else {
                continue;
            };
            let Some(gate) = &held.gate else {
                continue;
            };
            if !reply.committed || reply.continued {
                continue;
            }
            if let Some(n) = taken.get_mut(&(&*r.queue, gate.as_str(), held.key.as_str())) {
                if *n > 0 {
                    *n -= 1;
                    reply.handed_off = true;
                }
            }
        }
        self.deliver(handed).await;
    }

    /// Sends handed-off rows to their pickers, and releases those no picker takes.
    pub(super) async fn deliver(&self, handed: Vec<(String, Claimed)>) {
        let left = self.handoffs.deliver(handed);
        if left.is_empty() {
            return;
        }
        let leases: Vec<(i64, i64)> = left.iter().map(|r| (r.id, r.lease_epoch)).collect();
        let (node, now) = (self.node_id.as_str(), self.db.now());
        if let Err(e) = on_conn!(self.db, |c| lease::release(c, &leases, node, now)) {
            tracing::warn!(target: "gen_durable::commit", error = %e,
                "release of handed-off rows failed; they return when their leases expire");
        }
    }
}
