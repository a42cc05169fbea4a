//! A row to insert, type-erased: what every insert and every spawned child reduces to.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::model::options::InsertOptions;
use crate::model::status::Status;

/// A row to insert, type-erased: what `insert`, `insert_all`, `insert_json` and
/// `schedule_children` all reduce to.
#[derive(Debug, Clone)]
pub struct NewInstance {
    /// FSM name.
    pub fsm: String,
    /// FSM version.
    pub version: i32,
    /// Starting step.
    pub step: String,
    /// State.
    pub state: Value,
    /// Queue.
    pub queue: String,
    /// Priority (lower first).
    pub priority: i16,
    /// Partition key: a K = 1 key, or the key within `gate`.
    pub partition_key: Option<String>,
    /// The gate `partition_key` is a key of (`None`: a K = 1 key).
    pub gate: Option<String>,
    /// The rate limit its first step takes tokens from, and the key within it.
    pub rate_limit: Option<(String, String)>,
    /// The tokens it takes (default 1).
    pub rate_weight: f64,
    /// Unique key.
    pub unique_key: Option<String>,
    /// Unique scope (resolved: a key always comes with a scope).
    pub unique_scope: Option<Vec<Status>>,
    /// Absolute eligibility (eligible_at, else schedule_at).
    pub eligible_at: Option<DateTime<Utc>>,
    /// Delay from the clock's now, when no absolute time was given.
    pub delay: Option<Duration>,
    /// Lost leases allowed per step.
    pub max_reaps: i32,
}

impl NewInstance {
    /// Builds a row from a resolved FSM identity, a state and insert options: the step
    /// defaults to `initial`, the queue to `default_queue`, a unique key without a scope
    /// holds in every non-terminal status, and `eligible_at` takes precedence over
    /// `schedule_at`, which takes precedence over `schedule_in`.
    pub(crate) fn from_parts(
        fsm: &str,
        version: i32,
        initial: &str,
        default_queue: &str,
        max_reaps: i32,
        state: Value,
        opts: InsertOptions,
    ) -> Self {
        let (partition_key, gate) = match opts.concurrency.as_ref().map(|c| c.columns()) {
            Some((key, gate)) => (Some(key), gate),
            None => (None, None),
        };
        NewInstance {
            fsm: fsm.to_string(),
            version,
            step: opts.step.clone().unwrap_or_else(|| initial.to_string()),
            state,
            queue: opts
                .queue
                .clone()
                .unwrap_or_else(|| default_queue.to_string()),
            priority: opts.priority,
            partition_key,
            gate,
            rate_limit: opts.rate_limit.clone().map(|k| (k.name, k.key)),
            rate_weight: opts.weight.unwrap_or(1.0),
            unique_scope: opts.resolved_scope(),
            eligible_at: opts.absolute_at(),
            delay: opts.delay(),
            unique_key: opts.unique_key,
            max_reaps,
        }
    }
}
