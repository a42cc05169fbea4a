//! The hand-off of a gate key's slots: in the transaction of a group commit that ended
//! gated rows, each slot they held is claimed at once for the next runnable row of the
//! same queue, gate and key (migration 0019, whose header explains why it is safe without
//! the gate's lock). The rows come back as a claim's do, for the committing node's pickers.

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgExecutor, Row};

use crate::error::Result;
use crate::store::pg::claim::Claimed;

/// Claims into the slots freed by `$6` (rows whose outcome this transaction committed,
/// each with its queue, gate and key as claimed: `$7`, `$8`, `$9`).
pub(super) const HANDOFF: &str =
    "/* gd:handoff */ SELECT * FROM gd_handoff($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// One row of a gate key that ended in the commit, freeing its slot.
#[derive(Debug, Clone)]
pub(crate) struct Freed {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) gate: String,
    pub(crate) key: String,
}

/// What the hand-off needs of the node.
#[derive(Debug)]
pub(crate) struct HandoffParams<'a> {
    pub(crate) names: &'a [String],
    pub(crate) versions: &'a [i32],
    pub(crate) node: &'a str,
    pub(crate) lease_ttl_ms: i64,
    pub(crate) now: Option<DateTime<Utc>>,
}

/// Claims a row into each slot `freed` held, of its key, and returns them with their queue.
pub(crate) async fn handoff<'e>(
    db: impl PgExecutor<'e>,
    p: &HandoffParams<'_>,
    freed: &[Freed],
) -> Result<Vec<(String, Claimed)>> {
    let ids: Vec<i64> = freed.iter().map(|f| f.id).collect();
    let queues: Vec<&str> = freed.iter().map(|f| f.queue.as_str()).collect();
    let gates: Vec<&str> = freed.iter().map(|f| f.gate.as_str()).collect();
    let keys: Vec<&str> = freed.iter().map(|f| f.key.as_str()).collect();
    let rows = sqlx::query(HANDOFF)
        .bind(p.names)
        .bind(p.versions)
        .bind(p.node)
        .bind(p.lease_ttl_ms)
        .bind(p.now)
        .bind(ids)
        .bind(queues)
        .bind(gates)
        .bind(keys)
        .fetch_all(db)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("queue")?, Claimed::from_row(r)?)))
        .collect()
}
