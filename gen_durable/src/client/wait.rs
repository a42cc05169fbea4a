//! `Client::wait`: wait for an instance to settle, from a request handler.
//!
//! The answer is always read from the row; wake-ups only shorten the wait. Two things
//! wake a waiter: an engine in the same process, after it commits an outcome of that
//! instance (a call to [`wake`], free when nobody waits), and the client's probe — one
//! `SELECT … WHERE id = ANY($1)` per tick for every id its callers wait on, run only
//! while someone waits — which sees commits made anywhere. There is no NOTIFY per
//! commit: a NOTIFY serializes commits.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::Client;
use crate::model::answers::not_found;
use crate::model::error::Result;
use crate::model::rows::WaitRow;
use crate::model::target::Target;
use crate::store::pg;
use crate::telemetry::Event;
use crate::{Pooler, Status};

/// How long `wait` waits unless told: 5 s.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

/// How often a client's probe looks at the rows its callers wait on: 25 ms.
pub const DEFAULT_WAIT_TICK: Duration = Duration::from_millis(25);

/// A waiter reads its row every this many ticks even if nothing woke it (1 s at the
/// default tick): a probe that failed costs that much latency at most.
const RECHECK_TICKS: u32 = 40;

/// Where an instance stands when a wait returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// Finished with this result.
    Done(Value),
    /// Failed for good with this `last_error`.
    Failed(String),
    /// Parked: it will not move until a signal (or its timeout) or its children. Not
    /// returned by a wait `.until_terminal()`.
    Parked {
        /// The step it runs when it moves on.
        step: String,
        /// What it waits for.
        awaiting: Awaiting,
    },
    /// The wait's deadline passed while the instance was still working (runnable,
    /// executing, in backoff — or parked, for a wait `.until_terminal()`): wait again.
    Busy {
        /// Its status.
        status: Status,
        /// Its step.
        step: String,
        /// Its attempt at that step.
        attempt: i32,
    },
    /// No such instance (never inserted, or collected).
    Gone,
}

/// What a parked instance waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Awaiting {
    /// Any of these signal names.
    Signals(Vec<String>),
    /// This many children still live.
    Children(i32),
}

impl Settled {
    /// Its name in events: `done`, `failed`, `parked`, `busy` or `gone`.
    pub fn name(&self) -> &'static str {
        match self {
            Settled::Done(_) => "done",
            Settled::Failed(_) => "failed",
            Settled::Parked { .. } => "parked",
            Settled::Busy { .. } => "busy",
            Settled::Gone => "gone",
        }
    }
}

impl WaitRow {
    /// The answer if the row is settled for this wait, `None` if the wait goes on.
    pub fn settled(&self, until_terminal: bool) -> Option<Settled> {
        match self.status {
            Status::Done => Some(Settled::Done(self.result.clone().unwrap_or(Value::Null))),
            Status::Failed => Some(Settled::Failed(self.last_error.clone().unwrap_or_default())),
            Status::AwaitingSignal if !until_terminal => Some(Settled::Parked {
                step: self.step.clone(),
                awaiting: Awaiting::Signals(self.awaits.clone()),
            }),
            Status::AwaitingChildren if !until_terminal => Some(Settled::Parked {
                step: self.step.clone(),
                awaiting: Awaiting::Children(self.children_pending),
            }),
            _ => None,
        }
    }

    /// The answer once the deadline has passed.
    pub fn busy(&self) -> Settled {
        Settled::Busy {
            status: self.status,
            step: self.step.clone(),
            attempt: self.attempt,
        }
    }
}

/// A pending wait; see [`Client::wait`].
#[derive(Debug)]
#[must_use = "a wait does nothing until awaited"]
pub struct Wait<'c> {
    client: &'c Client,
    target: Target,
    timeout: Duration,
    until_terminal: bool,
    /// The shard of a [`crate::ShardedClient`] it reads, named by its database errors.
    shard: Option<usize>,
}

impl<'c> Wait<'c> {
    pub(crate) fn new(client: &'c Client, target: Target) -> Self {
        Wait {
            client,
            target,
            timeout: DEFAULT_WAIT,
            until_terminal: false,
            shard: None,
        }
    }

    /// A wait on shard `shard` of a [`crate::ShardedClient`]: its database errors name it.
    pub(crate) fn on_shard(mut self, shard: usize) -> Self {
        self.shard = Some(shard);
        self
    }

    /// Waits at most this long (default 5 s), then answers [`Settled::Busy`]. The
    /// deadline bounds its database reads too: if one has not answered by then (a
    /// saturated pool, a database that does not answer), the wait returns at the
    /// deadline, with `Busy` as of its last read, or, if no read answered, with
    /// [`Error::Database`](crate::Error::Database)`(PoolTimedOut)`. A zero timeout reads
    /// once, as long as that takes the pool.
    /// [`Duration::MAX`] (or any time too far to add to now) waits until the instance
    /// settles.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Waits through parked states too: only `done` or `failed` (or the deadline) end it.
    pub fn until_terminal(mut self) -> Self {
        self.until_terminal = true;
        self
    }

    async fn run(self) -> Result<Settled> {
        let started = Instant::now();
        let mut id = None;
        let answer = self
            .answer(&mut id)
            .await
            .map_err(|e| e.on_shard(self.shard));
        self.client.telemetry().emit(Event::WaitStop {
            duration: started.elapsed(),
            id,
            outcome: answer.as_ref().map_or("error", Settled::name),
        });
        answer
    }

    /// The answer; `resolved` is the id once the target is resolved.
    async fn answer(&self, resolved: &mut Option<i64>) -> Result<Settled> {
        crate::model::validate::check_target(&self.target)?;
        let (pool, pooler) = (self.client.pool(), self.client.pooler());
        // None: no deadline (R4B-5: `Duration::MAX` overflowed the addition).
        let deadline = Instant::now().checked_add(self.timeout);
        let forever = deadline.is_none();
        let id = match &self.target {
            Target::Id(id) => *id,
            Target::Key(key) => {
                let lookup = async {
                    let mut conn = connection(pool, forever).await?;
                    pg::wait::id_by_key(pooler.alone(&mut *conn), key).await
                };
                match within(first_read(deadline), lookup).await {
                    None => return Err(unanswered()),
                    Some(found) => match found? {
                        Some(id) => id,
                        None => return Err(not_found(&self.target)),
                    },
                }
            }
        };
        *resolved = Some(id);
        // Registered before the first read, so a commit between the read and the sleep
        // leaves its wake-up behind.
        let waiting = self.client.waiters().register(id, !self.until_terminal);
        let mut last = None;
        loop {
            let read = async {
                let mut conn = connection(pool, forever).await?;
                pg::wait::read(pooler.alone(&mut *conn), id).await
            };
            // Each read ends by the deadline (R4B-4): `Busy` as of the last read, in time.
            let bound = match last {
                None => first_read(deadline),
                Some(_) => deadline,
            };
            let Some(read) = within(bound, read).await else {
                return last.map(|row: WaitRow| row.busy()).ok_or_else(unanswered);
            };
            let Some(row) = read? else {
                return Ok(Settled::Gone);
            };
            if let Some(settled) = row.settled(self.until_terminal) {
                return Ok(settled);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(row.busy());
            }
            let recheck = Instant::now() + self.client.waiters().recheck();
            let recheck = deadline.map_or(recheck, |d| recheck.min(d));
            tokio::select! {
                _ = waiting.entry.notify.notified() => {}
                _ = tokio::time::sleep_until(recheck) => {}
            }
            last = Some(row);
        }
    }
}

/// The bound of a wait's first read of its row (and of a key's lookup before it): its
/// deadline, unless that has passed already (a zero timeout, which reads once): then
/// none but the pool's own. Every later read is bounded by the deadline.
fn first_read(deadline: Option<Instant>) -> Option<Instant> {
    deadline.filter(|&d| d > Instant::now())
}

/// `read`'s output, or `None` if `bound` passes first (the read is dropped: sqlx gives
/// back or closes its connection).
async fn within<T>(bound: Option<Instant>, read: impl Future<Output = T>) -> Option<T> {
    match bound {
        Some(d) => tokio::time::timeout_at(d, read).await.ok(),
        None => Some(read.await),
    }
}

/// A connection from the pool; a wait without a deadline (`forever`) asks again when the
/// pool's acquire timeout passes.
async fn connection(
    pool: &sqlx::PgPool,
    forever: bool,
) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
    loop {
        match pool.acquire().await {
            Err(sqlx::Error::PoolTimedOut) if forever => continue,
            acquired => return Ok(acquired?),
        }
    }
}

/// A wait whose deadline passed before its first read answered.
fn unanswered() -> crate::Error {
    crate::Error::Database(sqlx::Error::PoolTimedOut)
}

impl<'c> IntoFuture for Wait<'c> {
    type Output = Result<Settled>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Settled>> + Send + 'c>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// One caller waiting on one id.
#[derive(Debug)]
struct Entry {
    notify: Notify,
    /// Woken by a parked row too (not a wait `.until_terminal()`).
    wants_parked: bool,
}

/// The ids a client's callers wait on, and its probe.
#[derive(Debug)]
pub(crate) struct Waiters {
    pool: sqlx::PgPool,
    pooler: Pooler,
    tick: Duration,
    tasks: tokio_util::task::TaskTracker,
    state: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<i64, Vec<Arc<Entry>>>,
    probing: bool,
}

/// Every client's table, for [`wake`]; and how many callers wait in all, so that a
/// commit pays one atomic load when nobody does.
static TABLES: LazyLock<Mutex<Vec<Weak<Waiters>>>> = LazyLock::new(Mutex::default);
static WAITING: AtomicUsize = AtomicUsize::new(0);

impl Waiters {
    pub(crate) fn new(
        pool: sqlx::PgPool,
        pooler: Pooler,
        tick: Duration,
        tasks: tokio_util::task::TaskTracker,
    ) -> Arc<Self> {
        let me = Arc::new(Waiters {
            pool,
            pooler,
            tick,
            tasks,
            state: Mutex::default(),
        });
        let mut tables = TABLES.lock().expect("wait tables");
        tables.retain(|t| t.strong_count() > 0);
        tables.push(Arc::downgrade(&me));
        me
    }

    pub(crate) fn tick(&self) -> Duration {
        self.tick
    }

    fn recheck(&self) -> Duration {
        self.tick.saturating_mul(RECHECK_TICKS)
    }

    fn register(self: &Arc<Self>, id: i64, wants_parked: bool) -> Registration {
        let entry = Arc::new(Entry {
            notify: Notify::new(),
            wants_parked,
        });
        let start = {
            let mut t = self.state.lock().expect("waiters");
            t.entries.entry(id).or_default().push(entry.clone());
            !std::mem::replace(&mut t.probing, true)
        };
        WAITING.fetch_add(1, Ordering::Relaxed);
        if start {
            self.tasks.spawn(self.clone().probe());
        }
        Registration {
            table: self.clone(),
            id,
            entry,
        }
    }

    /// Wakes the callers waiting on `id`; if `parked` (the row is parked, not
    /// terminal), only those a parked row answers.
    fn wake(&self, id: i64, parked: bool) {
        let t = self.state.lock().expect("waiters");
        for e in t.entries.get(&id).into_iter().flatten() {
            if !parked || e.wants_parked {
                e.notify.notify_one();
            }
        }
    }

    /// Every tick while someone waits: one statement for all the ids, then wake the
    /// callers whose row settled (or vanished).
    async fn probe(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.tick).await;
            let ids: Vec<i64> = {
                let mut t = self.state.lock().expect("waiters");
                if t.entries.is_empty() {
                    t.probing = false;
                    return;
                }
                t.entries.keys().copied().collect()
            };
            let Ok(rows) = pg::wait::probe(self.pooler.pool(&self.pool), &ids).await else {
                // A failed probe skips a tick; waiters still re-read every second.
                continue;
            };
            let statuses: HashMap<i64, Status> = rows.into_iter().collect();
            for id in ids {
                match statuses.get(&id) {
                    None => self.wake(id, false),
                    Some(s) if s.is_terminal() => self.wake(id, false),
                    Some(Status::AwaitingSignal | Status::AwaitingChildren) => self.wake(id, true),
                    Some(_) => {}
                }
            }
        }
    }
}

/// A caller's place in its client's table, given back when the wait ends.
struct Registration {
    table: Arc<Waiters>,
    id: i64,
    entry: Arc<Entry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
        let mut t = self.table.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = t.entries.get_mut(&self.id) {
            list.retain(|e| !Arc::ptr_eq(e, &self.entry));
            if list.is_empty() {
                t.entries.remove(&self.id);
            }
        }
    }
}

/// Tells the callers of this process waiting on instance `id` that it committed an
/// outcome: they re-read its row. One atomic load when nobody waits.
pub(crate) fn wake(id: i64) {
    if WAITING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let tables: Vec<Arc<Waiters>> = TABLES
        .lock()
        .expect("wait tables")
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for t in tables {
        // Whatever it committed: every waiter reads the row and decides.
        t.wake(id, false);
    }
}
