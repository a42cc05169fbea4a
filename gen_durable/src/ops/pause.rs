//! Pausing a queue cluster-wide: `Client::pause_queue`, `resume_queue`, `paused_queues`.

use crate::model::error::Result;
use crate::model::rows::QueuePause;
use crate::model::validate;
use crate::store::pg;
use crate::Client;

/// Checks a queue name (not empty, a key PostgreSQL can store) and a pause's reason (no
/// NUL): the client's and the testkit's check.
#[doc(hidden)]
pub fn check_queue(queue: &str, reason: Option<&str>) -> Result<()> {
    if queue.is_empty() {
        return Err(crate::Error::InvalidInput {
            what: "queue",
            reason: "is empty".into(),
        });
    }
    validate::key("queue", queue)?;
    if let Some(r) = reason {
        validate::text("reason", r)?;
    }
    Ok(())
}

impl Client {
    /// Pauses `queue` on every node: from the next pick of each node (within one poll
    /// interval) no row of the queue is claimed, until [`Client::resume_queue`]. Rows
    /// already claimed finish their step; inserts, signals and await timeouts go on, so
    /// work piles up as runnable rows. Durable (a row in `gd_queue_pauses`) and
    /// idempotent: returns true if the queue was not paused yet; pausing it again keeps
    /// its first `paused_at` and reason. An empty queue name, or one with a NUL
    /// character, is [`crate::Error::InvalidInput`].
    pub async fn pause_queue(&self, queue: &str, reason: Option<&str>) -> Result<bool> {
        check_queue(queue, reason)?;
        let db = self.pooler().pool(self.pool());
        pg::pause::pause(db, queue, reason, self.clock().now_param()).await
    }

    /// Resumes a paused `queue` and wakes its pickers on every node at once (a wake-up
    /// NOTIFY at commit). Returns true if it was paused; false (and nothing sent) if not.
    pub async fn resume_queue(&self, queue: &str) -> Result<bool> {
        check_queue(queue, None)?;
        let mut tx = self.pool().begin().await?;
        let resumed = pg::pause::resume(self.pooler().on(&mut *tx), queue).await?;
        tx.commit().await?;
        Ok(resumed)
    }

    /// Every paused queue, by name.
    pub async fn paused_queues(&self) -> Result<Vec<QueuePause>> {
        pg::pause::paused(self.pooler().pool(self.pool())).await
    }
}
