//! What every example shares: its own database on `DATABASE_URL`'s server, created and
//! migrated on first use (and recreated if another version of gen_durable migrated it); a size from the command line; waiting for instances to finish
//! or for Ctrl-C.
#![allow(dead_code)] // each example uses part of it

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// The examples' database, next to whatever `DATABASE_URL` names.
pub const DATABASE: &str = "gen_durable_examples";

/// Connects to the examples' database, creating and migrating it if needed. Exits with
/// instructions if no PostgreSQL server is reachable.
pub async fn connect() -> Result<PgPool, Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let server: PgConnectOptions = url.parse()?;
    let mut admin = match server.clone().connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "cannot reach PostgreSQL at {url} ({e}).\n\
                 Start one (e.g. `pg_ctlcluster 15 main start`, or\n\
                 `docker run -e POSTGRES_HOST_AUTH_METHOD=trust -p 5432:5432 postgres`)\n\
                 or set DATABASE_URL to a server you can create a database on."
            );
            std::process::exit(2);
        }
    };
    println!("database: {}", examples_url(&server));
    println!("  see it: {}\n", status_command(&server));
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(DATABASE)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        // Two examples starting at once may both try; the loser finds it there.
        if let Err(e) = sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
            .execute(&mut admin)
            .await
        {
            let created_meanwhile =
                matches!(&e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P04"));
            if !created_meanwhile {
                return Err(e.into());
            }
        }
    }
    let open = || {
        PgPoolOptions::new().max_connections(10).connect_with(
            server
                .clone()
                .database(DATABASE)
                .disable_statement_logging(),
        )
    };
    let pool = open().await?;
    match gen_durable::migrate_schema(&pool).await {
        Ok(()) => Ok(pool),
        // Migrated by another checkout of gen_durable whose migrations differ from these
        // (an edited or a newer one): it is only the examples' database, so start afresh.
        Err(
            gen_durable::Error::SchemaAhead { .. }
            | gen_durable::Error::Migrate(
                sqlx::migrate::MigrateError::VersionMismatch(_)
                | sqlx::migrate::MigrateError::VersionMissing(_),
            ),
        ) => {
            eprintln!("{DATABASE} was migrated by another version of gen_durable: recreating it");
            pool.close().await;
            sqlx::query(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
                .execute(&mut admin)
                .await?;
            sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
                .execute(&mut admin)
                .await?;
            let pool = open().await?;
            gen_durable::migrate_schema(&pool).await?;
            Ok(pool)
        }
        Err(e) => Err(e.into()),
    }
}

/// The examples' database on `server`, as a URL to paste (without a password).
fn examples_url(server: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{DATABASE}",
        server.get_username(),
        server.get_host(),
        server.get_port()
    )
}

/// The operator CLI's command that shows this database: in this tree `cargo gd` looks at
/// the examples' database by default (`.cargo/config.toml`); on another server it needs
/// the URL.
fn status_command(server: &PgConnectOptions) -> String {
    if std::env::var_os("DATABASE_URL").is_none() {
        "cargo gd status".to_string()
    } else {
        format!("cargo gd status --database-url '{}'", examples_url(server))
    }
}

/// The first command-line argument as a number (the example's size), or `default`.
/// CI runs each example with a small one (its smoke mode).
pub fn size_arg(default: u64) -> u64 {
    match std::env::args().nth(1) {
        None => default,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!(
                "usage: cargo run --example NAME -- [SIZE]   (SIZE: a number, default {default})"
            );
            std::process::exit(2);
        }),
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Every instance is `done` or `failed`.
    Finished,
    /// The user pressed Ctrl-C.
    Interrupted,
}

/// Waits until every instance of `ids` has finished, or Ctrl-C. `progress` is called
/// with the number still open whenever it changes. An example may poll: it is a demo of
/// the engine, not part of it.
pub async fn wait_for(
    pool: &PgPool,
    ids: &[i64],
    mut progress: impl FnMut(i64),
) -> Result<Waited, sqlx::Error> {
    let finished = async {
        let mut last = -1;
        loop {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM gd_instances
                  WHERE id = ANY($1) AND status NOT IN ('done', 'failed')",
            )
            .bind(ids)
            .fetch_one(pool)
            .await?;
            if open != last {
                progress(open);
                last = open;
            }
            if open == 0 {
                return Ok::<_, sqlx::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        r = finished => r.map(|()| Waited::Finished),
        _ = tokio::signal::ctrl_c() => {
            println!("Ctrl-C: draining");
            Ok(Waited::Interrupted)
        }
    }
}

/// Prints what a drain did.
pub fn print_drain(report: &gen_durable::DrainReport) {
    println!(
        "drained: released {}, in flight {}, cancelled {}",
        report.released(),
        report.in_flight(),
        report.cancelled()
    );
}
