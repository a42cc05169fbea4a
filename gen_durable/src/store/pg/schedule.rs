//! Periodic schedules: the statements of one fire (see [`crate::Schedule`]). They run in
//! one READ COMMITTED transaction: take the row (or skip it if another node holds it),
//! replace its declaration if this node declares another one, insert the instances (with
//! [`super::insert::insert_rows`]), move the row on.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::model::error::Result;
use crate::model::rows::{Redeclared, ScheduleDeclaration, StoredSchedule};
use crate::store::pooler::On;

/// The transaction's time: the manual clock's, else the statement's start.
pub(super) const NOW: &str = "/* gd:schedule */ SELECT coalesce($1, statement_timestamp())";

/// Declares a schedule the first time a node sees it, its first fire time after now: a new
/// schedule does not catch up on its past. A row that exists is left to [`TAKE`] and
/// [`REDECLARE`], under the row's lock.
pub(super) const ENSURE: &str = r#"/* gd:schedule */
INSERT INTO gd_schedules (name, pattern, timezone, catch_up, next_fire, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO NOTHING
"#;

/// The schedule's row, locked for this fire, with the declaration it holds; no row if
/// another node is firing it.
pub(super) const TAKE: &str = r#"/* gd:schedule */
SELECT next_fire, pattern, timezone, catch_up, last_fire
  FROM gd_schedules WHERE name = $1 FOR UPDATE SKIP LOCKED
"#;

/// A node's declaration replaces the stored one (at the node's start, see
/// `schedule/declaration.rs`): the new pattern, zone and policy, the next fire time they
/// give, and the replaced pattern's due fire times counted as skipped.
pub(super) const REDECLARE: &str = r#"/* gd:schedule */
UPDATE gd_schedules
   SET pattern = $2, timezone = $3, catch_up = $4, next_fire = $5,
       skipped = skipped + $6, updated_at = $7
 WHERE name = $1
"#;

/// The fire done: the next unhandled fire time, the newest instance, what was skipped. The
/// declaration is left as stored: only [`REDECLARE`] changes it, so that a node that
/// fires by the stored declaration never writes its own back.
pub(super) const ADVANCE: &str = r#"/* gd:schedule */
UPDATE gd_schedules
   SET next_fire = $2, last_fire = coalesce($3, last_fire), last_id = coalesce($4, last_id),
       skipped = skipped + $5, last_error = coalesce($6, last_error), updated_at = $7
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

/// Stores the schedule if no node has yet, first firing at `first`.
pub(crate) async fn ensure(
    conn: &mut On<&mut PgConnection>,
    name: &str,
    d: &ScheduleDeclaration,
    first: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(ENSURE)
        .bind(name)
        .bind(&d.pattern)
        .bind(&d.timezone)
        .bind(&d.catch_up)
        .bind(first)
        .bind(now)
        .execute(conn.again())
        .await?;
    Ok(())
}

/// Locks the schedule's row: `None` if another node holds it, else what it stores.
pub(crate) async fn take(
    conn: &mut On<&mut PgConnection>,
    name: &str,
) -> Result<Option<StoredSchedule>> {
    type Row = (
        Option<DateTime<Utc>>,
        String,
        String,
        String,
        Option<DateTime<Utc>>,
    );
    let row: Option<Row> = sqlx::query_as(TAKE)
        .bind(name)
        .fetch_optional(conn.again())
        .await?;
    Ok(row.map(
        |(next_fire, pattern, timezone, catch_up, last_fire)| StoredSchedule {
            declaration: ScheduleDeclaration {
                pattern,
                timezone,
                catch_up,
            },
            next_fire,
            last_fire,
        },
    ))
}

/// Replaces the stored declaration with `d` (see [`REDECLARE`]).
pub(crate) async fn redeclare(
    conn: &mut On<&mut PgConnection>,
    name: &str,
    d: &ScheduleDeclaration,
    r: &Redeclared,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(REDECLARE)
        .bind(name)
        .bind(&d.pattern)
        .bind(&d.timezone)
        .bind(&d.catch_up)
        .bind(r.next)
        .bind(r.skipped as i64)
        .bind(now)
        .execute(conn.again())
        .await?;
    Ok(())
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
    name: &str,
    a: &Advance,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(ADVANCE)
        .bind(name)
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
