//! The operator actions on instances: [`Client::cancel`] and [`Client::retry`].

use super::Client;
use crate::model::answers::Cancelled;
use crate::model::error::Result;
use crate::store::pg;

impl Client {
    /// Cancels instance `id`: a runnable or parked instance
    /// is `failed` ("cancelled") at once; an executing one after its current step, whose
    /// `ctx.cancelled()` resolves meanwhile. Live children are cancelled with it.
    pub async fn cancel(&self, id: i64) -> Result<Cancelled> {
        let mut tx = self.pool.begin().await?;
        let conn = self.pooler.on(&mut *tx);
        let found = pg::control::cancel(conn, id, self.actor(), self.clock.now_param()).await?;
        tx.commit().await?;
        crate::client::wait::wake(id);
        found.answer(id)
    }

    /// Makes a `failed` instance run again at the step it failed in, with `attempt` 0.
    ///
    /// If that step was woken by a signal (or was cancelled while it awaited one), the
    /// instance awaits its signals again, with no deadline: the failure deleted its inbox,
    /// and the step would otherwise run with nothing awaited, as if its await had timed
    /// out. A step woken by its await's timeout runs again at once, as it did then.
    ///
    /// A child is retried only while its parent still waits for its children (it then
    /// waits for this one again); once the parent has gone on, the retry is refused with
    /// [`Error::ParentMovedOn`](crate::Error::ParentMovedOn). A parent that still has live
    /// children (cancelled while a child ran) waits for them again instead of running at once.
    pub async fn retry(&self, id: i64) -> Result<()> {
        // One statement; in a transaction so that it is one behind a pooler too.
        let mut tx = self.pool.begin().await?;
        let found = pg::control::retry(
            self.pooler.on(&mut *tx),
            id,
            self.actor(),
            self.clock.now_param(),
        )
        .await?;
        tx.commit().await?;
        found.answer(id)
    }
}
