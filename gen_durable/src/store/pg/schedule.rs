//! Periodic schedules: the statements of one fire (see [`crate::Schedule`]). They run in
//! one READ COMMITTED transaction: take the row (or skip it if another node holds it),
//! insert the instances (with [`super::insert::insert_rows`]), move the row on.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Result;
use crate::pooler::On;

/// The transaction's time: the manual clock's, else the statement's start.
pub(super) const NOW: &str = "/* gd:schedule */ SELECT coalesce($1, statement_timestamp())";

/// Declares a schedule the first time a node sees it, its first fire time after now: a new
/// schedule does not catch up on its past.
pub(super) const ENSURE: &str = r#"/* gd:schedule */
INSERT INTO gd_schedules (name, pattern, timezone, catch_up, next_fire, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO NOTHING
"#;

/// The schedule's row, locked for this fire; no row if another node is firing it.
pub(super) const TAKE: &str = r#"/* gd:schedule */
SELECT next_fire FROM gd_schedules WHERE name = $1 FOR UPDATE SKIP LOCKED
"#;

/// The fire done: the next unhandled fire time, the newest instance, what was skipped.
pub(super) const ADVANCE: &str = r#"/* gd:schedule */
UPDATE gd_schedules
   SET pattern = $2, timezone = $3, catch_up = $4, next_fire = $5,
       last_fire = coalesce($6, last_fire), last_id = coalesce($7, last_id),
       skipped = skipped + $8, last_error = coalesce($9, last_error), updated_at = $10
 WHERE name = $1
"#;

/// The time the fire runs at.
pub(crate) async fn now(
    conn: &mut On<&mut PgConnection>,
    clock: Option<DateTime<Utc>>,
) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar(NOW)
        .bind(clock)
        .fetch_one(conn.again())
        .await?)
}

/// How a schedule is declared, as stored.
pub(crate) struct Declared<'a> {
    pub(crate) name: &'a str,
    pub(crate) pattern: &'a str,
    pub(crate) timezone: &'a str,
    pub(crate) catch_up: &'a str,
}

/// Stores the schedule if no node has yet, first firing at `first`.
pub(crate) async fn ensure(
    conn: &mut On<&mut PgConnection>,
    d: &Declared<'_>,
    first: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(ENSURE)
        .bind(d.name)
        .bind(d.pattern)
        .bind(d.timezone)
        .bind(d.catch_up)
        .bind(first)
        .bind(now)
        .execute(conn.again())
        .await?;
    Ok(())
}

/// Locks the schedule's row: `None` if another node holds it, else its next fire time
/// (`Some(None)`: the pattern is over).
pub(crate) async fn take(
    conn: &mut On<&mut PgConnection>,
    name: &str,
) -> Result<Option<Option<DateTime<Utc>>>> {
    Ok(sqlx::query_scalar(TAKE)
        .bind(name)
        .fetch_optional(conn.again())
        .await?)
}

/// What one fire did, as stored.
pub(crate) struct Advance {
    pub(crate) next: Option<DateTime<Utc>>,
    pub(crate) last_fire: Option<DateTime<Utc>>,
    pub(crate) last_id: Option<i64>,
    pub(crate) skipped: i64,
    pub(crate) error: Option<String>,
}

/// Moves the schedule on after a fire.
pub(crate) async fn advance(
    conn: &mut On<&mut PgConnection>,
    d: &Declared<'_>,
    a: &Advance,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(ADVANCE)
        .bind(d.name)
        .bind(d.pattern)
        .bind(d.timezone)
        .bind(d.catch_up)
        .bind(a.next)
        .bind(a.last_fire)
        .bind(a.last_id)
        .bind(a.skipped)
        .bind(a.error.as_deref())
        .bind(now)
        .execute(conn.again())
        .await?;
    Ok(())
}
