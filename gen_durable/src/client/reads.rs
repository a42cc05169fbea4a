//! Reading an instance: [`Client::wait`] until it settles, [`Client::explain`] why it is
//! where it is.

use super::Client;
use crate::client::wait::Wait;
use crate::model::answers::not_found;
use crate::model::error::Result;
use crate::model::explain::{ExplainFacts, Explanation};
use crate::model::target::Target;
use crate::store::pg;

impl Client {
    /// Waits for an instance, named by id or by key, to settle: `done`, `failed`, or
    /// parked on a signal or on children; at the deadline (`.timeout(d)`, default 5 s)
    /// it answers [`Settled::Busy`](crate::Settled::Busy) — wait again. `.until_terminal()` waits through parked
    /// states. A key names its holder or, once none holds it, the newest instance
    /// inserted with it; a key no instance ever had is
    /// [`Error::KeyNotFound`](crate::Error::KeyNotFound).
    ///
    /// ```no_run
    /// # async fn demo(gd: gen_durable::Client) -> gen_durable::Result<()> {
    /// use gen_durable::{Key, Settled};
    /// use std::time::Duration;
    /// match gd.wait(Key("order:42")).timeout(Duration::from_secs(2)).await? {
    ///     Settled::Done(result) => println!("200 {result}"),
    ///     Settled::Busy { .. } | Settled::Parked { .. } => println!("202, ask again"),
    ///     Settled::Failed(error) => println!("500 {error}"),
    ///     Settled::Gone => println!("404"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn wait(&self, target: impl Into<Target>) -> Wait<'_> {
        Wait::new(self, target.into())
    }

    /// Why `target` (an id or a [`crate::Key`]) is not running, or what it is doing: one
    /// typed [`Reason`](crate::Reason) with its evidence, read from the database in one
    /// statement (two for a key) whose counts are bounded, so it is as fast on a table of
    /// millions of rows. `Display` gives one English line, e.g. `awaiting signal "paid"
    /// until 2026-12-02 14:00:00 UTC (in 3 min); 1 unrelated signal in the inbox:
    /// "shipped"`. A key names its holder or, once none holds it, the newest instance
    /// inserted with it. [`crate::Error::NotFound`] / [`crate::Error::KeyNotFound`] when
    /// there is none.
    ///
    /// ```no_run
    /// # async fn f(gd: gen_durable::Client) -> gen_durable::Result<()> {
    /// use gen_durable::{Key, Reason};
    /// let why = gd.explain(Key("order:42")).await?;
    /// println!("{why}");
    /// if let Reason::NoNodeForQueue { .. } = why.reason {
    ///     eprintln!("start a node that picks from queue {:?}", why.queue);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn explain(&self, target: impl Into<Target>) -> Result<Explanation> {
        let target = target.into();
        crate::model::validate::check_target(&target)?;
        let db = self.pooler.pool(&self.pool);
        let id = match &target {
            Target::Id(id) => Some(*id),
            Target::Key(key) => pg::wait::id_by_key(db, key).await?,
        };
        let Some(id) = id else {
            return Err(not_found(&target));
        };
        pg::explain::facts(db, id, self.clock.now_param())
            .await?
            .map(ExplainFacts::explain)
            .ok_or_else(|| not_found(&target))
    }
}
