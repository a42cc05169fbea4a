//! The rows a claim returns, and what it needs to know.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use crate::model::inbox::{ChildInfo, Signal};

/// One claimed row with its inbox and children.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Claimed {
    pub(crate) id: i64,
    pub(crate) fsm: String,
    pub(crate) fsm_version: i32,
    pub(crate) step: String,
    pub(crate) state: Value,
    pub(crate) attempt: i32,
    pub(crate) awaits: Vec<String>,
    pub(crate) lease_epoch: i64,
    /// Its partition key (a K = 1 key, or its key within `gate`): when its step ends,
    /// the key's next row may run.
    pub(crate) partition_key: Option<String>,
    /// Its gate.
    pub(crate) gate: Option<String>,
    pub(crate) inbox: Json<Vec<Signal>>,
    pub(crate) children: Json<Vec<ChildInfo>>,
    pub(crate) now: DateTime<Utc>,
    /// The gate slot it holds, where the statement says: the hand-off does (migration
    /// 0027), the claims do not. Passed back to the hand-off of the commit that ends it.
    #[sqlx(default)]
    pub(crate) gate_slot: Option<i16>,
    /// The batch of the log it was claimed in, `(lane, batch)`, for a plain row: its
    /// `lease_epoch` is then its entry's seq (`store::pg::log`). `None` for a row claimed
    /// by itself (a key, a gate or a limit), which holds a lease of its own.
    #[sqlx(default)]
    pub(crate) lane: Option<i32>,
    #[sqlx(default)]
    pub(crate) batch: Option<i64>,
}

impl Claimed {
    /// Its batch in the log, if it was claimed from the log.
    pub(crate) fn log_batch(&self) -> Option<(i32, i64)> {
        self.lane.zip(self.batch)
    }
}

/// What one claim statement did: the rows it claimed, and what it handed back or
/// deferred.
#[derive(Debug, Default)]
pub(crate) struct Pick {
    pub(crate) rows: Vec<Claimed>,
    /// Rows this pick locked but handed back because an earlier row of the batch has the
    /// same K = 1 key, or their gate key had no free slot left.
    pub(crate) contended: Vec<Contended>,
    /// Per rate-limit key of the pick: the rows that wanted tokens and how many of them
    /// were deferred until their tokens are due.
    pub(crate) throttled: Vec<Throttled>,
    /// The earliest instant a row of this queue that waits for reserved tokens is due.
    pub(crate) next_due: Option<DateTime<Utc>>,
    /// The statement's time.
    pub(crate) now: Option<DateTime<Utc>>,
    /// Whether a gate or a rate limit is declared: the next pick's variant
    /// ([`CLAIM`](super::CLAIM) or [`CLAIM_PLAIN`](super::CLAIM_PLAIN)). `None` when the
    /// pick returned nothing.
    pub(crate) flow: Option<bool>,
    /// `flow` differs from the variant this pick ran: pick again at once with the other.
    pub(crate) switch: bool,
    /// It took a range of the log: pick again at once, the queue may hold more.
    pub(crate) advanced: bool,
}

/// One rate-limit key of a pick.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Throttled {
    pub(crate) limit: String,
    pub(crate) key: String,
    pub(crate) wanted: usize,
    pub(crate) deferred: usize,
}

/// A row handed back by a pick because its partition was taken.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Contended {
    pub(crate) id: i64,
    pub(crate) fsm: String,
    pub(crate) partition_key: String,
    /// Its gate, when a full gate key (not a K = 1 one) turned it back.
    #[serde(default)]
    pub(crate) gate: Option<String>,
}

/// What the claim needs to know.
#[derive(Debug)]
pub(crate) struct ClaimParams<'a> {
    pub(crate) queue: &'a str,
    pub(crate) names: &'a [String],
    pub(crate) versions: &'a [i32],
    pub(crate) demand: i64,
    pub(crate) node: &'a str,
    pub(crate) lease_ttl_ms: i64,
    pub(crate) now: Option<DateTime<Utc>>,
    /// Gates or rate limits are declared (as the last pick found): the full [`CLAIM`](super::CLAIM).
    pub(crate) flow: bool,
}
