//! One queue on one node: the picker claims runnable rows into a local buffer and hands
//! them to the executor as slots free up; at shutdown it drains. The picker owns its
//! buffer and in-flight set; nothing is shared but the claims table the heartbeat reads.
//! Rows a group commit claimed into the gate slots it freed come from the committer
//! ([`Handed`]) and run before the buffer's.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::executor::{run_step, Ended};
use crate::engine::handoff::Handed;
use crate::engine::shared::on_conn;
use crate::engine::shared::Shared;
use crate::engine::QueueConfig;
use crate::model::error::{Error, Result};
use crate::store::pg::{claim, lease, log, UNIQUE_VIOLATION};
use crate::telemetry::Event;

/// How a queue drained.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueDrain {
    /// The queue.
    pub queue: String,
    /// Buffered rows released to `runnable` at once.
    pub released: usize,
    /// Steps running when the drain began.
    pub in_flight: usize,
    /// Of those, steps still running at the deadline, cancelled and released.
    pub cancelled: usize,
}

/// One queue of this node: what its claims and steps need.
pub(crate) struct Queue {
    pub(crate) name: Arc<str>,
    pub(crate) cfg: QueueConfig,
    pub(crate) shared: Arc<Shared>,
    /// Notified to pick now (a wake-up notification, or `Engine::wake`).
    pub(crate) wake: Arc<Notify>,
    /// Cancelled when the engine stops picking: running steps then stop running ahead.
    pub(crate) draining: CancellationToken,
}

/// A claim in flight, beside the picker's loop: finished steps are collected and their
/// slots refilled from the buffer while it runs. Yields the demand and the rows.
type Claiming = Pin<Box<dyn Future<Output = (usize, Result<claim::Pick>)> + Send>>;

/// A step running on this queue.
struct Running {
    id: i64,
    epoch: i64,
    cancel: CancellationToken,
    /// The row has a partition key, which its end frees.
    partitioned: bool,
}

/// The claim loop of one queue.
pub(crate) struct Picker {
    queue: Arc<Queue>,
    /// Claimed rows waiting for a free slot.
    buffer: VecDeque<claim::Claimed>,
    /// Rows a group commit claimed for this queue into gate slots it freed: they hold
    /// their slots already, and run first.
    handed: VecDeque<claim::Claimed>,
    /// Where they come from, until the picker stops claiming.
    handed_rx: Handed,
    /// The steps running.
    tasks: JoinSet<Ended>,
    running: HashMap<tokio::task::Id, Running>,
    claiming: Option<Claiming>,
    /// The poll interval now: doubles while claims come back empty.
    poll: Duration,
    /// Claim at the next turn of the loop.
    pick_now: bool,
    /// The last claim was full, or was not made: the queue may hold more.
    maybe_more: bool,
    /// The earliest `replay` this queue committed: claim then, not at the next poll.
    wake_at: Option<Instant>,
}

impl Picker {
    pub(crate) fn new(queue: Queue, handed_rx: Handed) -> Self {
        Picker {
            poll: queue.cfg.poll_interval,
            queue: Arc::new(queue),
            buffer: VecDeque::new(),
            handed: VecDeque::new(),
            handed_rx,
            tasks: JoinSet::new(),
            running: HashMap::new(),
            claiming: None,
            pick_now: true,
            maybe_more: true,
            wake_at: None,
        }
    }

    /// Claims and runs until `stop_picking`, then drains by `deadline`.
    pub(crate) async fn run(
        mut self,
        stop_picking: CancellationToken,
        deadline: watch::Receiver<Option<Instant>>,
    ) -> QueueDrain {
        let q = self.queue.clone();
        loop {
            self.dispatch();
            if self.pick_now && self.claiming.is_none() && !stop_picking.is_cancelled() {
                self.start_claim();
            }
            q.shared.telemetry.emit(Event::SchedulerSaturation {
                in_flight: self.tasks.len(),
                buffer: self.buffer.len(),
                concurrency: q.cfg.concurrency,
                prefetch: q.cfg.prefetch,
                queue: q.name.to_string(),
            });
            let next_poll = Instant::now() + self.poll;
            let sleep_until = self.wake_at.map_or(next_poll, |w| w.min(next_poll));
            tokio::select! {
                _ = stop_picking.cancelled() => break,
                (demand, got) = in_flight(&mut self.claiming), if self.claiming.is_some() => {
                    self.claiming = None;
                    self.claimed(demand, got);
                }
                _ = q.wake.notified() => self.pick_now = true,
                Some(rows) = self.handed_rx.recv() => self.take_handed(rows),
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    self.finished(done).await;
                }
                _ = tokio::time::sleep_until(sleep_until) => {
                    if self.wake_at.is_some_and(|w| w <= Instant::now()) {
                        self.wake_at = None;
                    }
                    self.pick_now = true;
                }
            }
        }
        // A claim still in flight has taken its rows: buffer them, so the drain releases them.
        if let Some(c) = self.claiming.take() {
            if let (_, Ok(pick)) = c.await {
                self.buffer.extend(pick.rows);
            }
        }
        // No more handed-off rows (the committer releases what it cannot send): those sent
        // already are released with the buffer.
        self.handed_rx.close();
        while let Ok(rows) = self.handed_rx.try_recv() {
            self.take_handed(rows);
        }
        self.drain(deadline).await
    }

    /// Rows a group commit claimed for this queue: held from now on, run first.
    fn take_handed(&mut self, rows: Vec<claim::Claimed>) {
        let q = &self.queue;
        for r in &rows {
            q.shared.claims.hold(r.id, r.lease_epoch, r.log_batch());
        }
        q.shared.telemetry.emit(Event::GateHandoff {
            count: rows.len(),
            queue: q.name.to_string(),
        });
        self.handed.extend(rows);
    }

    /// Starts a claim for the free slots, if there are enough ([`demand`]).
    fn start_claim(&mut self) {
        self.pick_now = false;
        let waiting = self.buffer.len() + self.handed.len();
        if let Some(demand) = demand(&self.queue.cfg, self.tasks.len(), waiting) {
            let q = self.queue.clone();
            self.claiming = Some(Box::pin(async move { (demand, q.claim(demand).await) }));
        } else {
            // Not enough free slots to pick now; the queue may well hold more.
            self.maybe_more = true;
        }
    }

    /// A claim came back.
    fn claimed(&mut self, demand: usize, got: Result<claim::Pick>) {
        let cfg = &self.queue.cfg;
        match got {
            Ok(pick) => {
                // Rows waiting for reserved tokens: claim when the first is due, not at
                // the next poll (which backs off while claims come back empty).
                if let (Some(due), Some(now)) = (pick.next_due, pick.now) {
                    let at = Instant::now() + (due - now).to_std().unwrap_or_default();
                    self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
                }
                let rows = pick.rows;
                let count = rows.len();
                self.buffer.extend(rows);
                // A full claim: the queue may hold more, claim again at once (and at
                // once with the other variant when gates or rate limits came or went).
                self.maybe_more = count == demand || pick.advanced;
                self.pick_now |= self.maybe_more || pick.switch;
                self.poll = if count == 0 && !pick.advanced {
                    (self.poll * 2).min(cfg.max_poll_interval)
                } else {
                    cfg.poll_interval
                };
            }
            Err(e) => {
                tracing::warn!(target: "gen_durable::pick", queue = %self.queue.name, error = %e, "pick failed");
                self.maybe_more = false;
                self.poll = cfg.poll_interval;
            }
        }
    }

    /// A step ended. A group commit finishes many steps at once: collect every step that
    /// is done by now, then refill their slots with one claim.
    async fn finished(
        &mut self,
        done: std::result::Result<(tokio::task::Id, Ended), tokio::task::JoinError>,
    ) {
        tokio::task::yield_now().await;
        let mut done = Some(done);
        while let Some(d) = done.take().or_else(|| self.tasks.try_join_next_with_id()) {
            let (task_id, handed_off) = match d {
                Ok((tid, ended)) => {
                    if let Some(d) = ended.replay {
                        let at = Instant::now() + d;
                        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
                    }
                    (tid, ended.handed_off)
                }
                Err(e) => (e.id(), false),
            };
            // A partition freed: the key's next row can run now, not at the next poll
            // (a claim hands back all but one row of a key) — unless the commit that
            // freed it handed its gate slot to that row already.
            if self.running.remove(&task_id).is_some_and(|r| r.partitioned) && !handed_off {
                self.pick_now = true;
            }
        }
        self.pick_now |= self.maybe_more || !self.buffer.is_empty();
    }

    /// Fills the free slots from the buffer.
    fn dispatch(&mut self) {
        let q = &self.queue;
        while self.tasks.len() < q.cfg.concurrency {
            let Some(row) = self.handed.pop_front().or_else(|| self.buffer.pop_front()) else {
                break;
            };
            let cancel = CancellationToken::new();
            let (id, epoch, partitioned) = (row.id, row.lease_epoch, row.partition_key.is_some());
            q.shared.claims.run(id, epoch, cancel.clone());
            // Boxed: the task then holds a pointer, not the step's future (~5 KB), so
            // spawning it and storing its end copy a few bytes, not the whole future
            // (those copies were ~15% of the engine's CPU in a drain; gen_durable_bench/results/PERFORMANCE-log.md).
            let handle = self.tasks.spawn(Box::pin(run_step(
                q.shared.clone(),
                row,
                cancel.clone(),
                q.draining.clone(),
                q.name.clone(),
            )));
            self.running.insert(
                handle.id(),
                Running {
                    id,
                    epoch,
                    cancel,
                    partitioned,
                },
            );
        }
    }

    /// The graceful drain: release the buffer at once; let running steps finish until
    /// the deadline; then cancel them and release their rows.
    async fn drain(mut self, mut deadline: watch::Receiver<Option<Instant>>) -> QueueDrain {
        let q = self.queue.clone();
        let buffered: Vec<(i64, i64)> = (self.handed.iter().chain(&self.buffer))
            .map(|r| (r.id, r.lease_epoch))
            .collect();
        let released = q.release(&buffered).await;
        let in_flight = self.tasks.len();
        let until = loop {
            if let Some(t) = *deadline.borrow() {
                break t;
            }
            if deadline.changed().await.is_err() {
                break Instant::now();
            }
        };
        let mut cancelled = 0;
        loop {
            tokio::select! {
                done = self.tasks.join_next_with_id() => match done {
                    None => break,
                    Some(Ok((tid, _))) => { self.running.remove(&tid); }
                    Some(Err(e)) => { self.running.remove(&e.id()); }
                },
                _ = tokio::time::sleep_until(until) => {
                    // Past the deadline: ask steps to stop, then take them away and give
                    // their rows back without counting an attempt.
                    for r in self.running.values() {
                        r.cancel.cancel();
                    }
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    let left: Vec<(i64, i64)> =
                        self.running.values().map(|r| (r.id, r.epoch)).collect();
                    cancelled = q.release(&left).await;
                    break;
                }
            }
        }
        q.shared.telemetry.emit(Event::SchedulerDrain {
            released,
            in_flight,
            queue: q.name.to_string(),
        });
        QueueDrain {
            queue: q.name.to_string(),
            released,
            in_flight,
            cancelled,
        }
    }
}

impl Queue {
    /// One claim of up to `demand` rows; the rows join this node's claims table.
    async fn claim(&self, demand: usize) -> Result<claim::Pick> {
        let mut pick = self.claim_rows(demand).await?;
        if let Some(flow) = pick.flow {
            self.shared.flow.store(flow, Ordering::Relaxed);
        }
        let rows = &pick.rows;
        let count = rows.len();
        // Rows are claimed (leases recorded in the database) but not yet known here.
        if count > 0 {
            fail::fail_point!("gd::after_claim");
        }
        self.shared.telemetry.emit(Event::PickStop {
            count,
            demand,
            queue: self.name.to_string(),
            worker: self.shared.node_id.clone(),
        });
        self.contended(&pick.contended);
        self.throttled(rows, &pick.contended);
        for t in &pick.throttled {
            if t.deferred > 0 {
                self.shared.telemetry.emit(Event::RateLimitThrottled {
                    wanted: t.wanted,
                    admitted: t.wanted - t.deferred,
                    limit: t.limit.clone(),
                    key: t.key.clone(),
                    queue: self.name.to_string(),
                });
            }
        }
        pick.rows
            .retain(|r| self.shared.claims.hold(r.id, r.lease_epoch, r.log_batch()));
        Ok(pick)
    }

    /// One claim: plain rows from the log, then — only when the log's claim says some
    /// are due — the rows with a key, a gate or a limit, claimed row by row
    /// ([`Self::claim_keyed`]) for the rest of the demand.
    async fn claim_rows(&self, demand: usize) -> Result<claim::Pick> {
        let shared = &self.shared;
        let params = claim::ClaimParams {
            queue: &self.name,
            names: &shared.names,
            versions: &shared.versions,
            demand: demand as i64,
            node: &shared.node_id,
            lease_ttl_ms: crate::store::pg::millis(shared.lease_ttl),
            now: shared.db.now(),
            flow: false,
        };
        let params = &params;
        let taken = on_conn!(shared.db, |c| log::claim(c, params))?;
        let rest = demand.saturating_sub(taken.rows.len());
        let mut pick = if taken.keyed && rest > 0 {
            self.claim_keyed(rest).await?
        } else {
            claim::Pick::default()
        };
        pick.rows.extend(taken.rows);
        pick.advanced = taken.advanced;
        Ok(pick)
    }

    /// One claim statement of rows with a key, a gate or a limit, retried when two nodes
    /// race on a partition key (the loser's whole statement fails on the partition index
    /// and claims nothing).
    async fn claim_keyed(&self, demand: usize) -> Result<claim::Pick> {
        let shared = &self.shared;
        let mut contended = 0;
        loop {
            let params = claim::ClaimParams {
                queue: &self.name,
                names: &shared.names,
                versions: &shared.versions,
                demand: demand as i64,
                node: &shared.node_id,
                lease_ttl_ms: crate::store::pg::millis(shared.lease_ttl),
                now: shared.db.now(),
                flow: shared.flow.load(Ordering::Relaxed),
            };
            let params = &params;
            match on_conn!(shared.db, |c| claim::claim(c, params)) {
                Err(Error::Database(sqlx::Error::Database(db)))
                    if db.code().as_deref() == Some(UNIQUE_VIOLATION) && contended < 5 =>
                {
                    // Another node claimed a row of the same key at the same moment: this
                    // whole claim rolled back (nothing was taken), so just claim again.
                    contended += 1;
                    let key = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail())
                        .and_then(partition_key_of)
                        .unwrap_or_default();
                    shared.telemetry.emit(Event::PartitionContended {
                        count: 1,
                        id: 0,
                        fsm: String::new(),
                        partition_key: key,
                    });
                }
                other => return other,
            }
        }
    }

    /// Reports rows a pick handed back because their partition was taken: one event
    /// per key, naming its first row.
    fn contended(&self, rows: &[claim::Contended]) {
        let mut by_key: Vec<(&claim::Contended, usize)> = Vec::new();
        for r in rows.iter().filter(|r| r.gate.is_none()) {
            match by_key
                .iter_mut()
                .find(|(first, _)| first.partition_key == r.partition_key)
            {
                Some((_, n)) => *n += 1,
                None => by_key.push((r, 1)),
            }
        }
        for (first, count) in by_key {
            self.shared.telemetry.emit(Event::PartitionContended {
                count,
                id: first.id,
                fsm: first.fsm.clone(),
                partition_key: first.partition_key.clone(),
            });
        }
    }

    /// Reports gate keys whose rows a pick handed back for want of slots: one event per
    /// key, with the rows it wanted and the rows it claimed.
    fn throttled(&self, claimed: &[claim::Claimed], back: &[claim::Contended]) {
        let mut by_key: Vec<(&str, &str, usize)> = Vec::new();
        for r in back {
            let Some(gate) = r.gate.as_deref() else {
                continue;
            };
            match by_key
                .iter_mut()
                .find(|(g, k, _)| *g == gate && *k == r.partition_key)
            {
                Some((_, _, n)) => *n += 1,
                None => by_key.push((gate, &r.partition_key, 1)),
            }
        }
        for (gate, key, back) in by_key {
            let admitted = claimed
                .iter()
                .filter(|c| {
                    c.gate.as_deref() == Some(gate) && c.partition_key.as_deref() == Some(key)
                })
                .count();
            self.shared.telemetry.emit(Event::GateThrottled {
                wanted: admitted + back,
                admitted,
                gate: gate.to_string(),
                key: key.to_string(),
                queue: self.name.to_string(),
            });
        }
    }

    /// Gives claimed rows back to `runnable` without counting an attempt.
    async fn release(&self, leases: &[(i64, i64)]) -> usize {
        if leases.is_empty() {
            return 0;
        }
        let shared = &self.shared;
        let (node, now) = (shared.node_id.as_str(), shared.db.now());
        let released = match on_conn!(shared.db, |c| lease::release(c, leases, node, now)) {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(target: "gen_durable::scheduler", error = %e, "release failed; rows return when their leases expire");
                Vec::new()
            }
        };
        // A row not released (held by someone right now) returns when its lease, or its
        // batch of the log, expires.
        for &(id, epoch) in leases {
            shared.claims.unhold(id, epoch, released.contains(&id));
        }
        released.len()
    }
}

/// The claim in flight (only polled while there is one).
async fn in_flight(claiming: &mut Option<Claiming>) -> (usize, Result<claim::Pick>) {
    claiming.as_mut().expect("a claim").await
}

/// The key in Postgres' unique-violation detail, `Key (partition_key)=(acct:1) already
/// exists.` (a K = 1 key), or `Key (gate, partition_key, gate_slot)=(stripe, acme, 2)
/// already exists.` (a gate's slot, named `stripe, acme, 2`).
fn partition_key_of(detail: &str) -> Option<String> {
    let rest = detail
        .strip_prefix("Key (partition_key)=(")
        .or_else(|| detail.strip_prefix("Key (gate, partition_key, gate_slot)=("))?;
    let end = rest.rfind(") already exists")?;
    Some(rest[..end].to_string())
}

/// The rows to claim for a queue with `running` steps running and `waiting` rows held for
/// it, or `None` when too few slots are free: fewer than `min_demand`, or, while rows still
/// wait (every worker is busy then), fewer than a quarter of `prefetch`, so that the buffer
/// is refilled in batches rather than a row at a time. A claim costs about as much for a
/// few rows as for many: a five-step drain topped its buffer up 16–18 rows at a time, at
/// twice a large claim's server time per row (gen_durable_bench/results/PERFORMANCE-log.md, "Refilling the buffer in
/// batches").
fn demand(cfg: &QueueConfig, running: usize, waiting: usize) -> Option<usize> {
    let free = (cfg.concurrency + cfg.prefetch).saturating_sub(running + waiting);
    let least = if waiting > 0 {
        cfg.min_demand.max(cfg.prefetch / 4)
    } else {
        cfg.min_demand
    };
    (free >= least).then_some(free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_that_still_holds_rows_is_refilled_in_batches() {
        let cfg = QueueConfig::new(256).with_prefetch(256);
        // Every worker busy, 200 rows waiting: 56 free slots, under a quarter of 256.
        assert_eq!(demand(&cfg, 256, 200), None);
        assert_eq!(demand(&cfg, 256, 192), Some(64));
        // Nothing waiting: any free slot is claimed at once.
        assert_eq!(demand(&cfg, 255, 0), Some(257));
        assert_eq!(demand(&cfg, 256, 255), None);
        assert_eq!(demand(&cfg, 256, 0), Some(256));
        // Without a buffer, `min_demand` alone.
        let plain = QueueConfig::new(8);
        assert_eq!(demand(&plain, 7, 0), Some(1));
        assert_eq!(demand(&plain, 8, 0), None);
        let batched = QueueConfig::new(8).with_min_demand(4);
        assert_eq!(demand(&batched, 5, 0), None);
        assert_eq!(demand(&batched, 4, 0), Some(4));
    }
}
