//! The kit's tables in memory: `gd_instances`, `gd_signals`, the queue pauses, the gates,
//! the rate limits with their buckets, and the history. Each operation mirrors one SQL statement of
//! `gen_durable::store::pg`, and sits in the file named like that statement's file
//! (`claim.rs` holds the kit's CLAIM, `outcome.rs` its APPLY, …), so the kit and Postgres
//! commit the same thing. Comments name the statement each function follows.
//!
//! This file holds the rows, the store, and what every operation reads: a row's unique
//! guard, its inbox, its children, a snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gen_durable::{ChildInfo, QueuePause, Signal, Status};
use serde_json::Value;

use crate::instance::Instance;

mod bulk;
mod claim;
mod control;
mod explain;
mod gate;
pub(crate) mod history;
mod insert;
mod lease;
mod migration;
mod outcome;
mod pause;
mod rate_limit;
pub(crate) mod schedule;
mod signal;
mod wait;

pub use explain::{KIT_LEASE, KIT_NODE};
pub use history::KIT_ACTOR;
use rate_limit::Bucket;

/// One row of `gd_instances`.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) fsm: String,
    pub(crate) version: i32,
    pub(crate) step: String,
    pub(crate) status: Status,
    pub(crate) state: Value,
    pub(crate) result: Option<Value>,
    pub(crate) awaits: Vec<String>,
    pub(crate) await_deadline: Option<DateTime<Utc>>,
    pub(crate) queue: String,
    pub(crate) priority: i16,
    pub(crate) partition_key: Option<String>,
    /// The gate `partition_key` is a key of (`None`: a K = 1 key).
    pub(crate) gate: Option<String>,
    /// The rate limit and key `rate_step` takes `rate_weight` tokens from.
    pub(crate) rate_limit: Option<(String, String)>,
    pub(crate) rate_weight: f64,
    pub(crate) rate_step: Option<String>,
    /// Its tokens are reserved (its bucket counts them as held): when due, it starts as
    /// soon as its bucket holds them, ahead of rows that have not reserved.
    pub(crate) rate_paid: bool,
    pub(crate) eligible_at: DateTime<Utc>,
    pub(crate) attempt: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) parent_id: Option<i64>,
    pub(crate) children_pending: i32,
    pub(crate) unique_key: Option<String>,
    pub(crate) unique_scope: Option<Vec<Status>>,
    /// Lost leases of the current step, and the bound after which the reaper fails it.
    pub(crate) reaps: i32,
    pub(crate) max_reaps: i32,
    /// When a simulated worker claimed it (`TestKit::claim`): it is `executing` since.
    pub(crate) claimed_at: Option<DateTime<Utc>>,
    /// When a statement last changed it, as every statement of the engine sets it: what
    /// a bulk [`gen_durable::Filter`]'s time conditions read.
    pub(crate) updated_at: DateTime<Utc>,
    /// When it was inserted.
    pub(crate) inserted_at: DateTime<Utc>,
}

impl Row {
    /// The generated column `unique_guard`: the key while the status is in the scope.
    fn guard(&self) -> Option<&str> {
        guard(&self.unique_key, &self.unique_scope, self.status)
    }
}

fn guard<'a>(
    key: &'a Option<String>,
    scope: &Option<Vec<Status>>,
    status: Status,
) -> Option<&'a str> {
    match (key, scope) {
        (Some(k), Some(s)) if s.contains(&status) => Some(k.as_str()),
        _ => None,
    }
}

/// One row of `gd_signals`.
#[derive(Debug, Clone)]
struct StoredSignal {
    target: i64,
    signal: Signal,
}

/// The kit's tables; its operations are in the files of this module.
#[derive(Debug, Default)]
pub(crate) struct Store {
    rows: BTreeMap<i64, Row>,
    signals: BTreeMap<i64, StoredSignal>,
    last_id: i64,
    last_signal: i64,
    /// `gd_queue_pauses`: the paused queues, by name.
    paused: BTreeMap<String, QueuePause>,
    /// `gd_gates`: each declared gate's limit K.
    gates: BTreeMap<String, u32>,
    /// `gd_rate_limits`: tokens per second and burst, by name.
    rate_limits: BTreeMap<String, (f64, f64)>,
    /// `gd_buckets`, by (limit, key).
    buckets: BTreeMap<(String, String), Bucket>,
    /// `gd_history`: each entry with its instance, in entry order.
    history: Vec<(i64, gen_durable::HistoryEntry)>,
    last_entry: i64,
    /// Who the operator actions are recorded as (`TestKit::with_actor`).
    pub(crate) actor: Option<String>,
}

fn after(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    // SQL builds intervals from whole milliseconds (`store::pg::millis`).
    let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    now + chrono::Duration::milliseconds(ms)
}

impl Store {
    pub(crate) fn row(&self, id: i64) -> Option<&Row> {
        self.rows.get(&id)
    }

    pub(crate) fn row_mut(&mut self, id: i64) -> Option<&mut Row> {
        self.rows.get_mut(&id)
    }

    pub(crate) fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.rows.keys().copied()
    }

    fn inbox(&self, id: i64) -> Vec<Signal> {
        self.signals
            .values()
            .filter(|s| s.target == id)
            .map(|s| s.signal.clone())
            .collect()
    }

    fn children(&self, id: i64) -> impl Iterator<Item = &Row> {
        self.rows.values().filter(move |r| r.parent_id == Some(id))
    }

    /// What a step of `id` sees as `ctx.children()` (the pick's `children` column).
    pub(crate) fn child_infos(&self, id: i64) -> Vec<ChildInfo> {
        self.children(id)
            .map(|c| ChildInfo {
                id: c.id,
                fsm: c.fsm.clone(),
                status: c.status,
                state: c.state.clone(),
                result: c.result.clone(),
                last_error: c.last_error.clone(),
            })
            .collect()
    }

    pub(crate) fn inbox_of(&self, id: i64) -> Vec<Signal> {
        self.inbox(id)
    }

    pub(crate) fn snapshot(&self, id: i64) -> Option<Instance> {
        let r = self.rows.get(&id)?;
        Some(Instance {
            id: r.id,
            fsm: r.fsm.clone(),
            fsm_version: r.version,
            step: r.step.clone(),
            status: r.status,
            state: r.state.clone(),
            result: r.result.clone(),
            last_error: r.last_error.clone(),
            attempt: r.attempt,
            awaits: r.awaits.clone(),
            await_deadline: r.await_deadline,
            eligible_at: r.eligible_at,
            queue: r.queue.clone(),
            priority: r.priority,
            partition_key: r.partition_key.clone(),
            gate: r.gate.clone(),
            unique_key: r.unique_key.clone(),
            parent_id: r.parent_id,
            children_pending: r.children_pending,
            inbox: self.inbox(id),
            children: self.children(id).map(|c| c.id).collect(),
        })
    }
}
