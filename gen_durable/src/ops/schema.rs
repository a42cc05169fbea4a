//! Embedded schema migrations.

use sqlx::{Connection, PgExecutor, PgPool};

use crate::model::error::{Error, Result};
use crate::store::pg::admin::applied_migrations;

/// The migrations in `gen_durable/migrations/`, embedded at compile time.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Brings the schema up to date. Idempotent; safe when several processes run it at
/// once (sqlx serializes them with an advisory lock held for the migration only).
///
/// A migration that fails (say migration 32, refusing to run while a node of the earlier
/// version is live) leaves the database as it was, and the pool fit for the next attempt.
///
/// A database migrated by a later version is refused with [`Error::SchemaAhead`], which
/// says so, before anything runs.
pub async fn migrate_schema(pool: &PgPool) -> Result<()> {
    let applied = applied_migrations(pool).await?.unwrap_or_default();
    if let Some(ahead) = ahead_of_this_version(&applied) {
        return Err(ahead);
    }
    let mut conn = pool.acquire().await?;
    if let Err(e) = MIGRATOR.run(&mut *conn).await {
        // sqlx keeps its advisory lock when a migration fails: this session must not go
        // back to the pool, or the next migration waits for its lock for ever.
        let _ = conn.detach().close().await;
        return Err(e.into());
    }
    Ok(())
}

/// How many schema migrations this build embeds (the count `_sqlx_migrations` holds once
/// [`migrate_schema`] has run).
pub fn embedded() -> usize {
    MIGRATOR.iter().count()
}

/// Refuses a database whose schema is not the one this build runs on: one that lacks a
/// migration it embeds (or has no schema at all), or one with migrations newer than its
/// newest (migrated by a later version). Reads only.
pub async fn check<'e, E>(db: E) -> Result<()>
where
    E: PgExecutor<'e> + Copy,
{
    let applied = applied_migrations(db).await?.unwrap_or_default();
    let missing: Vec<i64> = MIGRATOR
        .iter()
        .map(|m| m.version)
        .filter(|v| applied.binary_search(v).is_err())
        .collect();
    if !missing.is_empty() {
        return Err(Error::SchemaBehind {
            applied: applied.last().copied(),
            missing,
        });
    }
    match ahead_of_this_version(&applied) {
        Some(ahead) => Err(ahead),
        None => Ok(()),
    }
}

/// [`Error::SchemaAhead`] if `applied` holds migrations newer than this build's newest.
fn ahead_of_this_version(applied: &[i64]) -> Option<Error> {
    let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let unknown: Vec<i64> = applied.iter().copied().filter(|&v| v > known).collect();
    (!unknown.is_empty()).then_some(Error::SchemaAhead { unknown, known })
}
