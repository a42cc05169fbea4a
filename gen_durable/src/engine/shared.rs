//! What the units of one engine share: the database handle every statement goes
//! through ([`Db`]), the node's table of the claims it holds ([`Claims`]), and what the
//! step path needs ([`Shared`]: pickers, executor and committer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::engine::committer::CommitterHandle;
use crate::model::clock::Clock;
use crate::model::error::Result;
use crate::runtime::registry::Registry;
use crate::store::pg::BEGIN_READ_COMMITTED;
use crate::store::pooler::{Alone, On, Pooler};
use crate::telemetry::Telemetry;

/// The engine's way to the database: its pool, its clock (`$now` of every statement),
/// the pooler in between and the isolation its statements need.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) pool: PgPool,
    pub(crate) clock: Clock,
    pub(crate) pooler: Pooler,
    /// The database's default isolation is not READ COMMITTED: run each engine statement
    /// in a transaction that sets it (see [`Db::conn`]).
    pub(crate) set_isolation: bool,
}

impl Db {
    /// The handle for `pool`: learns the database's default isolation once.
    pub(crate) async fn new(pool: PgPool, clock: Clock, pooler: Pooler) -> Result<Db> {
        let level: String = sqlx::query_scalar(
            "/* gd:setup */ SELECT current_setting('default_transaction_isolation')",
        )
        .fetch_one(pooler.pool(&pool))
        .await?;
        Ok(Db {
            pool,
            clock,
            pooler,
            set_isolation: level != "read committed",
        })
    }

    /// The pool, as an executor for one statement (see [`Pooler::pool`]).
    pub(crate) fn exec(&self) -> Alone<&PgPool> {
        self.pooler.pool(&self.pool)
    }

    /// `$now` for a statement: the manual clock's time, or NULL for the database's.
    pub(crate) fn now(&self) -> Option<DateTime<Utc>> {
        self.clock.now_param()
    }

    /// A connection for one engine statement, at READ COMMITTED whatever the database's
    /// default: every engine statement relies on it (each statement of the commit
    /// function sees what committed before it; a locking read follows a row's newest
    /// version instead of failing with a serialization error). Behind a transaction-mode
    /// pooler, each statement is in a transaction too (see [`Pooler`]).
    pub(crate) async fn conn(&self) -> Result<StatementConn> {
        let conn = if self.set_isolation {
            Conn::Transaction(self.pool.begin_with(BEGIN_READ_COMMITTED).await?)
        } else if self.pooler.unnamed() {
            Conn::Transaction(self.pool.begin().await?)
        } else {
            Conn::Plain(self.pool.acquire().await?)
        };
        Ok(StatementConn {
            conn,
            pooler: self.pooler,
        })
    }
}

/// Runs one engine statement on a [`Db::conn`] and finishes it:
/// `on_conn!(db, |c| lease::reap(c, batch, now))` evaluates to the statement's `Result`.
macro_rules! on_conn {
    ($db:expr, |$c:ident| $statement:expr) => {
        async {
            let mut conn = $db.conn().await?;
            let out = {
                let $c = conn.get();
                $statement.await?
            };
            conn.finish().await?;
            Ok::<_, $crate::model::error::Error>(out)
        }
        .await
    };
}
pub(crate) use on_conn;

/// See [`Db::conn`]; finish it with [`StatementConn::finish`].
#[derive(Debug)]
pub(crate) struct StatementConn {
    conn: Conn,
    pooler: Pooler,
}

#[derive(Debug)]
enum Conn {
    Plain(sqlx::pool::PoolConnection<sqlx::Postgres>),
    Transaction(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl StatementConn {
    pub(crate) fn get(&mut self) -> On<&mut PgConnection> {
        self.pooler.on(match &mut self.conn {
            Conn::Plain(c) => &mut **c,
            Conn::Transaction(t) => &mut **t,
        })
    }

    /// Commits the statement's transaction, if it has one.
    pub(crate) async fn finish(self) -> Result<()> {
        if let Conn::Transaction(t) = self.conn {
            t.commit().await?;
        }
        Ok(())
    }
}

/// The claims this node holds: the leases the heartbeat extends, and the cancellation
/// token of each step running here. Both are keyed by instance id and remember the epoch
/// of the claim that registered them: only that claim removes them (see [`Claims::unhold`]).
/// A plain row claimed from the log holds no lease of its own but a place in a batch: the
/// heartbeat extends the batch while any of its rows is held here, and deletes it once
/// none is.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    /// Every row this node holds (buffered or executing): id → (epoch, its batch if any).
    leases: Mutex<HashMap<i64, (i64, Option<Batch>)>>,
    /// Every batch of the log held here, with its rows still held, and the batches whose
    /// rows have all ended here, to delete.
    batches: Mutex<Batches>,
    /// Every step running here: id → (epoch, its `ctx.cancelled()` token).
    running: Mutex<HashMap<i64, (i64, CancellationToken)>>,
}

/// A batch of the log: `(lane, batch)`.
pub(crate) type Batch = (i32, i64);

#[derive(Debug, Default)]
struct Batches {
    /// Each batch held: its rows held here, and whether one of them ended unsettled.
    held: HashMap<Batch, (usize, bool)>,
    ended: Vec<Batch>,
}

impl Batches {
    /// One row of `batch` ended here: `settled` when its outcome committed (or it was
    /// released, or it moved on). A batch whose rows have all ended is deleted, unless
    /// one of them ended unsettled (its commit failed): that batch is left to expire, and
    /// the reaper gives that row back.
    fn release(&mut self, batch: Batch, settled: bool) {
        if let Some((n, unsettled)) = self.held.get_mut(&batch) {
            *n -= 1;
            *unsettled |= !settled;
            if *n == 0 {
                let unsettled = *unsettled;
                self.held.remove(&batch);
                if !unsettled {
                    self.ended.push(batch);
                }
            }
        }
    }
}

impl Claims {
    /// Records the claim `(id, epoch)`, of `batch` when it came from the log: its lease
    /// (or its batch) is heartbeated from now on. Returns false when this node already
    /// holds that very claim: a range of the log taken again because a server crash forgot
    /// the batch that took it first. The row's step is already running here (its outcome
    /// will pass the fence with the new batch, which is heartbeated in the old one's
    /// place): do not run it twice.
    pub(crate) fn hold(&self, id: i64, epoch: i64, batch: Option<Batch>) -> bool {
        let old = self
            .leases
            .lock()
            .expect("lease table")
            .insert(id, (epoch, batch));
        let mut batches = self.batches.lock().expect("batch table");
        if let Some(b) = batch {
            batches.held.entry(b).or_default().0 += 1;
        }
        // A newer claim of the row replaced an older one held here (reaped meanwhile).
        if let Some((_, Some(b))) = old {
            batches.release(b, true);
        }
        old.is_none_or(|(e, _)| e != epoch)
    }

    /// Records that the claim `(id, epoch)` runs its step, cancelled through `token`.
    pub(crate) fn run(&self, id: i64, epoch: i64, token: CancellationToken) {
        self.running
            .lock()
            .expect("running table")
            .insert(id, (epoch, token));
    }

    /// Forgets the claim `(id, epoch)` — and only that claim: a stale run of a row that
    /// was reaped and claimed here again must not unregister the newer claim's lease (it
    /// would go unheartbeated and be reaped in turn) nor its cancellation token.
    /// `settled`: its outcome committed, or it was released or moved on (see
    /// `Batches::release`).
    pub(crate) fn unhold(&self, id: i64, epoch: i64, settled: bool) {
        let mut leases = self.leases.lock().expect("lease table");
        let batch = match leases.get(&id) {
            Some(&(e, batch)) if e == epoch => {
                leases.remove(&id);
                batch
            }
            _ => None,
        };
        drop(leases);
        if let Some(b) = batch {
            self.batches
                .lock()
                .expect("batch table")
                .release(b, settled);
        }
        let mut running = self.running.lock().expect("running table");
        if running.get(&id).is_some_and(|(e, _)| *e == epoch) {
            running.remove(&id);
        }
    }

    /// Every lease of a row claimed by itself held now, as `(id, epoch)`.
    pub(crate) fn leases(&self) -> Vec<(i64, i64)> {
        let table = self.leases.lock().expect("lease table");
        table
            .iter()
            .filter(|(_, (_, batch))| batch.is_none())
            .map(|(id, (epoch, _))| (*id, *epoch))
            .collect()
    }

    /// What the heartbeat sends for the log: the batches held, the batches ended since the
    /// last beat (taken: they are deleted by this beat, or expire), and the rows held from
    /// the log with their entries.
    pub(crate) fn log_beat(&self) -> crate::store::pg::log::Beat {
        let rows = {
            let table = self.leases.lock().expect("lease table");
            table
                .iter()
                .filter(|(_, (_, batch))| batch.is_some())
                .map(|(id, (epoch, _))| (*id, *epoch))
                .collect()
        };
        let mut batches = self.batches.lock().expect("batch table");
        crate::store::pg::log::Beat {
            live: batches.held.keys().copied().collect(),
            acked: std::mem::take(&mut batches.ended),
            rows,
        }
    }

    /// Resolves `ctx.cancelled()` of the step running instance `id` here, if any.
    pub(crate) fn cancel_step(&self, id: i64) {
        if let Some((_, token)) = self.running.lock().expect("running table").get(&id) {
            token.cancel();
        }
    }
}

/// What the step path (pickers, executor, committer) of one engine shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) db: Db,
    pub(crate) node_id: String,
    pub(crate) lease_ttl: Duration,
    pub(crate) registry: Registry,
    /// The registry as the claim's parameters: the `(name, version)` pairs this node runs.
    pub(crate) names: Vec<String>,
    pub(crate) versions: Vec<i32>,
    pub(crate) telemetry: Telemetry,
    pub(crate) claims: Arc<Claims>,
    pub(crate) committer: CommitterHandle,
    /// Wakes the await-timeout sweep when a step parks with a timeout.
    pub(crate) timeouts_wake: Arc<Notify>,
    /// A gate or a rate limit is declared, as the last pick found (at first assumed):
    /// picks use the full claim, else the plain one (`claim::CLAIM_PLAIN`).
    pub(crate) flow: std::sync::atomic::AtomicBool,
}
