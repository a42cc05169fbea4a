//! Coalescing of wake-up notifications.
//!
//! Every transaction that sends a NOTIFY takes a global lock at commit and holds it
//! through the commit's WAL flush, so commits that notify are serialized: on the
//! development machine, 8 clients inserting one row each commit ~4,000 times a second
//! without NOTIFY and ~525 with it (pgbench, same table). A [`Notifier`] lets a statement
//! notify a queue at most once per window; a skipped notification is sent once at the
//! end of the window, so a burst still wakes the workers promptly while paying for one
//! NOTIFY per window instead of one per statement. Polling stays the source of truth.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use crate::store::pg::signal::notify_queue;

/// The default window: at most one notification per queue per 20 ms from one client
/// or engine.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_millis(20);

#[derive(Debug, Default)]
struct Slot {
    last: Option<Instant>,
    trailing: bool,
}

/// Decides, per queue, whether a statement sends its NOTIFY itself.
#[derive(Debug)]
pub(crate) struct Notifier {
    pool: PgPool,
    window: Duration,
    slots: Mutex<HashMap<String, Slot>>,
}

impl Notifier {
    pub(crate) fn new(pool: PgPool, window: Duration) -> Arc<Self> {
        Arc::new(Notifier {
            pool,
            window,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// Of `queues`, those a statement committing now should notify itself. For each
    /// queue left out, one notification is sent when its window ends.
    pub(crate) fn claim<'q>(
        self: &Arc<Self>,
        queues: impl IntoIterator<Item = &'q str>,
    ) -> Vec<String> {
        if self.window.is_zero() {
            return queues.into_iter().map(str::to_string).collect();
        }
        let now = Instant::now();
        let mut slots = self.slots.lock().expect("notifier lock");
        let mut allowed = Vec::new();
        for q in queues {
            let slot = slots.entry(q.to_string()).or_default();
            match slot.last {
                Some(last) if now < last + self.window => {
                    if !slot.trailing {
                        slot.trailing = true;
                        self.trailing(q.to_string(), last + self.window);
                    }
                }
                _ => {
                    slot.last = Some(now);
                    allowed.push(q.to_string());
                }
            }
        }
        allowed
    }

    fn trailing(self: &Arc<Self>, queue: String, at: Instant) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            {
                let mut slots = me.slots.lock().expect("notifier lock");
                let slot = slots.entry(queue.clone()).or_default();
                slot.trailing = false;
                slot.last = Some(Instant::now());
            }
            if let Err(e) = notify_queue(&me.pool, &queue).await {
                tracing::debug!(target: "gen_durable::notify", queue, error = %e, "trailing wake-up failed; polling covers it");
            }
        });
    }
}
