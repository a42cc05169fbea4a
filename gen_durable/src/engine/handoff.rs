//! The way from the committer to the pickers for rows a group commit claimed into the
//! gate slots it freed (`store::pg::handoff`): one channel per queue, open while its
//! picker claims. A picker that stops claiming closes its channel and releases what is in
//! it; rows the committer cannot deliver it releases itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::store::pg::claim::Claimed;
use crate::store::pg::handoff::HandoffParams;

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
