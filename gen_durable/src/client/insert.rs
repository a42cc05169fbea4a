//! Inserting instances: [`Client::insert`], [`Client::insert_all`] and
//! [`Client::insert_json`], their pending operations (`.await` them, or `.execute(db)` in
//! a transaction), and [`Entry`], one instance of a batch.

use std::future::IntoFuture;
use std::marker::PhantomData;

use serde_json::Value;
use sqlx::PgExecutor;

use super::{BoxFut, Client};
use crate::client::group_insert::Target as GroupTarget;
use crate::model::answers::inserted;
use crate::model::error::Result;
use crate::model::insert::NewInstance;
use crate::model::options::InsertOptions;
use crate::runtime::fsm::Fsm;
use crate::runtime::registry::FsmEntry;
use crate::store::pg;

impl Client {
    /// Starts an insert of one instance of `F`. Set options, then `.await` it (or
    /// `.execute(&mut *tx)` inside a transaction). Returns the id once the row is
    /// committed, or [`Error::Duplicate`](crate::Error::Duplicate) if its unique key is occupied.
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

    /// The queues of `rows` this statement wakes itself (see [`Client::with_notify_window`]).
    fn notify_for(&self, rows: &[NewInstance]) -> Vec<String> {
        let mut queues: Vec<&str> = rows.iter().map(|r| r.queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        self.notifier.claim(queues)
    }

    /// An awaited insert: grouped with the client's other awaited inserts unless it has a
    /// unique key (see [`crate::client::group_insert`]).
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
