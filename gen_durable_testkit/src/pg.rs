//! A fresh, migrated Postgres database for each test.
//!
//! ```no_run
//! # async fn demo() {
//! let db = gen_durable_testkit::TestDb::new().await;
//! let client = gen_durable::Client::new(db.pool().clone());
//! // … the database is dropped by `db.close().await`, or by the next run if the test panics.
//! # }
//! ```
//!
//! The server comes from `DATABASE_URL` (any database on it; default
//! `postgres://postgres@127.0.0.1:5432/postgres`). Each database is named
//! `gd_test_<pid>_<n>`; databases left behind by processes that no longer run are
//! dropped the first time a process creates one.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;

/// The server URL used when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

static COUNTER: AtomicU32 = AtomicU32::new(0);
static SWEPT: OnceCell<()> = OnceCell::const_new();

/// A database that exists for one test.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    /// The server the tests' pools reach (`DATABASE_URL`: maybe a pooler).
    server: PgConnectOptions,
    /// The database server itself (`DATABASE_DIRECT_URL`, else `server`): where databases
    /// are created and dropped, migrations run and LISTEN connects.
    admin: PgConnectOptions,
    pool: PgPool,
    /// Straight to the database, for the test's own statements (see [`TestDb::direct`]).
    direct: PgPool,
}

/// The connect options of `DATABASE_URL` (or the default).
pub fn server_options() -> PgConnectOptions {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_string());
    url.parse::<PgConnectOptions>()
        .unwrap_or_else(|e| panic!("DATABASE_URL {url:?} is not a Postgres URL: {e}"))
        .disable_statement_logging()
}

/// The connect options of the database server itself: `DATABASE_DIRECT_URL` when
/// `DATABASE_URL` names a pooler in transaction mode (PgBouncer), else `DATABASE_URL`'s.
/// Session-level work goes there: creating databases, migrations (their advisory lock),
/// and an engine's LISTEN.
pub fn direct_options() -> PgConnectOptions {
    match std::env::var("DATABASE_DIRECT_URL") {
        Ok(url) => url
            .parse::<PgConnectOptions>()
            .unwrap_or_else(|e| panic!("DATABASE_DIRECT_URL {url:?} is not a Postgres URL: {e}"))
            .disable_statement_logging(),
        Err(_) => server_options(),
    }
}

impl TestDb {
    /// Creates and migrates a new database; panics with instructions if the server is
    /// not reachable.
    pub async fn new() -> TestDb {
        Self::with_pool_size(10).await
    }

    /// Like [`TestDb::new`] with a pool of at most `max_connections`.
    pub async fn with_pool_size(max_connections: u32) -> TestDb {
        let (server, admin) = (server_options(), direct_options());
        let mut conn = admin.connect().await.unwrap_or_else(|e| {
            panic!(
                "cannot reach PostgreSQL at {:?}:{} ({e}). Start it (e.g. `pg_ctlcluster 15 main start`) \
                 or set DATABASE_URL.",
                admin.get_host(),
                admin.get_port()
            )
        });
        SWEPT.get_or_init(|| sweep_stale(&mut conn)).await;
        let name = format!(
            "gd_test_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&mut conn)
            .await
            .expect("drop old test database");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        conn.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(server.clone().database(&name))
            .await
            .expect("connect to test database");
        let direct = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(admin.clone().database(&name))
            .await
            .expect("connect to test database directly");
        gen_durable::migrate_schema(&direct)
            .await
            .expect("migrate test database");
        let direct = if std::env::var_os("DATABASE_DIRECT_URL").is_some() {
            direct.close().await;
            PgPoolOptions::new()
                .max_connections(4)
                .connect_lazy_with(admin.clone().database(&name))
        } else {
            direct.close().await;
            pool.clone()
        };
        TestDb {
            name,
            server,
            admin,
            pool,
            direct,
        }
    }

    /// A pool straight to the database server, for a test's own statements — setup and
    /// the checks on rows — which sqlx prepares by name: when [`TestDb::pool`] goes
    /// through a transaction-mode pooler (`DATABASE_DIRECT_URL` set), only gen_durable's
    /// statements are made for it (see [`TestDb::pooler`]). Else the same pool.
    pub fn direct(&self) -> &PgPool {
        &self.direct
    }

    /// What [`TestDb::pool`] goes through, for `Client::with_pooler` and
    /// `EngineBuilder::with_pooler`: [`gen_durable::Pooler::Transaction`] when
    /// `DATABASE_POOLER=transaction`, else none.
    pub fn pooler(&self) -> gen_durable::Pooler {
        match std::env::var("DATABASE_POOLER").as_deref() {
            Ok("transaction") => gen_durable::Pooler::Transaction,
            Ok("") | Ok("none") | Err(_) => gen_durable::Pooler::None,
            Ok(other) => panic!("DATABASE_POOLER={other:?}: expected \"transaction\" or \"none\""),
        }
    }

    /// The pool on this database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connect options for this database (to build another, separate pool), through
    /// `DATABASE_URL`.
    pub fn options(&self) -> PgConnectOptions {
        self.server.clone().database(&self.name)
    }

    /// Where an engine on this database should LISTEN: directly on the server when
    /// `DATABASE_DIRECT_URL` says the pool goes through a pooler, else on the pool's own.
    pub fn listener(&self) -> gen_durable::WakeListener {
        if std::env::var_os("DATABASE_DIRECT_URL").is_some() {
            gen_durable::WakeListener::direct(self.admin.clone().database(&self.name))
        } else {
            gen_durable::WakeListener::Pool
        }
    }

    /// A new pool on this database, separate from [`TestDb::pool`] (e.g. a second node).
    pub async fn new_pool(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(self.options())
            .await
            .expect("connect to test database")
    }

    /// Closes the pool and drops the database.
    pub async fn close(self) {
        self.pool.close().await;
        self.direct.close().await;
        if let Ok(mut conn) = self.admin.connect().await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut conn)
            .await;
        }
    }
}

/// Drops `gd_test_<pid>_<n>` databases whose process is gone.
async fn sweep_stale(conn: &mut PgConnection) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'gd\\_test\\_%'")
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_default();
    for name in names {
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut *conn)
                .await;
        }
    }
}
