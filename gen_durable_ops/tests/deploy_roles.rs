//! Least privilege (docs/roles.sql): a migrator owns the schema, engines and clients run as
//! a worker with rows only, the CLI's reads and the dashboard's pages run as a reader — and
//! the worker cannot drop, alter or truncate a table, nor end another role's session.

mod cli_support;

use std::time::Duration;

use cli_support::gd;
use gen_durable::prelude::*;
use gen_durable::{Error, Settled};
use gen_durable_testkit::pg::direct_options;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

/// An order's state.
#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct Order {
    /// Its number.
    pub n: i64,
}

/// Waits for `paid`, then finishes with the order's number.
#[durable_fsm(state = Order, queue = "roles", version = 1)]
pub enum Paid {
    /// Parks on `paid`.
    #[initial]
    Wait,
    /// Finishes.
    Done,
}

#[durable_steps]
impl Paid {
    async fn wait(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::await_signal(["paid"], Paid::Done))
    }
    async fn done(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(ctx.state.n)))
    }
}

/// A database and three roles named after it, dropped at the end.
struct Deployment {
    db: String,
    admin: PgConnectOptions,
    suffix: String,
}

impl Deployment {
    async fn create() -> Deployment {
        let admin = direct_options();
        let suffix = format!("{}_{}", std::process::id(), rand_suffix());
        let db = format!("gd_roles_{suffix}");
        let mut conn = admin.connect().await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut conn)
            .await
            .unwrap();
        // docs/roles.sql, with role names of this test's own (roles are cluster-wide).
        let script = include_str!("../../docs/roles.sql").replace("gd_", &format!("t{suffix}_gd_"));
        let mut on_db = admin.clone().database(&db).connect().await.unwrap();
        sqlx::raw_sql(&script).execute(&mut on_db).await.unwrap();
        Deployment { db, admin, suffix }
    }

    fn role(&self, name: &str) -> String {
        format!("t{}_gd_{name}", self.suffix)
    }

    fn options(&self, role: &str) -> PgConnectOptions {
        self.admin
            .clone()
            .database(&self.db)
            .username(&self.role(role))
            .disable_statement_logging()
    }

    async fn pool(&self, role: &str) -> PgPool {
        PgPoolOptions::new()
            .max_connections(6)
            .connect_with(self.options(role))
            .await
            .unwrap()
    }

    fn url(&self, role: &str) -> String {
        let o = self.options(role);
        format!(
            "postgres://{}@{}:{}/{}",
            self.role(role),
            o.get_host(),
            o.get_port(),
            self.db
        )
    }

    async fn drop(self) {
        let mut conn = self.admin.connect().await.unwrap();
        sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db))
            .execute(&mut conn)
            .await
            .unwrap();
        for r in ["migrator", "worker", "reader"] {
            sqlx::query(&format!("DROP ROLE IF EXISTS {}", self.role(r)))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
}

fn rand_suffix() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

/// The SQLSTATE of a failed statement.
async fn refused(conn: &mut PgConnection, sql: &str) -> String {
    match sqlx::query(sql).execute(&mut *conn).await {
        Err(sqlx::Error::Database(e)) => e.code().map(|c| c.to_string()).unwrap_or_default(),
        other => panic!("{sql}: expected a refusal, got {other:?}"),
    }
}

/// `GET path` on `addr` over HTTP/1.1: the status code and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

#[tokio::test]
async fn engine_client_and_cli_run_under_least_privilege_roles() {
    let d = Deployment::create().await;

    // The migrator owns the schema.
    let migrator = d.pool("migrator").await;
    gen_durable::migrate_schema(&migrator).await.unwrap();
    sqlx::query(&format!(
        "REVOKE INSERT, UPDATE, DELETE ON _sqlx_migrations FROM {}",
        d.role("worker")
    ))
    .execute(&migrator)
    .await
    .unwrap();

    // Engine and client as the worker: insert, signal, cancel, retry, run to the end.
    let worker = d.pool("worker").await;
    let gd = Client::new(worker.clone());
    let engine = Engine::builder(worker.clone())
        .queue("roles", 4)
        // Long enough that the cancelled instance is still there to retry (with zero, the
        // collector could take it between its failure and the retry), short enough that
        // the collector's deletes are seen below.
        .with_retention(Duration::from_secs(3))
        .with_collector_schedule(Duration::from_millis(100), 100)
        .start()
        .await
        .unwrap();
    let a = gd
        .insert::<Paid>(Order { n: 1 })
        .correlation_key("order:1")
        .await
        .unwrap();
    let b = gd.insert::<Paid>(Order { n: 2 }).await.unwrap();
    let parked = gd.insert::<Paid>(Order { n: 3 }).await.unwrap();
    gd.cancel(b).await.unwrap();
    // A cancel that finds the step running fails the instance when the step ends.
    let cancelled = gd
        .wait(b)
        .until_terminal()
        .timeout(Duration::from_secs(20))
        .await
        .unwrap();
    assert!(matches!(cancelled, Settled::Failed(_)), "{cancelled:?}");
    gd.retry(b).await.unwrap();
    // A signal sent before the instance parks waits in its inbox for the await.
    gd.signal(Key("order:1"), "paid", json!({})).await.unwrap();
    gd.signal(b, "paid", json!({})).await.unwrap();
    for id in [a, b] {
        let end = gd
            .wait(id)
            .until_terminal()
            .timeout(Duration::from_secs(20))
            .await
            .unwrap();
        // Done, or already collected: by the worker's DELETE.
        assert!(matches!(end, Settled::Done(_) | Settled::Gone), "{end:?}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM gd_instances WHERE status = 'done'")
        .fetch_one(&worker)
        .await
        .unwrap()
        > 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the collector deletes as the worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The history: the engine, as the worker, made its day partitions at start (through
    // `gd_history_keep`, which runs as the schema's owner), and a collected instance's
    // entries outlive it; the reader reads them with the CLI.
    let parts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'gd_history'::regclass",
    )
    .fetch_one(&worker)
    .await
    .unwrap();
    assert_eq!(
        parts, 4,
        "today, the next two days and the default partition"
    );
    let history = gd_url(&d.url("reader"), &["--json", "history", &a.to_string()])
        .expect(0)
        .json();
    let kinds: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["await", "done"], "{history}");
    // The keeper runs as the schema's owner: a reader may not use it to drop the history.
    let mut r = PgConnection::connect_with(&d.options("reader"))
        .await
        .unwrap();
    assert_eq!(
        refused(
            &mut r,
            "SELECT gd_history_keep(now() + interval '30 days', interval '0')"
        )
        .await,
        "42501"
    );

    // The CLI's reads as the reader.
    let status = gd_url(&d.url("reader"), &["--json", "status"])
        .expect(0)
        .json();
    assert_eq!(
        status["queues"][0]["counts"]["awaiting_signal"], 1,
        "{status}"
    );
    let inspected = gd_url(
        &d.url("reader"),
        &["--json", "inspect", &parked.to_string()],
    )
    .expect(0)
    .json();
    assert_eq!(inspected["instance"]["status"], "awaiting_signal");

    // The dashboard's pages as the reader (a read-only dashboard reads only).
    let reader_pool = d.pool("reader").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = gen_durable_ops::dashboard::router(reader_pool.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    for path in [
        "/".to_string(),
        "/instances".to_string(),
        format!("/instances/{parked}"),
        "/fsms".to_string(),
    ] {
        let (status, body) = http_get(addr, &path).await;
        assert_eq!(status, 200, "{path} as the reader: {body}");
    }
    let (_, page) = http_get(addr, &format!("/instances/{parked}")).await;
    assert!(
        page.contains("awaiting signal"),
        "the explain line as the reader: {page}"
    );
    server.abort();

    // What the worker may not do.
    let mut w = PgConnection::connect_with(&d.options("worker"))
        .await
        .unwrap();
    const DENIED: &str = "42501";
    assert_eq!(refused(&mut w, "DROP TABLE gd_instances").await, DENIED);
    assert_eq!(
        refused(&mut w, "ALTER TABLE gd_instances ADD COLUMN x int").await,
        DENIED
    );
    assert_eq!(refused(&mut w, "TRUNCATE gd_signals").await, DENIED);
    assert_eq!(refused(&mut w, "CREATE TABLE mine (x int)").await, DENIED);
    assert_eq!(
        refused(&mut w, "DELETE FROM _sqlx_migrations").await,
        DENIED
    );
    let migrator_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&migrator)
        .await
        .unwrap();
    let ended = sqlx::query_scalar::<_, bool>("SELECT pg_terminate_backend($1)")
        .bind(migrator_pid)
        .fetch_one(&mut w)
        .await;
    assert!(
        matches!(&ended, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(DENIED)),
        "{ended:?}"
    );
    // And the reader cannot write.
    let mut r = PgConnection::connect_with(&d.options("reader"))
        .await
        .unwrap();
    assert_eq!(
        refused(&mut r, "UPDATE gd_instances SET priority = 1").await,
        DENIED
    );
    let as_reader = Client::new(d.pool("reader").await);
    let e = as_reader.insert::<Paid>(Order { n: 3 }).await.unwrap_err();
    assert!(matches!(e, Error::Database(_)), "{e}");

    engine.shutdown(Duration::from_secs(5)).await;
    for p in [migrator, worker] {
        p.close().await;
    }
    drop((w, r));
    d.drop().await;
}

/// Runs the CLI against `url`.
fn gd_url(url: &str, args: &[&str]) -> cli_support::Run {
    let mut all = vec!["--database-url", url];
    all.extend_from_slice(args);
    gd(&all)
}
