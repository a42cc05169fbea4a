//! The in-memory table of instances and signals. Each operation mirrors one SQL
//! statement of `gen_durable::store::pg` — INSERT (uniqueness through the guard),
//! DELIVER, CLAIM (order and partitions), APPLY (the effect of each outcome),
//! EXPIRE_AWAITS — so the kit and Postgres commit the same thing. Comments name the
//! statement each function follows.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gen_durable::__private::ConcurrencyKey;
use gen_durable::runtime::{refused, KeyChange, NewInstance, Outcome, StepOutput};
use gen_durable::{
    CancelFound, ChildInfo, DeliveryFound, Error, OutcomeKind, QueuePause, Registry, RestartFound,
    RetryFound, Signal, Status, Target, WaitRow,
};
use serde_json::Value;

use crate::instance::Instance;
use rate_limit::{self as bucket, Bucket};

mod bulk;
mod explain;
mod migration;
mod rate_limit;
pub(crate) mod schedule;

pub use explain::{KIT_LEASE, KIT_NODE};

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
}

impl Row {
    /// The generated column `unique_guard`: the key while the status is in the scope.
    fn guard(&self) -> Option<&str> {
        guard(&self.unique_key, &self.unique_scope, self.status)
    }

    /// What a wait reads of the row.
    pub(crate) fn wait_row(&self) -> WaitRow {
        WaitRow {
            id: self.id,
            status: self.status,
            step: self.step.clone(),
            attempt: self.attempt,
            result: self.result.clone(),
            last_error: self.last_error.clone(),
            awaits: self.awaits.clone(),
            children_pending: self.children_pending,
        }
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
}

/// Whether the kit claims rows of `(fsm, version)`: the pick's filter of the engine
/// (`Registry::name_version_arrays`), i.e. a registered version, or one whose migration
/// chain ends at a registered version (moved there when claimed).
fn runs(registry: &Registry, fsm: &str, version: i32) -> bool {
    registry.get(fsm, version).is_some() || registry.upgrade_path(fsm, version).is_some()
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

    /// INSERT: rows go in in unique-key order (NULLS LAST, then input order), which is
    /// also the order their ids are drawn in; a row whose key is occupied — by a stored
    /// row or an earlier row of the batch — is dropped. Returns the inserted ids,
    /// ascending, each with its parent.
    pub(crate) fn insert(
        &mut self,
        rows: Vec<(NewInstance, Option<i64>)>,
        now: DateTime<Utc>,
    ) -> Vec<(i64, Option<i64>)> {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| {
            let (ka, kb) = (&rows[a].0.unique_key, &rows[b].0.unique_key);
            match (ka, kb) {
                (Some(x), Some(y)) => x.cmp(y).then(a.cmp(&b)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a.cmp(&b),
            }
        });
        let mut slots: Vec<Option<(NewInstance, Option<i64>)>> =
            rows.into_iter().map(Some).collect();
        let mut inserted = Vec::new();
        for i in order {
            let (new, parent) = slots[i].take().expect("each row once");
            if let Some(key) = guard(&new.unique_key, &new.unique_scope, Status::Runnable) {
                if self.rows.values().any(|r| r.guard() == Some(key)) {
                    continue;
                }
            }
            self.last_id += 1;
            let id = self.last_id;
            let eligible_at = new
                .eligible_at
                .unwrap_or_else(|| after(now, new.delay.unwrap_or_default()));
            self.rows.insert(
                id,
                Row {
                    id,
                    fsm: new.fsm,
                    version: new.version,
                    rate_step: new.rate_limit.as_ref().map(|_| new.step.clone()),
                    step: new.step,
                    status: Status::Runnable,
                    state: new.state,
                    result: None,
                    awaits: Vec::new(),
                    await_deadline: None,
                    queue: new.queue,
                    priority: new.priority,
                    partition_key: new.partition_key,
                    gate: new.gate,
                    rate_limit: new.rate_limit,
                    rate_weight: new.rate_weight,
                    rate_paid: false,
                    eligible_at,
                    attempt: 0,
                    last_error: None,
                    parent_id: parent,
                    children_pending: 0,
                    unique_key: new.unique_key,
                    unique_scope: new.unique_scope,
                    reaps: 0,
                    max_reaps: new.max_reaps,
                    claimed_at: None,
                    updated_at: now,
                },
            );
            inserted.push((id, parent));
        }
        inserted.sort_unstable();
        inserted
    }

    /// DELIVER: store the signal unless its dedup key is already stored for this target;
    /// wake the target only if it is `awaiting_signal` on this name. Nothing is stored
    /// for an unknown or terminal target.
    pub(crate) fn deliver(
        &mut self,
        to: &Target,
        name: &str,
        payload: Value,
        dedup_key: Option<String>,
        now: DateTime<Utc>,
    ) -> DeliveryFound {
        let nothing = |target: Option<i64>, status: Option<Status>| DeliveryFound {
            id: target,
            status,
            signal_id: None,
            woke: false,
        };
        let Some(target) = self.resolve(to) else {
            return nothing(None, None);
        };
        let status = self.rows[&target].status;
        if status.is_terminal() {
            return nothing(Some(target), Some(status));
        }
        let duplicate = dedup_key.as_ref().is_some_and(|k| {
            self.signals
                .values()
                .any(|s| s.target == target && s.signal.dedup_key.as_ref() == Some(k))
        });
        if duplicate {
            return nothing(Some(target), Some(status));
        }
        self.last_signal += 1;
        let id = self.last_signal;
        self.signals.insert(
            id,
            StoredSignal {
                target,
                signal: Signal {
                    id,
                    name: name.to_string(),
                    payload,
                    dedup_key,
                    inserted_at: now,
                },
            },
        );
        let row = self.rows.get_mut(&target).expect("resolved above");
        let woke = row.status == Status::AwaitingSignal && row.awaits.iter().any(|a| a == name);
        if woke {
            row.status = Status::Runnable;
            row.eligible_at = now;
            row.await_deadline = None;
            row.updated_at = now;
        }
        DeliveryFound {
            id: Some(target),
            status: Some(status),
            signal_id: Some(id),
            woke,
        }
    }

    /// The row a target names: the id, if stored; for a key, the one row holding it
    /// (its guard: the key while the status is in the key's scope).
    pub(crate) fn resolve(&self, to: &Target) -> Option<i64> {
        match to {
            Target::Id(id) => self.rows.contains_key(id).then_some(*id),
            Target::Key(key) => self
                .rows
                .values()
                .find(|r| r.guard() == Some(key.as_str()))
                .map(|r| r.id),
        }
    }

    /// The newest row inserted with correlation key `key`, whatever its status.
    pub(crate) fn newest_with_key(&self, key: &str) -> Option<i64> {
        self.rows
            .values()
            .rev()
            .find(|r| r.unique_key.as_deref() == Some(key))
            .map(|r| r.id)
    }

    /// CLAIM, one row at a time: the first runnable, eligible row of a queue that is not
    /// paused, of an `(fsm, version)` this kit runs or migrates (see `runs`), by
    /// `(priority, eligible_at, id)`, whose partition has no executing row.
    pub(crate) fn pick(&self, now: DateTime<Utc>, registry: &Registry) -> Option<i64> {
        self.rows
            .values()
            .filter(|r| r.status == Status::Runnable && r.eligible_at <= now)
            .filter(|r| !self.paused.contains_key(&r.queue))
            .filter(|r| runs(registry, &r.fsm, r.version))
            .filter(|r| self.admits(r))
            .min_by_key(|r| (r.priority, r.eligible_at, r.id))
            .map(|r| r.id)
    }

    /// Whether `r`'s concurrency key lets it run now: a K = 1 key with no executing
    /// (ungated) row, or a gate key with fewer executing rows than its gate's K.
    pub(crate) fn admits(&self, r: &Row) -> bool {
        let Some(key) = r.partition_key.as_ref() else {
            return true;
        };
        let running = |gate: Option<&String>| {
            self.rows
                .values()
                .filter(|e| {
                    e.status == Status::Executing
                        && e.partition_key.as_ref() == Some(key)
                        && e.gate.as_ref() == gate
                })
                .count()
        };
        match r.gate.as_ref() {
            None => running(None) == 0,
            Some(g) => running(Some(g)) < self.gate(g).unwrap_or(0) as usize,
        }
    }

    /// The limit of gate `name`, if declared.
    pub(crate) fn gate(&self, name: &str) -> Option<u32> {
        self.gates.get(name).copied()
    }

    /// The claim's admission of picked row `id` against its rate limit (migration 0031):
    /// true if it runs now (the tokens it takes now, or reserved before, are there);
    /// false if it waits, runnable, until they are due. A row that has not reserved
    /// reserves its tokens behind everything reserved; a reserved row comes first in
    /// line, and if its bucket does not hold them, it waits again, keeping its
    /// reservation. One row at a time, as the engine's claims of a batch of one.
    pub(crate) fn admit(&mut self, id: i64, now: DateTime<Utc>) -> bool {
        let row = &self.rows[&id];
        let Some(key) = row.rate_limit.clone() else {
            return true;
        };
        let paid = row.rate_paid;
        if !paid && row.rate_step.as_deref() != Some(row.step.as_str()) {
            return true;
        }
        let (rate, burst) = self.rate_limits[&key.0];
        // A weight above the burst (lowered since the insert) counts as the burst.
        let weight = row.rate_weight.min(burst);
        let mut bucket = self
            .buckets
            .get(&key)
            .copied()
            .unwrap_or_else(|| Bucket::full(burst, now));
        if paid {
            bucket.held = bucket.held.max(weight);
        }
        let avail = bucket.avail(rate, burst, now);
        let room = avail + bucket.held;
        // Its place in line: a reserved row's own weight; a new one's after all reserved.
        let pos = if paid { weight } else { bucket.held + weight };
        let admitted = pos <= room;
        let row = self.rows.get_mut(&id).expect("picked");
        if admitted {
            if paid {
                bucket.held = (bucket.held - weight).max(0.0);
            }
            row.rate_paid = false;
        } else {
            // It waits for its tokens; one that had not reserved reserves them now.
            row.eligible_at = bucket::due(now, pos - room, rate);
            assert!(
                row.eligible_at > now,
                "row {id} would wait for its tokens no time"
            );
            if !paid {
                row.rate_paid = true;
                bucket.held += weight;
            }
        }
        // What rows that had not reserved took (now, or as a reservation).
        bucket.tokens = avail - if paid { 0.0 } else { weight };
        bucket.at = now;
        self.buckets.insert(key, bucket);
        admitted
    }

    /// Gives back the tokens runnable row `id` reserved, if it did (a cancel, a restart
    /// at another step).
    fn refund(&mut self, id: i64) {
        let row = self.rows.get_mut(&id).expect("a row");
        let reserved = row.status == Status::Runnable && row.rate_paid;
        row.rate_paid = false;
        if let (true, Some(key)) = (reserved, row.rate_limit.as_ref()) {
            if let Some(b) = self.buckets.get_mut(key) {
                b.refund(row.rate_weight);
            }
        }
    }

    /// `gd_rate_limits`: (tokens per second, burst) of limit `name`.
    pub(crate) fn rate_limit(&self, name: &str) -> Option<(f64, f64)> {
        self.rate_limits.get(name).copied()
    }

    /// DECLARE: adds rate limit `name` or changes it; true if written.
    pub(crate) fn set_rate_limit(&mut self, name: &str, per_second: f64, burst: f64) -> bool {
        self.rate_limits
            .insert(name.to_string(), (per_second, burst))
            != Some((per_second, burst))
    }

    /// DECLARE: adds gate `name` or changes its limit; true if written.
    pub(crate) fn set_gate(&mut self, name: &str, size: u32) -> bool {
        self.gates.insert(name.to_string(), size) != Some(size)
    }

    /// The foreign key to `gd_gates`: the first gate of `rows` that is not declared.
    /// What the database refuses of a row naming `gate` and rate limit `rate` (its name
    /// and weight): the foreign keys to the declared gates and limits, and the row's
    /// check of a weight above the burst.
    pub(crate) fn refusal(&self, gate: Option<&str>, rate: Option<(&str, f64)>) -> Option<Error> {
        if let Some(g) = gate.filter(|g| !self.gates.contains_key(*g)) {
            return Some(Error::UnknownGate { name: g.into() });
        }
        let (name, weight) = rate?;
        match self.rate_limit(name) {
            None => Some(Error::UnknownRateLimit { name: name.into() }),
            Some((_, burst)) if weight > burst => Some(Error::InvalidInput {
                what: "rate limit weight",
                reason: "exceeds its rate limit's burst, so its tokens could never all be \
                         there at once"
                    .into(),
            }),
            Some(_) => None,
        }
    }

    /// [`Store::refusal`] of a row to insert.
    pub(crate) fn refusal_of(&self, r: &NewInstance) -> Option<Error> {
        let rate = r
            .rate_limit
            .as_ref()
            .map(|(n, _)| (n.as_str(), r.rate_weight));
        self.refusal(r.gate.as_deref(), rate)
    }

    /// What the database refuses of an outcome: a child it would insert, or the gate or
    /// limit its transition names (the committer then stops the instance instead).
    fn outcome_refusal(&self, out: &StepOutput) -> Option<Error> {
        if let Outcome::ScheduleChildren { children, .. } = &out.outcome {
            if let Some(e) = children.iter().find_map(|c| self.refusal_of(c)) {
                return Some(e);
            }
        }
        let t = &out.transition;
        let gate = match &t.key {
            KeyChange::Set(ConcurrencyKey::Gate(g)) => Some(g.name()),
            _ => None,
        };
        let rate = t.rate.as_ref().map(|r| (r.key.name(), r.weight));
        self.refusal(gate, rate)
    }

    /// Runnable, eligible rows no registered FSM can run, nor any migration move: the
    /// kit reports them rather than waiting on them forever.
    pub(crate) fn unrunnable(&self, now: DateTime<Utc>, registry: &Registry) -> Vec<&Row> {
        self.rows
            .values()
            .filter(|r| r.status == Status::Runnable && r.eligible_at <= now)
            .filter(|r| !runs(registry, &r.fsm, r.version))
            .collect()
    }

    /// EXPIRE_AWAITS: parked rows past their deadline become runnable at their next
    /// step with `awaits` cleared, so that step sees nothing awaited.
    pub(crate) fn expire_awaits(&mut self, now: DateTime<Utc>) -> usize {
        let mut n = 0;
        for r in self.rows.values_mut() {
            if r.status == Status::AwaitingSignal && r.await_deadline.is_some_and(|d| d <= now) {
                r.status = Status::Runnable;
                r.awaits.clear();
                r.await_deadline = None;
                r.eligible_at = now;
                r.updated_at = now;
                n += 1;
            }
        }
        n
    }

    /// APPLY one outcome of the executing row `id`, exactly as the SQL does: children
    /// first (so the counter is what was inserted), then the row, then consumed signals,
    /// the inbox of a finished row, and the parent's fan-in.
    pub(crate) fn apply(&mut self, id: i64, out: &StepOutput, now: DateTime<Utc>) {
        if let Some(e) = self.outcome_refusal(out) {
            let mut stop = StepOutput::stopped(refused(&e));
            stop.state = self.rows[&id].state.clone();
            return self.apply(id, &stop, now);
        }
        let mut spawned = 0;
        if let Outcome::ScheduleChildren { children, .. } = &out.outcome {
            let rows = children.iter().cloned().map(|c| (c, Some(id))).collect();
            spawned = self.insert(rows, now).len() as i32;
        }
        let kind = out.outcome.kind();
        // An await commits runnable at once if a matching signal the step did not
        // already see is in the inbox.
        let news = match &out.outcome {
            Outcome::Await { names, .. } => self.signals.values().any(|s| {
                s.target == id
                    && names.contains(&s.signal.name)
                    && !out.awaited.contains(&s.signal.id)
            }),
            _ => false,
        };
        let row = self.rows.get_mut(&id).expect("the executing row exists");
        let (step, delay) = match &out.outcome {
            Outcome::Next { step }
            | Outcome::Await { step, .. }
            | Outcome::ScheduleChildren { step, .. } => (Some(*step), None),
            Outcome::Replay { delay } => (None, Some(*delay)),
            Outcome::Done { .. } | Outcome::Stop { .. } => (None, None),
        };
        if let Some(step) = step {
            row.step = step.to_string();
            // A transition: its key, and the limit of the step it leads to.
            match &out.transition.key {
                KeyChange::Keep => {}
                KeyChange::Release => (row.partition_key, row.gate) = (None, None),
                KeyChange::Set(ConcurrencyKey::Partition(k)) => {
                    (row.partition_key, row.gate) = (Some(k.clone()), None)
                }
                KeyChange::Set(ConcurrencyKey::Gate(g)) => {
                    (row.partition_key, row.gate) = (Some(g.key().into()), Some(g.name().into()))
                }
            }
            let rate = out.transition.rate.as_ref();
            row.rate_limit = rate.map(|r| (r.key.name().into(), r.key.key().into()));
            row.rate_weight = rate.map_or(1.0, |r| r.weight);
            row.rate_step = rate.map(|_| step.to_string());
            row.rate_paid = false;
        }
        row.state = out.state.clone();
        row.updated_at = now;
        row.status = match &out.outcome {
            Outcome::Next { .. } | Outcome::Replay { .. } => Status::Runnable,
            Outcome::Await { .. } if news => Status::Runnable,
            Outcome::Await { .. } => Status::AwaitingSignal,
            Outcome::ScheduleChildren { .. } if spawned == 0 => Status::Runnable,
            Outcome::ScheduleChildren { .. } => Status::AwaitingChildren,
            Outcome::Done { .. } => Status::Done,
            Outcome::Stop { .. } => Status::Failed,
        };
        if let Outcome::Done { result } = &out.outcome {
            row.result = Some(result.clone());
        }
        row.last_error = match (&out.error, kind) {
            (Some(e), _) => Some(e.clone()),
            (None, OutcomeKind::Replay) => row.last_error.take(),
            (None, _) => None,
        };
        match &out.outcome {
            Outcome::Await { names, timeout, .. } => {
                row.awaits = names.clone();
                row.await_deadline = timeout.map(|t| after(now, t));
            }
            Outcome::Replay { .. } => {}
            // A failure keeps what the step was woken for: its retry awaits it again.
            Outcome::Stop { .. } => row.await_deadline = None,
            _ => {
                row.awaits.clear();
                row.await_deadline = None;
            }
        }
        row.eligible_at = after(now, delay.unwrap_or_default());
        row.attempt = match kind {
            OutcomeKind::Replay => row.attempt + 1,
            OutcomeKind::Done | OutcomeKind::Stop => row.attempt,
            _ => 0,
        };
        if kind.progresses() || kind == OutcomeKind::Await {
            row.reaps = 0;
        }
        if kind == OutcomeKind::ScheduleChildren {
            row.children_pending = spawned;
        }
        let (status, parent) = (row.status, row.parent_id);

        if kind.progresses() {
            for sid in &out.awaited {
                self.signals.remove(sid);
            }
        }
        if status.is_terminal() {
            self.finished(id, parent, now);
        }
    }

    /// What every terminal commit does besides the row: the whole inbox goes, and the
    /// parent counts one child less, waking at zero.
    fn finished(&mut self, id: i64, parent: Option<i64>, now: DateTime<Utc>) {
        self.signals.retain(|_, s| s.target != id);
        if let Some(p) = parent.and_then(|p| self.rows.get_mut(&p)) {
            p.children_pending -= 1;
            p.updated_at = now;
            if p.status == Status::AwaitingChildren && p.children_pending == 0 {
                p.status = Status::Runnable;
                p.eligible_at = now;
            }
        }
    }

    /// A lost lease (`gd_reap`): a worker claimed runnable row `id` and died before its
    /// outcome committed, and the reaper took the row back — runnable again with
    /// `attempt + 1`, or failed with "lease lost N times" once `reaps` reaches `max_reaps`
    /// (its inbox deleted, its parent counted down). False unless it was runnable and due,
    /// or claimed by `claim`.
    pub(crate) fn lose_lease(&mut self, id: i64, now: DateTime<Utc>) -> bool {
        let Some(row) = self.rows.get_mut(&id) else {
            return false;
        };
        let due = row.status == Status::Runnable && row.eligible_at <= now;
        if !due && row.claimed_at.is_none() {
            return false;
        }
        row.claimed_at = None;
        row.status = Status::Runnable;
        row.updated_at = now;
        row.attempt += 1;
        row.reaps += 1;
        row.eligible_at = now;
        if row.reaps >= row.max_reaps {
            row.status = Status::Failed;
            row.last_error = Some(format!(
                "lease lost {} times (max_reaps = {}): the step at '{}' never committed an outcome",
                row.reaps, row.max_reaps, row.step
            ));
            let parent = row.parent_id;
            self.finished(id, parent, now);
        } else {
            // The engine names the lost node and epoch; the kit has neither.
            row.last_error = Some("lease lost; retrying".to_string());
        }
        true
    }

    /// CLAIM of one row by a worker that keeps it: runnable, due row `id` becomes
    /// `executing` (its partition key held) until `lose_lease` gives it back. False
    /// unless it was runnable and due.
    pub(crate) fn claim(&mut self, id: i64, now: DateTime<Utc>) -> bool {
        match self.rows.get_mut(&id) {
            Some(row) if row.status == Status::Runnable && row.eligible_at <= now => {
                row.status = Status::Executing;
                row.claimed_at = Some(now);
                row.updated_at = now;
                true
            }
            _ => false,
        }
    }

    /// Cancel (`store::pg::control`, CANCEL_TREE then CANCEL_APPLY): the instance and
    /// its live descendants fail with "cancelled" at once — their inboxes go, and every
    /// parent counts each of its cancelled children down (one outside the tree wakes at
    /// zero), so `children_pending` keeps counting live children. Returns how many
    /// failed. The kit runs no step between calls, so none is `executing`.
    pub(crate) fn cancel(&mut self, id: i64, now: DateTime<Utc>) -> CancelFound {
        match self.rows.get(&id) {
            None => return CancelFound::NotFound,
            Some(row) if row.status.is_terminal() => return CancelFound::Finished(row.status),
            Some(_) => {}
        }
        let mut tree = vec![id];
        let mut i = 0;
        while i < tree.len() {
            let live: Vec<i64> = self
                .children(tree[i])
                .filter(|c| !c.status.is_terminal())
                .map(|c| c.id)
                .collect();
            tree.extend(
                live.into_iter()
                    .filter(|c| !tree.contains(c))
                    .collect::<Vec<_>>(),
            );
            i += 1;
        }
        tree.sort_unstable();
        let mut failed = Vec::new();
        for &t in &tree {
            self.refund(t);
            let row = self.rows.get_mut(&t).expect("tree rows exist");
            if matches!(
                row.status,
                Status::Runnable | Status::AwaitingSignal | Status::AwaitingChildren
            ) {
                row.status = Status::Failed;
                row.last_error = Some("cancelled".to_string());
                row.await_deadline = None;
                row.updated_at = now;
                failed.push((t, row.parent_id));
            }
        }
        for &(t, parent) in &failed {
            self.finished(t, parent, now);
        }
        CancelFound::Cancelled {
            failed: failed.len(),
            flagged: 0,
        }
    }

    /// RETRY: a failed instance goes back to where the step it failed in began, now, with
    /// `attempt` and `reaps` reset: it awaits its children again if some are still live
    /// (`children_pending` recounted), awaits its signals again if the step was woken by
    /// one (`awaits` kept; the failure deleted the inbox), else it is runnable. A child is retried only while its
    /// parent awaits its children, and re-arms it. `KeyTaken` if its unique key was taken
    /// meanwhile (the guard's unique index refuses the update).
    pub(crate) fn retry(&mut self, id: i64, now: DateTime<Utc>) -> RetryFound {
        let Some(row) = self.rows.get(&id) else {
            return RetryFound::NotFound;
        };
        if row.status != Status::Failed {
            return RetryFound::NotFailed(row.status);
        }
        let rearm = match row.parent_id.and_then(|p| self.rows.get(&p)) {
            Some(p) if p.status == Status::AwaitingChildren => Some(p.id),
            Some(p) => {
                return RetryFound::ParentMovedOn {
                    parent: p.id,
                    status: p.status,
                }
            }
            None => None,
        };
        let live = self
            .children(id)
            .filter(|c| !c.status.is_terminal())
            .count() as i32;
        let signalled = self
            .signals
            .values()
            .any(|s| s.target == id && row.awaits.contains(&s.signal.name));
        let status = if live > 0 {
            Status::AwaitingChildren
        } else if !row.awaits.is_empty() && !signalled {
            Status::AwaitingSignal
        } else {
            Status::Runnable
        };
        if let Some(key) = guard(&row.unique_key, &row.unique_scope, status) {
            if self
                .rows
                .values()
                .any(|r| r.id != id && r.guard() == Some(key))
            {
                return RetryFound::KeyTaken;
            }
        }
        let row = self.rows.get_mut(&id).expect("checked above");
        row.status = status;
        row.rate_paid = false;
        row.attempt = 0;
        row.reaps = 0;
        row.children_pending = live;
        row.await_deadline = None;
        row.eligible_at = now;
        row.updated_at = now;
        if let Some(p) = rearm.and_then(|p| self.rows.get_mut(&p)) {
            p.children_pending += 1;
            p.updated_at = now;
        }
        RetryFound::Retried
    }

    /// PAUSE: true if `queue` was not paused; a paused queue keeps its first pause.
    pub(crate) fn pause(&mut self, queue: &str, reason: Option<&str>, now: DateTime<Utc>) -> bool {
        if self.paused.contains_key(queue) {
            return false;
        }
        let pause = QueuePause {
            queue: queue.to_string(),
            paused_at: now,
            reason: reason.map(str::to_string),
        };
        self.paused.insert(queue.to_string(), pause);
        true
    }

    /// RESUME: true if `queue` was paused.
    pub(crate) fn resume(&mut self, queue: &str) -> bool {
        self.paused.remove(queue).is_some()
    }

    /// PAUSED: the paused queues, by name.
    pub(crate) fn paused(&self) -> Vec<QueuePause> {
        self.paused.values().cloned().collect()
    }

    /// RETRY with a step (a restart): an instance that is not executing and has no live
    /// children becomes runnable now at `step` — attempt and reaps 0, nothing awaited, no
    /// deadline, no result, inbox kept. A finished child is taken back only while its
    /// parent awaits its children, and re-arms it. `KeyTaken` if it comes back into its
    /// key's scope while another row holds the key.
    pub(crate) fn restart(&mut self, id: i64, step: &str, now: DateTime<Utc>) -> RestartFound {
        let Some(row) = self.rows.get(&id) else {
            return RestartFound::NotFound;
        };
        if row.status == Status::Executing {
            return RestartFound::Executing;
        }
        if self.children(id).any(|c| !c.status.is_terminal()) {
            return RestartFound::LiveChildren(row.status);
        }
        let finished = row.status.is_terminal();
        let rearm = match row.parent_id.and_then(|p| self.rows.get(&p)) {
            Some(p) if finished && p.status != Status::AwaitingChildren => {
                return RestartFound::ParentMovedOn {
                    parent: p.id,
                    status: p.status,
                }
            }
            Some(p) if finished => Some(p.id),
            _ => None,
        };
        if let Some(key) = guard(&row.unique_key, &row.unique_scope, Status::Runnable) {
            if self
                .rows
                .values()
                .any(|r| r.id != id && r.guard() == Some(key))
            {
                return RestartFound::KeyTaken;
            }
        }
        let keeps = self.rows[&id].rate_step.as_deref() == Some(step);
        if !keeps || self.rows[&id].status != Status::Runnable {
            self.refund(id);
        }
        let row = self.rows.get_mut(&id).expect("checked above");
        row.step = step.to_string();
        row.status = Status::Runnable;
        row.attempt = 0;
        row.reaps = 0;
        row.awaits.clear();
        row.await_deadline = None;
        row.result = None;
        row.children_pending = 0;
        row.eligible_at = now;
        row.updated_at = now;
        if let Some(p) = rearm.and_then(|p| self.rows.get_mut(&p)) {
            p.children_pending += 1;
            p.updated_at = now;
        }
        RestartFound::Restarted
    }
}
