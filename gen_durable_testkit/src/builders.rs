//! The pending operations of a [`TestKit`] (`.await` them, as the `Client`'s) and the
//! [`SignalSender`] a running step sends through.

use std::future::{ready, IntoFuture, Ready};
use std::sync::{Arc, Mutex};

use gen_durable::{Delivery, Entry, Fsm, InsertOptions, Result, Settled, Target};
use serde_json::Value;

use crate::kit::TestKit;

/// A pending insert into a [`TestKit`]: the state and its options. Set options (the
/// same setters as `Client::insert`), then `.await` it.
#[derive(Debug)]
#[must_use = "an insert does nothing until awaited"]
pub struct KitInsert<'k, F: Fsm> {
    kit: &'k mut TestKit,
    state: F::State,
    opts: InsertOptions,
}

impl<'k, F: Fsm> KitInsert<'k, F> {
    pub(crate) fn new(kit: &'k mut TestKit, state: F::State) -> Self {
        KitInsert {
            kit,
            state,
            opts: InsertOptions::default(),
        }
    }

    gen_durable::insert_option_setters!(opts);
}

impl<F: Fsm> IntoFuture for KitInsert<'_, F> {
    type Output = Result<i64>;
    type IntoFuture = Ready<Result<i64>>;
    fn into_future(self) -> Self::IntoFuture {
        self.kit.register_fsm::<F>();
        let row = Entry::<F>::new(self.state)
            .options(self.opts)
            .into_new_instance();
        ready(row.and_then(|row| self.kit.insert_one(row)))
    }
}

/// A pending insert by FSM name into a [`TestKit`]; see [`TestKit::insert_json`].
#[derive(Debug)]
#[must_use = "an insert does nothing until awaited"]
pub struct KitInsertJson<'k> {
    kit: &'k mut TestKit,
    fsm: String,
    version: i32,
    state: Value,
    opts: InsertOptions,
}

impl<'k> KitInsertJson<'k> {
    pub(crate) fn new(kit: &'k mut TestKit, fsm: String, version: i32, state: Value) -> Self {
        KitInsertJson {
            kit,
            fsm,
            version,
            state,
            opts: InsertOptions::default(),
        }
    }

    gen_durable::insert_option_setters!(opts);
}

impl IntoFuture for KitInsertJson<'_> {
    type Output = Result<i64>;
    type IntoFuture = Ready<Result<i64>>;
    fn into_future(self) -> Self::IntoFuture {
        let row = self
            .kit
            .registry()
            .new_instance(&self.fsm, self.version, self.state, self.opts);
        ready(row.and_then(|row| self.kit.insert_one(row)))
    }
}

/// A pending signal delivery into a [`TestKit`]; `.await` it.
#[derive(Debug)]
#[must_use = "a signal is not sent until awaited"]
pub struct KitSignal<'k> {
    kit: &'k mut TestKit,
    target: Target,
    name: String,
    payload: Value,
    dedup_key: Option<String>,
}

impl<'k> KitSignal<'k> {
    pub(crate) fn new(kit: &'k mut TestKit, target: Target, name: String, payload: Value) -> Self {
        KitSignal {
            kit,
            target,
            name,
            payload,
            dedup_key: None,
        }
    }

    /// A redelivery with the same key to the same instance stores nothing and succeeds,
    /// while the first is stored.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }
}

impl IntoFuture for KitSignal<'_> {
    type Output = Result<Delivery>;
    type IntoFuture = Ready<Result<Delivery>>;
    fn into_future(self) -> Self::IntoFuture {
        ready(
            self.kit
                .deliver(&self.target, &self.name, self.payload, self.dedup_key),
        )
    }
}

/// A pending wait on a [`TestKit`]'s instance; see [`TestKit::wait`].
#[derive(Debug)]
#[must_use = "a wait does nothing until awaited"]
pub struct KitWait<'k> {
    kit: &'k TestKit,
    target: Target,
    until_terminal: bool,
}

impl<'k> KitWait<'k> {
    pub(crate) fn new(kit: &'k TestKit, target: Target) -> Self {
        KitWait {
            kit,
            target,
            until_terminal: false,
        }
    }

    /// Answers a parked instance with `Busy`, as `Wait::until_terminal` would at its deadline.
    pub fn until_terminal(mut self) -> Self {
        self.until_terminal = true;
        self
    }
}

impl IntoFuture for KitWait<'_> {
    type Output = Result<Settled>;
    type IntoFuture = Ready<Result<Settled>>;
    fn into_future(self) -> Self::IntoFuture {
        ready(self.kit.wait_now(&self.target, self.until_terminal))
    }
}

/// A signal sent while a step ran, delivered when it returns.
#[derive(Debug)]
pub(crate) struct Deferred {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) payload: Value,
    pub(crate) dedup_key: Option<String>,
}

/// The signals sent through a kit's [`SignalSender`]s, not yet delivered.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outbox(Arc<Mutex<Vec<Deferred>>>);

impl Outbox {
    /// Every signal sent so far; the outbox starts again from empty.
    pub(crate) fn take(&self) -> Vec<Deferred> {
        std::mem::take(&mut *self.0.lock().expect("outbox"))
    }

    fn push(&self, d: Deferred) {
        self.0.lock().expect("outbox").push(d);
    }
}

/// Sends signals into a running [`TestKit`]; see [`TestKit::sender`]. Cheap to clone,
/// `Send + Sync`.
#[derive(Debug, Clone)]
pub struct SignalSender {
    outbox: Outbox,
}

impl SignalSender {
    pub(crate) fn new(outbox: Outbox) -> Self {
        SignalSender { outbox }
    }

    /// Queues a signal for delivery when the running step returns.
    pub fn send(&self, id: i64, name: impl Into<String>, payload: Value) {
        self.push(id, name.into(), payload, None);
    }

    /// Like [`SignalSender::send`], with a dedup key.
    pub fn send_dedup(
        &self,
        id: i64,
        name: impl Into<String>,
        payload: Value,
        key: impl Into<String>,
    ) {
        self.push(id, name.into(), payload, Some(key.into()));
    }

    fn push(&self, id: i64, name: String, payload: Value, dedup_key: Option<String>) {
        self.outbox.push(Deferred {
            id,
            name,
            payload,
            dedup_key,
        });
    }
}
