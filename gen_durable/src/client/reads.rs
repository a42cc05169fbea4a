//! Reading an instance: [`Client::wait`] until it settles, [`Client::explain`] why it is
//! where it is, [`Client::history`] how it got there.

use super::Client;
use crate::client::wait::Wait;
use crate::model::answers::not_found;
use crate::model::error::{Error, Result};
use crate::model::explain::{ExplainFacts, Explanation};
use crate::model::history::HistoryPage;
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

    /// The history of instance `id`, oldest first: an entry per step its FSM's history
    /// level records (`#[durable_fsm(history = …)]`: the step, its attempt, when it began
    /// and was committed, on which node, its outcome, error, consumed signals, spawned
    /// children, the step it led to, and at level `full` the state it began with), and
    /// one per lost lease and release. Each entry was written in the transaction that
    /// committed what it records: the history is exactly what committed.
    ///
    /// A page holds up to `limit` entries (1 to [`HISTORY_PAGE_MAX`]) after entry `after`
    /// (`None`: from the first); [`HistoryPage::next`] is the `after` of the next page.
    /// Entries are kept for the engine's history retention, and outlive their instance.
    /// [`Error::NotFound`] for an id with neither an instance nor an entry.
    ///
    /// ```no_run
    /// # async fn f(gd: gen_durable::Client, id: i64) -> gen_durable::Result<()> {
    /// let mut after = None;
    /// loop {
    ///     let page = gd.history(id, after, 100).await?;
    ///     for e in &page.entries {
    ///         println!("{} {} attempt {}: {}", e.at, e.step, e.attempt, e.kind);
    ///     }
    ///     match page.next {
    ///         Some(next) => after = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn history(&self, id: i64, after: Option<i64>, limit: usize) -> Result<HistoryPage> {
        if limit == 0 || limit > HISTORY_PAGE_MAX {
            return Err(Error::InvalidInput {
                what: "history page size",
                reason: format!("{limit} entries; a page holds 1 to {HISTORY_PAGE_MAX}"),
            });
        }
        let db = self.pooler.pool(&self.pool);
        pg::history::page(db, id, after.unwrap_or(0), limit).await
    }
}

/// The most entries one page of [`Client::history`] holds.
pub const HISTORY_PAGE_MAX: usize = 1000;
