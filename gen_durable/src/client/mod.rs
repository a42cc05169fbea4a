//! The [`Client`]: inserting instances, delivering signals, waiting on and explaining
//! instances, and the operator actions on one instance. No engine is needed.
//!
//! The files: `mod.rs`, the client, its settings and what its clones share; `insert.rs`,
//! `insert`, `insert_all`, `insert_json`, their pending operations and [`Entry`];
//! `signal.rs`, `signal` and its pending delivery [`SignalSend`]; `reads.rs`, `wait` and
//! `explain`; `control.rs`, `cancel`, `retry` and `migrate_instances`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::task::TaskTracker;

use crate::client::group_insert::GroupInsert;
use crate::client::wait::{Waiters, DEFAULT_WAIT_TICK};
use crate::model::clock::Clock;
use crate::model::error::Result;
use crate::runtime::registry::Registry;
use crate::store::notify::Notifier;
use crate::store::pooler::Pooler;
use crate::telemetry::{Event, Telemetry};

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

mod control;
pub(crate) mod group_insert;
mod insert;
pub(crate) mod reads;
pub(crate) mod sharded;
mod signal;
pub(crate) mod wait;

pub use insert::{Entry, Insert, InsertAll, InsertJson};
pub use signal::SignalSend;

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
    /// Who its operator actions are recorded as, in the history.
    actor: Option<Arc<str>>,
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
                crate::store::notify::DEFAULT_WINDOW,
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
            actor: None,
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

    /// Records the operator actions of this client (cancel, retry, restart, an instance
    /// migration) in the history as done by `actor` — a person, a service, a ticket.
    /// Without it they are recorded as done by the database role the client connected
    /// as.
    pub fn with_actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = Some(actor.into().into());
        self
    }

    /// Who this client's operator actions are recorded as, if it was told
    /// ([`Client::with_actor`]).
    pub fn actor(&self) -> Option<&str> {
        self.actor.as_deref()
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
}
