//! Paused queues in memory (`gen_durable::store::pg::pause`, `gd_queue_pauses`): pause,
//! resume, list. The kit's pick skips a paused queue.

use chrono::{DateTime, Utc};
use gen_durable::QueuePause;

use super::Store;

impl Store {
    /// PAUSE: true if `queue` was not paused; a paused queue keeps its first pause.
    pub(crate) fn pause(&mut self, queue: &str, reason: Option<&str>, now: DateTime<Utc>) -> bool {
        if self.paused.contains_key(queue) {
            return false;
        }
        let pause = QueuePause {
            queue: queue.to_string(),
            paused_at: now,
            reason: reason.map(str::to_string),
        };
        self.paused.insert(queue.to_string(), pause);
        true
    }

    /// RESUME: true if `queue` was paused.
    pub(crate) fn resume(&mut self, queue: &str) -> bool {
        self.paused.remove(queue).is_some()
    }

    /// PAUSED: the paused queues, by name.
    pub(crate) fn paused(&self) -> Vec<QueuePause> {
        self.paused.values().cloned().collect()
    }
}
