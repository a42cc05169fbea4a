//! Inserting instances and delivering signals. No engine is needed.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::{PgExecutor, PgPool};
use tokio_util::task::TaskTracker;

use crate::answers::{inserted, not_found, Cancelled, Delivery};
use crate::clock::Clock;
use crate::error::Result;
use crate::explain::{ExplainFacts, Explanation};
use crate::fsm::Fsm;
use crate::group_insert::{GroupInsert, Target as GroupTarget};
use crate::migrate_instances::{MigrateOptions, MigrationReport};
use crate::notify::Notifier;
use crate::options::InsertOptions;
use crate::pooler::Pooler;
use crate::registry::{FsmEntry, Registry};
use crate::runtime::NewInstance;
use crate::store::pg;
use crate::target::Target;
use crate::telemetry::{Event, Telemetry};
use crate::wait::{Wait, Waiters, DEFAULT_WAIT_TICK};

/// Default limit on a signal payload's JSON size: 1 MiB.
pub const DEFAULT_MAX_SIGNAL_PAYLOAD: usize = 1 << 20;

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// `.await` on a pending operation runs its `execute` on the client's pool.
macro_rules! into_future_on_pool {
    ($ty:ty, $out:ty $(, $g:ident : $bound:path)?) => {
        impl<'c $(, $g: $bound)?> IntoFuture for $ty {
            type Output = Result<$out>;
            type IntoFuture = BoxFut<'c, $out>;
            fn into_future(self) -> Self::IntoFuture {
                let (pool, pooler) = (self.client.pool.clone(), self.client.pooler);
                Box::pin(async move { self.execute(pooler.pool(&pool)).await })
            }
        }
    };
}

/// Inserts instances and delivers signals. Cheap to clone.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> gen_durable::Result<()> {
/// use gen_durable::Client;
/// let gd = Client::new(pool);
/// gd.signal(42, "payment_confirmed", serde_json::json!({ "amount": 100 }))
///     .dedup_key("evt-7")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    pool: PgPool,
    pooler: Pooler,
    clock: Clock,
    registry: Arc<Registry>,
    max_signal_payload: usize,
    notifier: Arc<Notifier>,
    /// Awaited keyless inserts, grouped into shared statements.
    group: Arc<GroupInsert>,
    /// The tasks this client runs in the background (grouped inserts, trailing
    /// wake-ups, the wait probe); closed from the start, so [`Client::flush`] waits until
    /// it is empty.
    tasks: TaskTracker,
    /// The instances its callers wait on (`wait`), and their probe.
    waiters: Arc<Waiters>,
    /// The handlers of its events (`wait.stop`).
    telemetry: Telemetry,
}

impl Client {
    /// A client on `pool`, knowing every FSM linked into the binary (for `insert_json`).
    pub fn new(pool: PgPool) -> Self {
        let tasks = TaskTracker::new();
        tasks.close();
        Client {
            waiters: Waiters::new(pool.clone(), Pooler::None, DEFAULT_WAIT_TICK, tasks.clone()),
            notifier: Notifier::new(
                pool.clone(),
                Pooler::None,
                crate::notify::DEFAULT_WINDOW,
                tasks.clone(),
            ),
            pool,
            pooler: Pooler::None,
            clock: Clock::database(),
            registry: Arc::new(Registry::linked()),
            max_signal_payload: DEFAULT_MAX_SIGNAL_PAYLOAD,
            group: Arc::default(),
            tasks,
            telemetry: Telemetry::default(),
        }
    }

    /// Waits for this client's background work (shared by its clones): grouped inserts
    /// in flight and wake-ups deferred by [`Client::with_notify_window`]. Call it before the
    /// runtime shuts down so that a deferred wake-up is sent rather than left to the
    /// engines' polling.
    pub async fn flush(&self) {
        self.tasks.wait().await;
    }

    /// Sends at most one insert wake-up per queue per `window` (default 20 ms; zero:
    /// one per statement). A NOTIFY serializes commits, so bursts of inserts coalesce
    /// theirs; a skipped wake-up is sent at the end of the window.
    pub fn with_notify_window(mut self, window: Duration) -> Self {
        self.notifier = Notifier::new(self.pool.clone(), self.pooler, window, self.tasks.clone());
        // Inserts are grouped only with calls that notify the same way.
        self.group = Arc::default();
        self
    }

    /// Tells the client what sits between it and Postgres (default [`Pooler::None`]);
    /// behind PgBouncer in transaction mode without prepared-statement support, pass
    /// [`Pooler::Transaction`]. Then give the `execute(db)` forms a transaction
    /// (`&mut *tx`), not the pool: `.await` handles the pool itself.
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        let window = self.notifier.window();
        self.notifier = Notifier::new(self.pool.clone(), pooler, window, self.tasks.clone());
        self.waiters = Waiters::new(
            self.pool.clone(),
            pooler,
            self.waiters.tick(),
            self.tasks.clone(),
        );
        self.group = Arc::default();
        self
    }

    /// Uses `clock` for `$now` in every statement (tests only; see [`Clock`]).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        // Inserts are grouped only with calls on the same clock.
        self.group = Arc::default();
        self
    }

    /// Uses `registry` to validate `insert_json` instead of the linked FSMs.
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = Arc::new(registry);
        self
    }

    /// Sets the largest signal payload accepted, in bytes of JSON (default 1 MiB).
    pub fn with_max_signal_payload(mut self, bytes: usize) -> Self {
        self.max_signal_payload = bytes;
        self
    }

    /// Probes the rows its callers [`wait`](Client::wait) on every `tick` (default 25 ms),
    /// one statement for all of them, and only while someone waits; each waiter also
    /// reads its own row every 40 ticks. An engine in the same process wakes waiters at
    /// once when it commits.
    pub fn with_wait_tick(mut self, tick: Duration) -> Self {
        self.waiters = Waiters::new(self.pool.clone(), self.pooler, tick, self.tasks.clone());
        self
    }

    /// The pool this client uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// What this client assumes between it and Postgres.
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// The clock this client uses.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The FSMs `insert_json` accepts.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Starts an insert of one instance of `F`. Set options, then `.await` it (or
    /// `.execute(&mut *tx)` inside a transaction). Returns the id once the row is
    /// committed, or [`Error::Duplicate`] if its unique key is occupied.
    ///
    /// Awaited inserts of one client that run at the same moment share a statement
    /// (group insert): each still returns its own id after its own row is committed, but
    /// a burst costs one round trip per group instead of two or three per row. Inserts
    /// with a unique key, and `.execute(..)`, always run alone.
    pub fn insert<F: Fsm>(&self, state: F::State) -> Insert<'_, F> {
        Insert {
            client: self,
            entry: Entry::new(state),
        }
    }

    /// Inserts many instances of `F` in one statement. Rows whose unique key is occupied
    /// (by a stored row or an earlier entry of the batch) are dropped; returns the ids
    /// actually inserted, ascending. `.await` it or `.execute(&mut *tx)`.
    pub fn insert_all<F: Fsm>(
        &self,
        entries: impl IntoIterator<Item = Entry<F>>,
    ) -> InsertAll<'_, F> {
        InsertAll {
            client: self,
            entries: entries.into_iter().collect(),
        }
    }

    /// Inserts an instance by FSM name and version, for callers without the Rust type.
    /// The name, version, step and state are checked against the registry first.
    pub fn insert_json(
        &self,
        fsm: impl Into<String>,
        version: i32,
        state: Value,
    ) -> InsertJson<'_> {
        InsertJson {
            client: self,
            fsm: fsm.into(),
            version,
            state,
            opts: InsertOptions::default(),
        }
    }

    /// Starts a signal delivery to an instance, named by its id or by its correlation
    /// key (`Key("order:42")`). `.await` it (or `.execute(&mut *tx)`). Resolving the key,
    /// storing the signal and waking the instance are one statement; a key no instance
    /// holds is [`Error::KeyNotFound`](crate::Error::KeyNotFound), a finished holder
    /// [`Error::Finished`](crate::Error::Finished), and nothing is stored.
    pub fn signal(
        &self,
        to: impl Into<Target>,
        name: impl Into<String>,
        payload: Value,
    ) -> SignalSend<'_> {
        SignalSend {
            client: self,
            target: to.into(),
            name: name.into(),
            payload,
            dedup_key: None,
            shard: None,
        }
    }

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
        crate::validate::check_target(&target)?;
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

    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    pub(crate) fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Adds a handler of this client's events (`wait.stop`); they are also `tracing`
    /// events, as the engine's are.
    pub fn on_event(mut self, handler: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.telemetry.add(Arc::new(handler));
        self
    }

    /// Cancels instance `id`: a runnable or parked instance
    /// is `failed` ("cancelled") at once; an executing one after its current step, whose
    /// `ctx.cancelled()` resolves meanwhile. Live children are cancelled with it.
    pub async fn cancel(&self, id: i64) -> Result<Cancelled> {
        let mut tx = self.pool.begin().await?;
        let conn = self.pooler.on(&mut *tx);
        let found = pg::control::cancel(conn, id, self.clock.now_param()).await?;
        tx.commit().await?;
        crate::wait::wake(id);
        found.answer(id)
    }

    /// Moves the live rows of FSM `fsm` below version `to` that are not executing to
    /// version `to`, with the [`crate::Migration`]s of this client's registry (the linked
    /// ones unless [`Client::with_registry`]), in short batches that never block the engine.
    /// A row whose transform fails stays on its version with the error in `last_error`;
    /// executing rows are left to their node. Every chain is checked before anything is
    /// written: with none from a version some row is at, the answer is
    /// [`crate::Error::NoMigration`] and nothing changes. See [`MigrateOptions`] for a dry run.
    pub async fn migrate_instances(
        &self,
        fsm: &str,
        to: i32,
        opts: MigrateOptions,
    ) -> Result<MigrationReport> {
        crate::migrate_instances::run(
            &self.pool,
            self.pooler,
            &self.clock,
            &self.registry,
            fsm,
            to,
            opts,
        )
        .await
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
    /// [`Error::ParentMovedOn`]. A parent that still has live children (cancelled while a
    /// child ran) waits for them again instead of running at once.
    pub async fn retry(&self, id: i64) -> Result<()> {
        // One statement; in a transaction so that it is one behind a pooler too.
        let mut tx = self.pool.begin().await?;
        let found =
            pg::control::retry(self.pooler.on(&mut *tx), id, self.clock.now_param()).await?;
        tx.commit().await?;
        found.answer(id)
    }

    /// The queues of `rows` this statement wakes itself (see [`Client::with_notify_window`]).
    fn notify_for(&self, rows: &[NewInstance]) -> Vec<String> {
        let mut queues: Vec<&str> = rows.iter().map(|r| r.queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        self.notifier.claim(queues)
    }

    /// An awaited insert: grouped with the client's other awaited inserts unless it has a
    /// unique key (see [`crate::group_insert`]).
    async fn insert_awaited(&self, row: NewInstance) -> Result<i64> {
        if row.unique_key.is_some() {
            return self.insert_one(self.pooler.pool(&self.pool), row).await;
        }
        let target = GroupTarget {
            pool: self.pool.clone(),
            pooler: self.pooler,
            clock: self.clock.clone(),
            notifier: self.notifier.clone(),
            tasks: self.tasks.clone(),
        };
        self.group.insert(&target, row).await
    }

    async fn insert_one<'e>(&self, db: impl PgExecutor<'e>, row: NewInstance) -> Result<i64> {
        let notify = !self.notifier.claim([row.queue.as_str()]).is_empty();
        let db = self.pooler.on(db);
        let id = pg::insert::insert_one(db, &row, notify, self.clock.now_param()).await?;
        inserted(id, row.unique_key.as_deref())
    }
}

/// One instance to insert with [`Client::insert_all`]: a state and its options.
pub struct Entry<F: Fsm> {
    state: F::State,
    opts: InsertOptions,
    _fsm: PhantomData<F>,
}

impl<F: Fsm> std::fmt::Debug for Entry<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("fsm", &F::NAME)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl<F: Fsm> Entry<F> {
    /// An entry starting from `state`, with default options.
    pub fn new(state: F::State) -> Self {
        Entry {
            state,
            opts: InsertOptions::default(),
            _fsm: PhantomData,
        }
    }

    crate::insert_option_setters!(opts);

    /// Resolves the entry into the row it inserts (FSM identity, state as JSON, options);
    /// the in-memory testkit inserts these.
    #[doc(hidden)]
    pub fn into_new_instance(self) -> Result<NewInstance> {
        let state = serde_json::to_value(&self.state)?;
        FsmEntry::of::<F>().new_instance(state, self.opts)
    }
}

/// A pending insert of one instance; see [`Client::insert`].
#[derive(Debug)]
#[must_use = "an insert does nothing until awaited or executed"]
pub struct Insert<'c, F: Fsm> {
    client: &'c Client,
    entry: Entry<F>,
}

impl<'c, F: Fsm> Insert<'c, F> {
    /// Runs the insert on `db` (a pool, a connection or `&mut *tx`), alone.
    pub async fn execute<'e>(self, db: impl PgExecutor<'e>) -> Result<i64> {
        let row = self.entry.into_new_instance()?;
        self.client.insert_one(db, row).await
    }
}

impl<F: Fsm> Insert<'_, F> {
    crate::insert_option_setters!(entry.opts);
}

/// `.await` inserts on the client's pool, sharing a statement with the client's other
/// awaited inserts of the moment (see [`Client::insert`]).
impl<'c, F: Fsm> IntoFuture for Insert<'c, F> {
    type Output = Result<i64>;
    type IntoFuture = BoxFut<'c, i64>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let row = self.entry.into_new_instance()?;
            self.client.insert_awaited(row).await
        })
    }
}

/// A pending batch insert; see [`Client::insert_all`].
#[derive(Debug)]
#[must_use = "an insert does nothing until awaited or executed"]
pub struct InsertAll<'c, F: Fsm> {
    client: &'c Client,
    entries: Vec<Entry<F>>,
}

impl<F: Fsm> InsertAll<'_, F> {
    /// Runs the batch on `db` (a pool, a connection or `&mut *tx`).
    pub async fn execute<'e>(self, db: impl PgExecutor<'e>) -> Result<Vec<i64>> {
        let rows = self
            .entries
            .into_iter()
            .map(Entry::into_new_instance)
            .collect::<Result<Vec<_>>>()?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let notify = self.client.notify_for(&rows);
        let db = self.client.pooler.on(db);
        pg::insert::insert_rows(db, &rows, &notify, self.client.clock.now_param()).await
    }
}

into_future_on_pool!(InsertAll<'c, F>, Vec<i64>, F: Fsm);

/// A pending insert by name; see [`Client::insert_json`].
#[derive(Debug)]
#[must_use = "an insert does nothing until awaited or executed"]
pub struct InsertJson<'c> {
    client: &'c Client,
    fsm: String,
    version: i32,
    state: Value,
    opts: InsertOptions,
}

impl<'c> InsertJson<'c> {
    crate::insert_option_setters!(opts);

    /// Checks the FSM, version, step and state, then runs the insert on `db`.
    pub async fn execute<'e>(self, db: impl PgExecutor<'e>) -> Result<i64> {
        let (client, row) = self.resolve()?;
        client.insert_one(db, row).await
    }

    fn resolve(self) -> Result<(&'c Client, NewInstance)> {
        let row =
            self.client
                .registry
                .new_instance(&self.fsm, self.version, self.state, self.opts)?;
        Ok((self.client, row))
    }
}

/// `.await` inserts on the client's pool, grouped like [`Insert`].
impl<'c> IntoFuture for InsertJson<'c> {
    type Output = Result<i64>;
    type IntoFuture = BoxFut<'c, i64>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (client, row) = self.resolve()?;
            client.insert_awaited(row).await
        })
    }
}

/// A pending signal delivery; see [`Client::signal`].
#[derive(Debug)]
#[must_use = "a signal is not sent until awaited or executed"]
pub struct SignalSend<'c> {
    client: &'c Client,
    target: Target,
    name: String,
    payload: Value,
    dedup_key: Option<String>,
    /// The shard of a [`crate::ShardedClient`] it goes to, named by its database errors.
    shard: Option<usize>,
}

impl SignalSend<'_> {
    /// A redelivery with the same key to the same instance stores nothing and succeeds.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// Delivered on shard `shard` of a [`crate::ShardedClient`]: its database errors
    /// name it.
    pub(crate) fn on_shard(mut self, shard: usize) -> Self {
        self.shard = Some(shard);
        self
    }

    /// Checks the target, name, payload and dedup key, then delivers on `db` in one
    /// statement.
    pub async fn execute<'e>(self, db: impl PgExecutor<'e>) -> Result<Delivery> {
        let shard = self.shard;
        self.deliver(db).await.map_err(|e| e.on_shard(shard))
    }

    async fn deliver<'e>(self, db: impl PgExecutor<'e>) -> Result<Delivery> {
        crate::validate::check_target(&self.target)?;
        crate::validate::check_signal(
            &self.name,
            &self.payload,
            self.dedup_key.as_deref(),
            self.client.max_signal_payload,
        )?;
        pg::signal::deliver(
            self.client.pooler.on(db),
            &self.target,
            &self.name,
            &self.payload,
            self.dedup_key.as_deref(),
            self.client.clock.now_param(),
        )
        .await?
        .answer(&self.target)
    }
}

into_future_on_pool!(SignalSend<'c>, Delivery);
