//! `explain`: why an instance is not running, or what it is doing — one typed
//! [`Reason`] with its evidence, and one English line for people.
//!
//! The reasons are checked in a fixed order, and the first that holds is the answer:
//!
//! 1. it finished: [`Reason::Done`], [`Reason::Failed`];
//! 2. a node runs it: [`Reason::Executing`];
//! 3. it is parked: [`Reason::AwaitingSignals`], [`Reason::AwaitingChildren`];
//! 4. its queue is paused: [`Reason::QueuePaused`];
//! 5. it is not due yet: [`Reason::RateLimited`] (waiting for the tokens it reserved),
//!    [`Reason::Scheduled`] (attempt 0), [`Reason::Backoff`] (a retry);
//! 6. another instance of its partition key runs: [`Reason::PartitionBlocked`]; its gate
//!    key runs as many steps as the gate allows: [`Reason::GateFull`];
//! 7. no live node would pick it: [`Reason::NoNodeForQueue`], [`Reason::NoNodeForVersion`];
//! 8. it is runnable now: [`Reason::Runnable`], with the rows ahead of it.
//!
//! Both engines gather the same [`ExplainFacts`] (Postgres in one statement, the testkit
//! from its rows) and this module alone turns them into the answer, so the two cannot
//! disagree on it. Counts are bounded ([`EXPLAIN_COUNT_LIMIT`]) so that an explanation
//! costs the same on a table of a million rows.

mod display;
mod time;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{HistoryKind, Status};

/// The most rows any count of an explanation reads: a larger count shows as "≥10,000".
pub const EXPLAIN_COUNT_LIMIT: i64 = 10_000;

/// The most children or signal names an explanation lists.
pub const EXPLAIN_LIST_LIMIT: i64 = 10;

/// The newest history entries an explanation reads to say how its current step has gone.
pub const EXPLAIN_HISTORY_LIMIT: i64 = 100;

/// Why instance `id` is where it is: see [`crate::Client::explain`]. `Display` gives one
/// English line; [`Explanation::evidence`] a few more for an operator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The instance.
    pub id: i64,
    /// Its FSM's name.
    pub fsm: String,
    /// Its FSM's version.
    pub version: i32,
    /// Its queue.
    pub queue: String,
    /// Its status.
    pub status: Status,
    /// Its step (the one it runs next, or ran last if it finished).
    pub step: String,
    /// How many times it ran that step before without moving on (replays and lost leases
    /// count): 0 on the first run, as [`StepContext::attempt`](crate::StepContext::attempt). Text for
    /// people counts from 1 ("attempt 1" is the first run), as the history does.
    pub attempt: i32,
    /// The time the explanation was computed at: the database's (or the injected) clock.
    pub at: DateTime<Utc>,
    /// The reason, with its evidence.
    pub reason: Reason,
    /// What the history says of the current step, when it went wrong before: how often it
    /// failed and lost its lease since the instance came to it. `None` when nothing did,
    /// or no history is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trouble: Option<Trouble>,
}

/// The current step's failures, from the history: since the instance last went on to
/// it (a step's `next`, `await`, `children`, an operator's retry or restart, a migration,
/// a fork), its attempts that failed (`retry`, `failed`) and its leases lost. Read from
/// the newest [`EXPLAIN_HISTORY_LIMIT`] entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trouble {
    /// The step.
    pub step: String,
    /// Its attempts that failed.
    pub failures: i64,
    /// Its leases lost.
    pub leases_lost: i64,
    /// The newest failure's error.
    pub last_error: Option<String>,
}

impl Trouble {
    /// From the newest entries of an instance at `step`, newest first: `None` when the
    /// step has neither failed nor lost a lease since the instance came to it.
    pub fn of(step: &str, recent: &[(HistoryKind, String, Option<String>)]) -> Option<Trouble> {
        let mut t = Trouble {
            step: step.to_string(),
            failures: 0,
            leases_lost: 0,
            last_error: None,
        };
        for (kind, at, error) in recent {
            match kind {
                HistoryKind::Retry | HistoryKind::Failed if at == step => {
                    t.failures += 1;
                    if t.last_error.is_none() {
                        t.last_error = error.clone();
                    }
                }
                HistoryKind::LeaseLost if at == step => t.leases_lost += 1,
                HistoryKind::CancelRequested | HistoryKind::Cancelled | HistoryKind::Released => {}
                _ => break,
            }
        }
        (t.failures + t.leases_lost > 0).then_some(t)
    }
}

/// The one reason an instance is where it is, with its evidence, in the order they are
/// checked (see the module's docs). `#[non_exhaustive]`: later releases add reasons —
/// concurrency gates and rate limits will be checked after partitions, before nodes.
/// As JSON, the variant is named by `kind`: `{"kind": "awaiting_signals", "names": …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// 1. Finished with this result.
    Done {
        /// The result (`Display` truncates it).
        result: Value,
    },
    /// 1. Failed for good.
    Failed {
        /// Why.
        last_error: Option<String>,
    },
    /// 2. A node has claimed it and runs (or holds, buffered) its step.
    Executing {
        /// The node holding its lease.
        node: String,
        /// When the node claimed it for this step.
        since: DateTime<Utc>,
        /// When the lease ends unless the node's heartbeat extends it.
        lease_until: DateTime<Utc>,
        /// When the node last announced itself (`None`: it never did, or left).
        node_seen_at: Option<DateTime<Utc>>,
        /// Fresh: the lease holds and the node announced itself within the live window.
        heartbeat: Heartbeat,
        /// The lease has expired: the reaper will take the row back.
        lease_expired: bool,
        /// A cancel was requested: it fails after this step.
        cancel_requested: bool,
    },
    /// 3. Parked until a signal of one of these names arrives, or the deadline.
    AwaitingSignals {
        /// The names it awaits.
        names: Vec<String>,
        /// When it runs anyway (with nothing awaited), if ever.
        deadline: Option<DateTime<Utc>>,
        /// Signals in its inbox whose names it does not await.
        unrelated: Count,
        /// Their distinct names, sorted, the first [`EXPLAIN_LIST_LIMIT`].
        unrelated_names: Vec<String>,
    },
    /// 3. Parked until every child has finished.
    AwaitingChildren {
        /// Children not finished yet.
        pending: i32,
        /// Every child it spawned.
        total: Count,
        /// The first unfinished children by id, up to [`EXPLAIN_LIST_LIMIT`].
        waiting_on: Vec<ChildState>,
    },
    /// 4. Its queue is paused cluster-wide (`gd_queue_pauses`).
    QueuePaused {
        /// Since when.
        since: DateTime<Utc>,
        /// What the operator said.
        why: Option<String>,
    },
    /// 5. Inserted (or moved on) to run later: runnable at `at`, attempt 0.
    Scheduled {
        /// When it becomes runnable.
        at: DateTime<Utc>,
    },
    /// 5. Waiting for the tokens it reserved from its rate limit: runnable at `due`.
    RateLimited {
        /// The rate limit.
        limit: String,
        /// The key within it.
        key: String,
        /// When its tokens are there and it runs.
        due: DateTime<Utc>,
    },
    /// 5. Waiting out the delay of a retry (a `replay`, a failed migration): the
    ///    explanation's `attempt` is the retry's.
    Backoff {
        /// When it runs again.
        until: DateTime<Utc>,
        /// The last error, if the retry follows one.
        last_error: Option<String>,
    },
    /// 6. Another instance of its partition key is executing.
    PartitionBlocked {
        /// The partition key.
        key: String,
        /// The instance that holds it.
        holder: Holder,
    },
    /// 6. Its gate key already runs as many steps as the gate allows.
    GateFull {
        /// The gate.
        gate: String,
        /// The key within it.
        key: String,
        /// The gate's limit K.
        limit: i64,
        /// Steps of the key running (claimed, buffered or executing) now.
        running: i64,
    },
    /// 7. No live node picks from its queue.
    NoNodeForQueue {
        /// The live nodes (none serves the queue).
        live_nodes: Vec<String>,
    },
    /// 7. Live nodes pick from its queue, but none runs its FSM at its version.
    NoNodeForVersion {
        /// The live nodes that pick from its queue.
        nodes_on_queue: Vec<String>,
        /// The versions of its FSM those nodes run (or migrate from), ascending.
        versions_served: Vec<i32>,
    },
    /// 8. Runnable now: the next pick of its queue that reaches it runs it.
    Runnable {
        /// Due rows of its queue before it in the pick's order (priority, eligible_at, id).
        rows_ahead: Count,
    },
}

/// Whether the node holding a lease still beats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Heartbeat {
    /// The lease holds and the node announced itself within the live window.
    Fresh,
    /// The lease expired, or the node has not announced itself within the live window.
    Stale,
}

/// A count read with a bound: at least `n` when `capped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// The rows counted.
    pub n: i64,
    /// True when the count stopped at [`EXPLAIN_COUNT_LIMIT`]: there may be more.
    pub capped: bool,
}

impl Count {
    /// A count read with `LIMIT EXPLAIN_COUNT_LIMIT`.
    pub fn bounded(n: i64) -> Count {
        Count {
            n: n.min(EXPLAIN_COUNT_LIMIT),
            capped: n >= EXPLAIN_COUNT_LIMIT,
        }
    }
}

/// A child a parent still waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildState {
    /// The child's id.
    pub id: i64,
    /// Its FSM.
    pub fsm: String,
    /// Its step.
    pub step: String,
    /// Its status.
    pub status: Status,
}

/// The instance executing in a partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Its id.
    pub id: i64,
    /// The step it runs.
    pub step: String,
    /// The node running it.
    pub node: Option<String>,
    /// Its lease's end.
    pub lease_until: Option<DateTime<Utc>>,
}

/// What a store knows of one instance, for [`ExplainFacts::explain`]: the row, and the
/// evidence each reason needs (a store may leave out what the row's status does not need).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct ExplainFacts {
    pub id: i64,
    pub fsm: String,
    pub version: i32,
    pub queue: String,
    pub status: Status,
    pub step: String,
    pub attempt: i32,
    pub now: DateTime<Utc>,
    pub eligible_at: DateTime<Utc>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
    pub awaits: Vec<String>,
    pub await_deadline: Option<DateTime<Utc>>,
    pub locked_by: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// For an executing row: when it was claimed (its last update).
    pub since: DateTime<Utc>,
    pub cancel_requested: bool,
    /// For an executing row: whether its node announced itself within the live window,
    /// and when it last did.
    pub node_live: bool,
    pub node_seen_at: Option<DateTime<Utc>>,
    /// Signals in the inbox whose names are not awaited (bounded), and their names.
    pub unrelated: i64,
    pub unrelated_names: Vec<String>,
    pub children_pending: i32,
    /// Every child (bounded), and the first unfinished ones.
    pub children_total: i64,
    pub waiting_on: Vec<ChildState>,
    /// The queue's pause: since when, and why.
    pub paused: Option<(DateTime<Utc>, Option<String>)>,
    pub partition_key: Option<String>,
    pub holder: Option<Holder>,
    /// Its gate with the gate's limit and the key's running rows, if it is gated.
    pub gate: Option<(String, i64, i64)>,
    /// Its rate limit and key, when it waits for tokens it reserved.
    pub rate_wait: Option<(String, String)>,
    /// The nodes; `None` when the store has none (the testkit runs everything it knows).
    pub nodes: Option<NodeFacts>,
    /// Due rows of the queue ahead of it in the pick's order (bounded).
    pub rows_ahead: i64,
    /// Its newest history entries (at most [`EXPLAIN_HISTORY_LIMIT`]), newest first: kind,
    /// step, error.
    pub recent: Vec<(HistoryKind, String, Option<String>)>,
}

/// The live nodes, as they concern one instance.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// Every live node.
    pub live: Vec<String>,
    /// Those that pick from the instance's queue.
    pub on_queue: Vec<String>,
    /// Those that pick from its queue and run its `(fsm, version)`.
    pub running: Vec<String>,
    /// The versions of its FSM that the nodes on its queue run.
    pub versions_on_queue: Vec<i32>,
}

impl ExplainFacts {
    /// The answer: the first reason that holds, in the order of the module's docs.
    pub fn explain(self) -> Explanation {
        let reason = self.reason();
        let trouble = Trouble::of(&self.step, &self.recent);
        Explanation {
            trouble,
            id: self.id,
            fsm: self.fsm,
            version: self.version,
            queue: self.queue,
            status: self.status,
            step: self.step,
            attempt: self.attempt,
            at: self.now,
            reason,
        }
    }

    fn reason(&self) -> Reason {
        match self.status {
            Status::Done => Reason::Done {
                result: self.result.clone().unwrap_or(Value::Null),
            },
            Status::Failed => Reason::Failed {
                last_error: self.last_error.clone(),
            },
            Status::Executing => {
                let lease_until = self.lease_expires_at.unwrap_or(self.since);
                let lease_expired = lease_until <= self.now;
                Reason::Executing {
                    node: self.locked_by.clone().unwrap_or_default(),
                    since: self.since,
                    lease_until,
                    node_seen_at: self.node_seen_at,
                    heartbeat: if self.node_live && !lease_expired {
                        Heartbeat::Fresh
                    } else {
                        Heartbeat::Stale
                    },
                    lease_expired,
                    cancel_requested: self.cancel_requested,
                }
            }
            Status::AwaitingSignal => Reason::AwaitingSignals {
                names: self.awaits.clone(),
                deadline: self.await_deadline,
                unrelated: Count::bounded(self.unrelated),
                unrelated_names: self.unrelated_names.clone(),
            },
            Status::AwaitingChildren => Reason::AwaitingChildren {
                pending: self.children_pending,
                total: Count::bounded(self.children_total),
                waiting_on: self.waiting_on.clone(),
            },
            Status::Runnable => self.runnable_reason(),
        }
    }

    /// Checks 4 to 8, for a runnable row.
    fn runnable_reason(&self) -> Reason {
        if let Some((since, why)) = &self.paused {
            return Reason::QueuePaused {
                since: *since,
                why: why.clone(),
            };
        }
        if self.eligible_at > self.now {
            if let Some((limit, key)) = &self.rate_wait {
                return Reason::RateLimited {
                    limit: limit.clone(),
                    key: key.clone(),
                    due: self.eligible_at,
                };
            }
            return if self.attempt == 0 {
                Reason::Scheduled {
                    at: self.eligible_at,
                }
            } else {
                Reason::Backoff {
                    until: self.eligible_at,
                    last_error: self.last_error.clone(),
                }
            };
        }
        if let (Some(key), Some(holder)) = (&self.partition_key, &self.holder) {
            return Reason::PartitionBlocked {
                key: key.clone(),
                holder: holder.clone(),
            };
        }
        if let (Some(key), Some((gate, limit, running))) = (&self.partition_key, &self.gate) {
            if running >= limit {
                return Reason::GateFull {
                    gate: gate.clone(),
                    key: key.clone(),
                    limit: *limit,
                    running: *running,
                };
            }
        }
        if let Some(nodes) = &self.nodes {
            if nodes.on_queue.is_empty() {
                return Reason::NoNodeForQueue {
                    live_nodes: nodes.live.clone(),
                };
            }
            if nodes.running.is_empty() {
                return Reason::NoNodeForVersion {
                    nodes_on_queue: nodes.on_queue.clone(),
                    versions_served: nodes.versions_on_queue.clone(),
                };
            }
        }
        Reason::Runnable {
            rows_ahead: Count::bounded(self.rows_ahead),
        }
    }
}
