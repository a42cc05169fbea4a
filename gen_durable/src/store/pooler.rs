//! Statements through a transaction-mode connection pooler (PgBouncer before 1.21).
//!
//! Such a pooler hands the client's connection to another server connection after every
//! transaction, and, outside a transaction, after every `Sync`. sqlx prepares a statement
//! (`Parse`, `Describe`, `Sync`) before it binds and runs it (`Bind`, `Execute`, `Sync`):
//! outside a transaction the two halves can land on different servers. And it names every
//! statement it may cache (`sqlx_s_N`), so a server connection that served one client
//! refuses the same name from the next ("prepared statement already exists").
//!
//! [`Pooler::Transaction`] answers both: every engine statement is unnamed, and one that
//! is not already in a transaction runs in its own (`BEGIN`, the statement, `COMMIT`),
//! which keeps it on one server. Values stay bound parameters. The engine's statements
//! use only built-in types on the wire (statuses travel as text), so sqlx never looks a
//! type up with a statement of its own.

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Acquire, Describe, Either, Execute, Executor, PgPool, Postgres};

/// What sits between the engine and Postgres. Set it on the [`Client`](crate::Client)
/// and the [`Engine`](crate::Engine) (`with_pooler`) when their pool connects through a
/// pooler in transaction mode; see README "Behind a connection pooler".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooler {
    /// Postgres itself, or a pooler in session mode, or one that keeps prepared
    /// statements across transactions (PgBouncer ≥ 1.21 with `max_prepared_statements`):
    /// statements are prepared once per connection and cached (the default).
    #[default]
    None,
    /// A pooler in transaction mode without prepared-statement support (PgBouncer 1.18):
    /// every statement unnamed, each in a transaction. It costs a round trip to prepare
    /// and two for `BEGIN`/`COMMIT` on statements that had no transaction.
    Transaction,
}

impl Pooler {
    /// Whether statements must stay unnamed.
    pub(crate) fn unnamed(self) -> bool {
        self == Pooler::Transaction
    }

    /// `db` as an executor whose statements suit this pooler: unnamed behind a
    /// transaction-mode pooler, unchanged otherwise. For a connection or a transaction;
    /// a pool goes through [`Pooler::pool`].
    pub(crate) fn on<E>(self, db: E) -> On<E> {
        On {
            db,
            unnamed: self.unnamed(),
        }
    }

    /// `pool` as an executor whose statements suit this pooler: behind a
    /// transaction-mode pooler, each statement unnamed in a transaction of its own.
    pub(crate) fn pool(self, pool: &PgPool) -> Alone<&PgPool> {
        self.alone(pool)
    }

    /// `db` (a pool, or a connection outside any transaction) as an executor whose
    /// statements suit this pooler: behind a transaction-mode pooler, each statement
    /// unnamed in a transaction of its own.
    pub(crate) fn alone<A>(self, db: A) -> Alone<A> {
        Alone { db, pooler: self }
    }
}

/// A query as given, but never prepared under a name when `unnamed`.
struct Unnamed<Q> {
    query: Q,
    unnamed: bool,
}

impl<'q, Q: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<Q> {
    fn sql(&self) -> &'q str {
        self.query.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        self.query.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        self.query.take_arguments()
    }

    fn persistent(&self) -> bool {
        !self.unnamed && self.query.persistent()
    }
}

/// See [`Pooler::on`].
#[derive(Debug)]
pub(crate) struct On<E> {
    db: E,
    unnamed: bool,
}

impl On<&mut sqlx::PgConnection> {
    /// The same connection, for one more statement.
    pub(crate) fn again(&mut self) -> On<&mut sqlx::PgConnection> {
        On {
            db: &mut *self.db,
            unnamed: self.unnamed,
        }
    }
}

impl<'c, E: Executor<'c, Database = Postgres>> Executor<'c> for On<E> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        let unnamed = self.unnamed;
        self.db.fetch_many(Unnamed { query, unnamed })
    }

    fn fetch_optional<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        let unnamed = self.unnamed;
        self.db.fetch_optional(Unnamed { query, unnamed })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.db.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.db.describe(sql)
    }
}

/// See [`Pooler::alone`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Alone<A> {
    db: A,
    pooler: Pooler,
}

impl<'c, A> Executor<'c> for Alone<A>
where
    A: Executor<'c, Database = Postgres> + Acquire<'c, Database = Postgres> + 'c,
{
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        if !self.pooler.unnamed() {
            return self.db.fetch_many(query);
        }
        let db = self.db;
        futures_util::stream::once(async move {
            let mut tx = db.begin().await?;
            let items: Vec<_> = Pooler::Transaction
                .on(&mut *tx)
                .fetch_many(query)
                .try_collect()
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures_util::stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        if !self.pooler.unnamed() {
            return self.db.fetch_optional(query);
        }
        let db = self.db;
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let row = Pooler::Transaction
                .on(&mut *tx)
                .fetch_optional(query)
                .await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.db.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.db.describe(sql)
    }
}
