//! The soaks' scratch database: `gd_soak` and `gd_steady` each run in a database of
//! their own on the server `--database-url` (or `DATABASE_URL`, or the local default
//! server), dropped and created afresh at every run.

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::ConnectOptions;

use crate::worker::Args;

/// The server when neither `--database-url` nor `DATABASE_URL` names one.
const DEFAULT_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A freshly created scratch database.
pub struct ScratchDb {
    /// The server's URL, as given (its database is the one `admin` is connected to).
    pub server: String,
    /// The connection that dropped and created the scratch database, still open.
    pub admin: PgConnection,
    /// The options to connect to the scratch database.
    pub opts: PgConnectOptions,
}

/// Drops the database `name` (forcing its sessions out) and creates it again, on the
/// server of `--database-url`, `DATABASE_URL` or the local default. `name` is an SQL
/// identifier the caller spells out (it is not quoted).
pub async fn create_scratch_db(args: &Args, name: &str) -> Result<ScratchDb, sqlx::Error> {
    let server = args
        .str("database-url")
        .map(str::to_string)
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .unwrap_or_else(|| DEFAULT_SERVER.into());
    let server_opts: PgConnectOptions = server.parse()?;
    let mut admin = server_opts.connect().await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    Ok(ScratchDb {
        server,
        admin,
        opts: server_opts.database(name),
    })
}
