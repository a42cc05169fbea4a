//! Embedded schema migrations.

use sqlx::PgPool;

use crate::model::error::Result;

/// The migrations in `gen_durable/migrations/`, embedded at compile time.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Brings the schema up to date. Idempotent; safe when several processes run it at
/// once (sqlx serializes them with an advisory lock held for the migration only).
pub async fn migrate_schema(pool: &PgPool) -> Result<()> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// How many schema migrations this build embeds (the count `_sqlx_migrations` holds once
/// [`migrate_schema`] has run).
pub fn embedded() -> usize {
    MIGRATOR.iter().count()
}
