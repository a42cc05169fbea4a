//! Turning `--database-url` / `DATABASE_URL` into a pool, with errors that say what to do.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use super::error::{CliError, Kind};

/// How long to wait for the server before giving up: an operator at a terminal wants
/// "unreachable" in seconds, not after sqlx's default half minute.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// SQLSTATEs that mean "you reached the server but it won't let you in here".
const INVALID_PASSWORD: &str = "28P01";
const INVALID_AUTHORIZATION: &str = "28000";
const INVALID_CATALOG: &str = "3D000";

/// Set by this tree's `.cargo/config.toml`: the database `cargo gd` looks at when given none
/// (the examples'). An installed binary does not see it, and has no default.
const TREE_DEFAULT_URL: &str = "GEN_DURABLE_CLI_DEFAULT_URL";

/// The URL a command connects to: `--database-url` or `DATABASE_URL`, else this tree's
/// default, which is named on stderr (unless the output is JSON) so that nobody wonders
/// which database they looked at.
pub(crate) fn database_url(given: Option<String>, json: bool) -> Option<String> {
    let given = given.filter(|u| !u.trim().is_empty());
    if given.is_some() {
        return given;
    }
    let default = std::env::var(TREE_DEFAULT_URL)
        .ok()
        .filter(|u| !u.trim().is_empty())?;
    if !json {
        eprintln!(
            "database: {} (this tree's default, the examples'; --database-url or DATABASE_URL for another)",
            redact(&default)
        );
    }
    Some(default)
}

/// Connects to `url` (or explains why not). One or two connections are all a command needs.
pub(crate) async fn connect(url: Option<&str>) -> Result<PgPool, CliError> {
    connect_with(url, 2).await
}

/// [`connect`] with a pool of up to `max` connections (the dashboard serves requests
/// side by side).
pub(crate) async fn connect_with(url: Option<&str>, max: u32) -> Result<PgPool, CliError> {
    let url = url.filter(|u| !u.trim().is_empty()).ok_or_else(|| {
        CliError::new(Kind::Connect, "no database given").hint(
            "pass --database-url postgres://user:password@host:5432/dbname, or set DATABASE_URL",
        )
    })?;
    let shown = redact(url);
    let opts = PgConnectOptions::from_str(url)
        .map_err(|e| {
            CliError::new(
                Kind::Connect,
                format!("{shown:?} is not a PostgreSQL URL: {e}"),
            )
            .hint("write it as postgres://user:password@host:5432/dbname")
        })?
        .disable_statement_logging();
    // One connection first: it fails fast and with the real cause (refused, unknown
    // host, bad password), where a pool would retry until its timeout and then report
    // only that it timed out.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, opts.connect())
        .await
        .map_err(|_| {
            CliError::new(
                Kind::Connect,
                format!("cannot connect to {shown}: no answer in {CONNECT_TIMEOUT:?}"),
            )
            .hint("check that the server is up and that host and port are right")
        })?
        .map_err(|e| connect_error(&shown, e))?;
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(opts);
    let _ = probe.close().await;
    Ok(pool)
}

fn connect_error(shown: &str, e: sqlx::Error) -> CliError {
    let code = match &e {
        sqlx::Error::Database(db) => db.code().map(|c| c.to_string()),
        _ => None,
    };
    let hint = match code.as_deref() {
        Some(INVALID_PASSWORD | INVALID_AUTHORIZATION) => "check the user and password in the URL",
        Some(INVALID_CATALOG) => {
            "create the database first (e.g. `createdb NAME`), then run `gen_durable migrate-schema`"
        }
        _ => "check that the server is up and that host and port are right",
    };
    CliError::new(Kind::Connect, format!("cannot connect to {shown}: {e}")).hint(hint)
}

/// Fails with "run `gen_durable migrate-schema`" unless the whole schema is there.
pub(crate) async fn require_schema(pool: &PgPool) -> Result<(), CliError> {
    // The library's own check: the migrations this build embeds, all applied, none newer.
    match gen_durable::backend::schema::check(pool).await {
        Ok(()) => Ok(()),
        Err(gen_durable::Error::SchemaBehind { applied: None, .. }) => Err(
            CliError::not_migrated("this database has no gen_durable schema"),
        ),
        Err(gen_durable::Error::SchemaBehind {
            applied: Some(at),
            missing,
        }) => Err(CliError::not_migrated(&format!(
            "this database's gen_durable schema is older than this CLI: it is at migration {at}, and migrations {missing:?} are missing"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The URL with its password masked, fit for an error message.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

/// The client an operator's command acts with: the history records its actions as done
/// by the user who ran it (`$USER`, then `$LOGNAME`), as `alice (cli)`.
pub(crate) fn operator(pool: &PgPool) -> gen_durable::Client {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.trim().is_empty()));
    let actor = match user {
        Some(u) => format!("{} (cli)", u.trim()),
        None => "cli".to_string(),
    };
    gen_durable::Client::new(pool.clone()).with_actor(actor)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db?x=a@b"), "postgres://h/db?x=a@b");
        assert_eq!(redact("not a url"), "not a url");
    }
}
