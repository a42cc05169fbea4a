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
use tokio_util::task::TaskTracker;

use crate::store::pg::signal::notify_queue;
use crate::store::pooler::Pooler;

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
    pooler: Pooler,
    window: Duration,
    slots: Mutex<HashMap<String, Slot>>,
    /// Where the trailing sends run: the owner's tracker (the engine's drain, or
    /// `Client::flush`, waits for them).
    tasks: TaskTracker,
}

impl Notifier {
    pub(crate) fn new(
        pool: PgPool,
        pooler: Pooler,
        window: Duration,
        tasks: TaskTracker,
    ) -> Arc<Self> {
        Arc::new(Notifier {
            pool,
            pooler,
            window,
            slots: Mutex::new(HashMap::new()),
            tasks,
        })
    }

    /// Its window.
    pub(crate) fn window(&self) -> Duration {
        self.window
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

    /// Wakes `queues` after the fact (no statement of the caller's sends it): at once for
    /// a queue whose window allows it, else once at the end of its window.
    pub(crate) fn wake<'q>(self: &Arc<Self>, queues: impl IntoIterator<Item = &'q str>) {
        for queue in self.claim(queues) {
            let me = self.clone();
            self.tasks.spawn(async move {
                if let Err(e) = notify_queue(me.pooler.pool(&me.pool), &queue).await {
                    tracing::debug!(target: "gen_durable::notify", queue, error = %e, "wake-up failed; polling covers it");
                }
            });
        }
    }

    fn trailing(self: &Arc<Self>, queue: String, at: Instant) {
        let me = self.clone();
        self.tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            {
                let mut slots = me.slots.lock().expect("notifier lock");
                let slot = slots.entry(queue.clone()).or_default();
                slot.trailing = false;
                slot.last = Some(Instant::now());
            }
            if let Err(e) = notify_queue(me.pooler.pool(&me.pool), &queue).await {
                tracing::debug!(target: "gen_durable::notify", queue, error = %e, "trailing wake-up failed; polling covers it");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gen_durable_testkit::TestDb;
    use sqlx::postgres::PgListener;

    /// A skipped wake-up is sent at the end of its window by a task of the owner's
    /// tracker, so whoever waits on the tracker (the engine's drain, `Client::flush`)
    /// waits for it.
    #[tokio::test]
    async fn the_trailing_wake_up_runs_on_the_owners_tracker() {
        let tdb = TestDb::new().await;
        let mut listener = PgListener::connect_with(tdb.pool()).await.unwrap();
        listener.listen("gd_wake").await.unwrap();
        let tasks = TaskTracker::new();
        tasks.close();
        let notifier = Notifier::new(
            tdb.pool().clone(),
            Pooler::None,
            Duration::from_secs(1),
            tasks.clone(),
        );

        assert_eq!(
            notifier.claim(["q"]),
            ["q"],
            "the first statement notifies itself"
        );
        assert!(
            notifier.claim(["q"]).is_empty(),
            "the second is left to the window's end"
        );
        assert_eq!(tasks.len(), 1, "one trailing send, tracked");
        tokio::time::timeout(Duration::from_secs(10), tasks.wait())
            .await
            .expect("the trailing send ends after its window");
        let heard = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("the trailing wake-up was sent")
            .unwrap();
        assert_eq!(heard.payload(), "q");
    }
}
