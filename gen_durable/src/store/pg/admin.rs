//! The node announcements (what `gen_durable status` reads to tell live nodes from dead
//! ones) and the collector's delete of old terminal rows. The statements only the
//! operator tools run (status, inspect, schema checks) are `gen_durable_ops`' own.
//!
//! None of these is on the hot path. They write in bounded batches with `SKIP LOCKED`,
//! so running them against a busy database holds back no worker.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;

use crate::model::error::Result;

/// How long after its last announce a node still counts as live: three beats of an
/// engine announcing every 20 s (its heartbeat, `lease_ttl / 3` = 10 s by default, is
/// well within). A fixed window, not a per-node one, so `status` needs no engine
/// configuration to decide; an engine whose heartbeat is slower than 20 s must still
/// announce every 20 s.
pub const NODE_LIVE_WINDOW_MS: i64 = 60_000;

/// The most rows one `gc` statement deletes: small enough that each batch holds its
/// row locks for milliseconds, large enough that the round trips don't dominate.
pub const GC_BATCH: i64 = 1_000;

/// The database's clock, which every figure of `status` is relative to.
const NOW: &str = "/* gd:admin */ SELECT coalesce($1, now())";

/// `now`, or the database's clock when `None`.
pub async fn db_now<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar(NOW).bind(now).fetch_one(db).await?)
}

/// Deletes one batch of terminal rows last updated before `now - $1`.
///
/// - Bounded (`LIMIT $2`) and `SKIP LOCKED` in a MATERIALIZED CTE, the fence that makes
///   the limit bound the rows locked: many collectors (or a CLI next to the engine's
///   collector) never wait on each other, and a row a signal delivery is locking right
///   now (its foreign key takes `KEY SHARE`, which `FOR UPDATE` conflicts with) is
///   skipped until the next batch.
/// - Ordered by `finished_at, id`, the order of the `gd_instances_finished` index over
///   terminal rows (`finished_at` is their `updated_at`, migration 0014), so each batch
///   reads the oldest entries and stops at the limit.
/// - Never a child of a live parent: a parent that is not terminal reads its children's
///   outcomes in `ctx.children()` once they have all ended, so they must outlive it.
/// - The inbox goes with the row (`ON DELETE CASCADE`); terminal rows have none anyway.
pub(super) const GC: &str = r#"/* gd:collect */
WITH doomed AS MATERIALIZED (
    SELECT i.id FROM gd_instances i
     WHERE i.status IN ('done', 'failed')
       AND i.finished_at < coalesce($3, now()) - $1 * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM gd_instances p
                        WHERE p.id = i.parent_id AND p.status NOT IN ('done', 'failed'))
     ORDER BY i.finished_at, i.id
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM gd_instances i USING doomed d WHERE i.id = d.id
"#;

/// Deletes up to `limit` terminal rows older than `older_than_ms`; returns how many.
pub async fn gc_batch<'e>(
    db: impl PgExecutor<'e>,
    older_than_ms: i64,
    limit: i64,
    now: Option<DateTime<Utc>>,
) -> Result<u64> {
    let r = sqlx::query(GC)
        .bind(older_than_ms)
        .bind(limit)
        .bind(now)
        .execute(db)
        .await?;
    Ok(r.rows_affected())
}

/// A node says it is alive and what it runs; called on the engine's heartbeat.
/// An upsert, so the first call creates the row and keeps `started_at`. Nodes unseen
/// for a day are deleted in the same statement (never this one), so crashed nodes
/// don't pile up and nobody needs a separate sweep; concurrent announces deleting the
/// same stale rows only wait on each other for those rows.
const ANNOUNCE: &str = r#"/* gd:announce */
WITH stale AS (
    DELETE FROM gd_nodes
     WHERE last_seen_at < coalesce($4, now()) - interval '1 day' AND node_id <> $1
)
INSERT INTO gd_nodes (node_id, queues, fsms, steps, started_at, last_seen_at)
VALUES ($1, $2, $3, $5, coalesce($4, now()), coalesce($4, now()))
ON CONFLICT (node_id) DO UPDATE
   SET queues = EXCLUDED.queues, fsms = EXCLUDED.fsms, steps = EXCLUDED.steps,
       last_seen_at = EXCLUDED.last_seen_at
"#;

/// How a node's `(fsm, version)` pair is stored in `gd_nodes.fsms`; `UNRUNNABLE`
/// builds the same text from a row (`fsm || '@' || fsm_version`).
pub(crate) fn fsm_tag(name: &str, version: i32) -> String {
    format!("{name}@{version}")
}

/// Records that `node_id` is alive now, picks from `queues` and runs `fsms`
/// (`(name, version)` pairs), whose step names are `steps` (a JSON object by
/// `fsm_tag`, see `steps_by_tag`). Call it at start and at least every 20 s (see
/// [`NODE_LIVE_WINDOW_MS`]).
pub async fn announce<'e>(
    db: impl PgExecutor<'e>,
    node_id: &str,
    queues: &[String],
    fsms: &[(String, i32)],
    steps: &Value,
    now: Option<DateTime<Utc>>,
) -> Result<()> {
    let tags: Vec<String> = fsms.iter().map(|(n, v)| fsm_tag(n, *v)).collect();
    sqlx::query(ANNOUNCE)
        .bind(node_id)
        .bind(queues)
        .bind(tags)
        .bind(now)
        .bind(steps)
        .execute(db)
        .await?;
    Ok(())
}

/// The step names of each FSM version `(name, version, steps)`, by [`fsm_tag`]: what a
/// node announces in `gd_nodes.steps` for `Client::restart` to check a step against.
pub(crate) fn steps_by_tag<'a>(
    fsms: impl IntoIterator<Item = (&'a str, i32, &'a [&'a str])>,
) -> Value {
    fsms.into_iter()
        .map(|(name, version, steps)| (fsm_tag(name, version), Value::from(steps.to_vec())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A node leaving on purpose (graceful shutdown) removes itself at once, instead of
/// showing as live for up to a minute.
const FORGET: &str = "/* gd:announce */ DELETE FROM gd_nodes WHERE node_id = $1";

/// Removes `node_id`'s announcement (a graceful shutdown).
pub async fn forget<'e>(db: impl PgExecutor<'e>, node_id: &str) -> Result<()> {
    sqlx::query(FORGET).bind(node_id).execute(db).await?;
    Ok(())
}

/// The schema migrations applied to the database (`_sqlx_migrations`, successful ones),
/// or `None` when it has no such table: what the engine checks at start.
pub(crate) async fn applied_migrations<'e, E>(db: E) -> Result<Option<Vec<i64>>>
where
    E: PgExecutor<'e> + Copy,
{
    let exists: bool =
        sqlx::query_scalar("/* gd:setup */ SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(db)
            .await?;
    if !exists {
        return Ok(None);
    }
    Ok(Some(
        sqlx::query_scalar(
            "/* gd:setup */ SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .fetch_all(db)
        .await?,
    ))
}
