//! Starting again from a past step: [`Client::fork`] (a new instance) and
//! [`Client::restart_from`] (the same instance), both from a history entry that holds the
//! state its step began with (an FSM with `history = "full"`).

use serde_json::Value;

use crate::model::answers::inserted;
use crate::model::error::{Error, Result};
use crate::model::insert::NewInstance;
use crate::model::options::InsertOptions;
use crate::ops::restart::check_restart_step;
use crate::store::pg;
use crate::store::pg::history::Source;
use crate::{Client, LimitKey, Registry};

/// The state entry `entry` of instance `id` began its step with, or why there is none.
fn state_of(id: i64, entry: i64, source: &Source) -> Result<Value> {
    match &source.state {
        Some(state) => Ok(state.clone()),
        None => Err(Error::EntryWithoutState {
            id,
            entry,
            kind: source.kind()?,
        }),
    }
}

/// Where an instance runs, as a fork of it runs there too.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct ForkOf<'a> {
    /// Its FSM.
    pub fsm: &'a str,
    /// Its FSM version now.
    pub version: i32,
    /// Its queue.
    pub queue: &'a str,
    /// Its priority.
    pub priority: i16,
    /// Its concurrency key: a K = 1 key, or the key within `gate`.
    pub partition_key: Option<&'a str>,
    /// The gate `partition_key` is a key of.
    pub gate: Option<&'a str>,
}

/// The row a fork of `of` inserts: at `step` in `state`, on its FSM version, queue,
/// priority and concurrency key, without its correlation key; checked by `registry` as
/// every insert is. `Client::fork` and the testkit's both build it here.
#[doc(hidden)]
pub fn fork_row(
    registry: &Registry,
    of: ForkOf<'_>,
    step: &str,
    state: Value,
) -> Result<NewInstance> {
    let mut opts = InsertOptions::default()
        .step(step)
        .queue(of.queue)
        .priority(of.priority);
    if let Some(key) = of.partition_key {
        opts = match of.gate {
            Some(gate) => opts.gate(LimitKey::new(gate, key)),
            None => opts.partition_key(key),
        };
    }
    registry.new_instance(of.fsm, of.version, state, opts)
}

impl Client {
    /// Starts a new instance from a past step of instance `id`: at the step history entry
    /// `entry` ran, with the state that step began with, on the instance's FSM version
    /// now, queue, priority and concurrency key (no correlation key: the original may
    /// hold it, and keeps it). Returns the new instance's id. The original is not touched;
    /// the fork's history begins with a `forked` entry naming where it came from and who
    /// forked it ([`Client::with_actor`]).
    ///
    /// Refused, with nothing written: an entry the instance does not have (never, or
    /// collected after the history's retention: [`Error::UnknownEntry`]), one without a
    /// state (a step of an FSM that keeps less than `history = "full"`, or a lost lease or
    /// an operator's action: [`Error::EntryWithoutState`]), an instance that is gone
    /// ([`Error::NotFound`]: a fork needs its FSM), an FSM version this client's registry
    /// does not know ([`Error::UnknownFsm`] / [`Error::UnknownVersion`]), a step that
    /// version no longer has ([`Error::UnknownStep`]), a state it cannot read
    /// ([`Error::InvalidState`]: the instance was migrated since).
    pub async fn fork(&self, id: i64, entry: i64) -> Result<i64> {
        let now = self.clock().now_param();
        let source = pg::history::source(self.pooler().pool(self.pool()), id, entry).await?;
        let state = state_of(id, entry, &source)?;
        let (Some(fsm), Some(version), Some(queue)) =
            (&source.fsm, source.fsm_version, &source.queue)
        else {
            return Err(Error::NotFound { id });
        };
        let of = ForkOf {
            fsm,
            version,
            queue,
            priority: source.priority.unwrap_or_default(),
            partition_key: source.partition_key.as_deref(),
            gate: source.gate.as_deref(),
        };
        let row = fork_row(self.registry(), of, &source.step, state)?;
        let mut tx = self.pool().begin().await?;
        let fork = inserted(
            pg::insert::insert_one(self.pooler().on(&mut *tx), &row, true, now).await?,
            row.unique_key.as_deref(),
        )?;
        pg::history::forked(
            self.pooler().on(&mut *tx),
            fork,
            &source.step,
            (id, entry),
            self.actor(),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(fork)
    }

    /// Restarts instance `id` from a past step: as [`Client::restart`] at the step history
    /// entry `entry` ran, and with the state that step began with instead of the last
    /// committed one. The history records a `restarted` entry naming the entry.
    ///
    /// Refused as `restart` is, and, with nothing written, for an entry the instance does
    /// not have ([`Error::UnknownEntry`]), one without a state
    /// ([`Error::EntryWithoutState`]), and a state the instance's FSM version cannot read
    /// ([`Error::InvalidState`], checked when this client's registry has the version).
    pub async fn restart_from(&self, id: i64, entry: i64) -> Result<()> {
        let now = self.clock().now_param();
        let db = self.pooler().pool(self.pool());
        let source = pg::history::source(db, id, entry).await?;
        let state = state_of(id, entry, &source)?;
        let (fsm, version, announced) = pg::control::steps_of(db, id, now)
            .await?
            .ok_or(Error::NotFound { id })?;
        check_restart_step(self.registry(), &fsm, version, &source.step, announced)?;
        if let Some(known) = self.registry().get(&fsm, version) {
            known.check_state(&state)?;
        }
        let mut tx = self.pool().begin().await?;
        let conn = self.pooler().on(&mut *tx);
        let found = pg::control::restart(
            conn,
            id,
            &source.step,
            version,
            Some((entry, &state)),
            self.actor(),
            now,
        )
        .await?;
        tx.commit().await?;
        crate::client::wait::wake(id);
        found.answer(id)
    }
}
