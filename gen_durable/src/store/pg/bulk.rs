//! Selecting the instances a bulk cancel or retry acts on (`Client::cancel_where`,
//! `retry_where`): a [`crate::Filter`] read as one statement with optional parameters.
//! These only read, without locks; the action then runs the single-row statements of
//! `control` on each batch of ids, in its own short transaction.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;

/// The filter, `$1`…`$14`: a NULL parameter matches every row. `$4` is never empty (the
/// caller passes the statuses its action takes). `$7` is an age in milliseconds before
/// `$now` (`$8`). The key prefix is matched with `starts_with`, not `LIKE`, so `%` and `_`
/// in a key are plain characters. The error text is compared with ASCII letters folded
/// (`lower` under the C collation), whatever the database's collation, as the kit does.
macro_rules! matching {
    ($select:literal, $tail:literal) => {
        concat!(
            "/* gd:admin */ ",
            $select,
            "
  FROM gd_instances
 WHERE ($1::text IS NULL OR queue = $1)
   AND ($2::text IS NULL OR fsm = $2)
   AND ($3::int4 IS NULL OR fsm_version = $3)
   AND status = ANY ($4::text[]::gd_status[])
   AND ($5::timestamptz IS NULL OR updated_at < $5)
   AND ($6::timestamptz IS NULL OR updated_at > $6)
   AND ($7::int8 IS NULL OR updated_at < coalesce($8, now()) - $7 * interval '1 millisecond')
   AND ($9::text IS NULL OR starts_with(unique_key, $9))
   AND ($10::text IS NULL OR unique_key = $10)
   AND ($11::timestamptz IS NULL OR inserted_at >= $11)
   AND ($12::timestamptz IS NULL OR inserted_at < $12)
   AND ($13::text IS NULL OR strpos(lower(last_error COLLATE \"C\"), lower($13 COLLATE \"C\")) > 0)
   AND ($14::int8 IS NULL OR parent_id = $14)",
            $tail
        )
    };
}

/// The next batch of matching ids after `$15`, by id (keyset pagination: each batch reads
/// on from where the last stopped, so rows the action changed are not read again).
pub(super) const MATCHING_IDS: &str = matching!(
    "SELECT id",
    "
   AND id > $15
 ORDER BY id
 LIMIT $16"
);

/// How many rows match: a dry run's count.
pub(super) const MATCHING_COUNT: &str = matching!("SELECT count(*)", "");

/// A filter's parameters, as the statements bind them.
#[derive(Debug, Clone)]
pub(crate) struct FilterParams<'a> {
    pub(crate) queue: Option<&'a str>,
    pub(crate) fsm: Option<&'a str>,
    pub(crate) version: Option<i32>,
    pub(crate) statuses: Vec<String>,
    pub(crate) updated_before: Option<DateTime<Utc>>,
    pub(crate) updated_after: Option<DateTime<Utc>>,
    pub(crate) older_than_ms: Option<i64>,
    pub(crate) key_prefix: Option<&'a str>,
    pub(crate) key: Option<&'a str>,
    pub(crate) inserted_since: Option<DateTime<Utc>>,
    pub(crate) inserted_until: Option<DateTime<Utc>>,
    pub(crate) error_contains: Option<&'a str>,
    pub(crate) parent: Option<i64>,
    pub(crate) now: Option<DateTime<Utc>>,
}

macro_rules! bind_filter {
    ($q:expr, $p:expr) => {
        $q.bind($p.queue)
            .bind($p.fsm)
            .bind($p.version)
            .bind(&$p.statuses)
            .bind($p.updated_before)
            .bind($p.updated_after)
            .bind($p.older_than_ms)
            .bind($p.now)
            .bind($p.key_prefix)
            .bind($p.key)
            .bind($p.inserted_since)
            .bind($p.inserted_until)
            .bind($p.error_contains)
            .bind($p.parent)
    };
}

/// Up to `limit` matching ids above `after`, ascending.
pub(crate) async fn matching_ids<'e>(
    db: impl PgExecutor<'e>,
    p: &FilterParams<'_>,
    after: i64,
    limit: i64,
) -> Result<Vec<i64>> {
    Ok(bind_filter!(sqlx::query_scalar(MATCHING_IDS), p)
        .bind(after)
        .bind(limit)
        .fetch_all(db)
        .await?)
}

/// How many rows match.
pub(crate) async fn matching_count<'e>(
    db: impl PgExecutor<'e>,
    p: &FilterParams<'_>,
) -> Result<i64> {
    Ok(bind_filter!(sqlx::query_scalar(MATCHING_COUNT), p)
        .fetch_one(db)
        .await?)
}
