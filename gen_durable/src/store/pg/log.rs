//! The ready log (storage v2, `gen_durable/sql/log.sql`): the claim of plain rows by
//! ranges of their lanes' entries, the heartbeat of the batches a node holds, and the
//! reaper of expired batches.
//!
//! A claim is two statements: [`ADVANCE`] takes the ranges (one batch per lane, nothing
//! written per row) in a short transaction of its own, then [`READ`] reads their rows with
//! their inboxes and children. Each claimed row's `lease_epoch` is its entry's seq, the
//! fence of its outcome (commit.sql).

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgConnection, PgExecutor};

use crate::model::error::Result;
use crate::store::pg::claim::{ClaimParams, Claimed};
use crate::store::pooler::On;

/// Takes up to `$3` entries of queue `$1`'s lanes of FSMs `$2` for node `$4`, leased for
/// `$5` ms: `gd_advance`, which first appends the queue's due rows. Its own transaction,
/// committed without waiting for its flush, as a row claim is (claim.sql): a batch a
/// server crash forgot is taken again, and the worker that held it commits nothing of it
/// (its outcomes' fence asks for the batch).
pub(super) const ADVANCE: &str = "/* gd:advance */ SELECT a.lane, a.batch, a.keyed \
     FROM set_config('synchronous_commit', 'off', true) AS without_flush, \
          gd_advance($1, $2, $3, $4, $5, $6) a";

/// The rows of the batches `$1` (lane, batch, …) that still wait at their entry, for a node
/// that runs the `(name, version)` pairs `$2`/`$3`: `gd_read`.
pub(super) const READ: &str = "/* gd:claim */ SELECT * FROM gd_read($1, $2, $3, $4)";

/// What a claim from the log took: its rows, and whether rows of the queue that are
/// claimed by themselves are due too (the claim then took at most half the demand).
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub(crate) rows: Vec<Claimed>,
    pub(crate) keyed: bool,
    /// It took a range of the log: the queue may hold more even when every row of the
    /// range had moved on (entries left behind by rows redelivered or cancelled).
    pub(crate) advanced: bool,
}

/// Claims up to `p.demand` plain rows of `p.queue` from the log: the ranges, then their
/// rows. On a connection without a transaction each statement commits by itself, so the
/// lanes' rows are locked only while the ranges are taken.
pub(crate) async fn claim(mut conn: On<&mut PgConnection>, p: &ClaimParams<'_>) -> Result<Taken> {
    let ranges: Vec<(Option<i32>, Option<i64>, bool)> = sqlx::query_as(ADVANCE)
        .bind(p.queue)
        .bind(p.names)
        .bind(p.demand)
        .bind(p.node)
        .bind(p.lease_ttl_ms)
        .bind(p.now)
        .fetch_all(conn.again())
        .await?;
    let keyed = ranges.iter().any(|r| r.2);
    let batches: Vec<(i32, i64)> = ranges.iter().filter_map(|r| r.0.zip(r.1)).collect();
    if batches.is_empty() {
        return Ok(Taken {
            rows: Vec::new(),
            keyed,
            advanced: false,
        });
    }
    let pairs: Vec<i64> = batches
        .iter()
        .flat_map(|&(lane, batch)| [i64::from(lane), batch])
        .collect();
    let rows = sqlx::query(READ)
        .bind(pairs)
        .bind(p.names)
        .bind(p.versions)
        .bind(p.now)
        .fetch_all(conn.again())
        .await?;
    Ok(Taken {
        rows: rows
            .iter()
            .map(Claimed::from_row)
            .collect::<sqlx::Result<_>>()?,
        keyed,
        advanced: true,
    })
}

/// The heartbeat of a node's batches, in one statement: extends the live batches `$1`
/// (lane, batch pairs), deletes the batches `$2` whose rows have all ended here (acked), and
/// reads the cancel flag of the running rows `$5` at their entries `$6` (a cancel flags a
/// running row; its NOTIFY may be lost). The node `$3`, the lease `$4` ms, the clock `$7`.
pub(super) const BEAT: &str = r#"/* gd:heartbeat */
WITH live AS (
    UPDATE gd_batches b
       SET expires_at = coalesce($7, now()) + $4 * interval '1 millisecond'
      FROM (SELECT $1::int8[] AS p) x, generate_series(1, cardinality($1::int8[]) / 2) k
     WHERE b.lane = x.p[2 * k - 1] AND b.batch = x.p[2 * k] AND b.node = $3
    RETURNING 1
), acked AS (
    DELETE FROM gd_batches b
     USING (SELECT $2::int8[] AS p) x, generate_series(1, cardinality($2::int8[]) / 2) k
     WHERE b.lane = x.p[2 * k - 1] AND b.batch = x.p[2 * k] AND b.node = $3
    RETURNING 1
)
SELECT i.id, i.cancel_requested
  FROM gd_instances i
 WHERE i.id = ANY ($5::int8[])
   AND i.ready_seq = ($6::int8[])[width_bucket(i.id, $5::int8[])]
"#;

/// What a beat of the batches sends: the batches live and acked, the rows running.
#[derive(Debug, Default)]
pub(crate) struct Beat {
    pub(crate) live: Vec<(i32, i64)>,
    pub(crate) acked: Vec<(i32, i64)>,
    /// `(id, entry)` of each row held, sorted by id.
    pub(crate) rows: Vec<(i64, i64)>,
}

fn pairs(batches: &[(i32, i64)]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|&(lane, batch)| [i64::from(lane), batch])
        .collect()
}

/// Runs [`BEAT`]; returns each held row still at its entry with its cancel flag.
pub(crate) async fn beat<'e>(
    db: impl PgExecutor<'e>,
    b: &Beat,
    ttl_ms: i64,
    node: &str,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<(i64, bool)>> {
    let mut rows = b.rows.clone();
    rows.sort_unstable();
    let (ids, entries): (Vec<i64>, Vec<i64>) = rows.into_iter().unzip();
    Ok(sqlx::query_as(BEAT)
        .bind(pairs(&b.live))
        .bind(pairs(&b.acked))
        .bind(node)
        .bind(ttl_ms)
        .bind(ids)
        .bind(entries)
        .bind(now)
        .fetch_all(db)
        .await?)
}

/// Gives back the rows of up to `$1` expired batches (`gd_reap_batches`, log.sql): each
/// row still at its entry goes to the end of its lane, counted as a reap, or fails at its
/// limit. `$3` is the lease TTL, which tells the batches a restart of the database took.
pub(super) const REAP: &str =
    "/* gd:reap */ SELECT id, failed FROM gd_reap_batches($1, $2, $3) ORDER BY id";

/// Runs [`REAP`].
pub(crate) async fn reap<'e>(
    db: impl PgExecutor<'e>,
    limit: i64,
    now: Option<DateTime<Utc>>,
    ttl_ms: i64,
) -> Result<Vec<(i64, bool)>> {
    Ok(sqlx::query_as(REAP)
        .bind(limit)
        .bind(now)
        .bind(ttl_ms)
        .fetch_all(db)
        .await?)
}

/// Deletes up to `$1` dead entries of the log (`gd_trim_log`, log.sql): the collector's.
pub(super) const TRIM: &str = "/* gd:collect */ SELECT gd_trim_log($1)";

/// Runs [`TRIM`]; returns how many entries it deleted.
pub(crate) async fn trim<'e>(db: impl PgExecutor<'e>, limit: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(TRIM).bind(limit).fetch_one(db).await?)
}
