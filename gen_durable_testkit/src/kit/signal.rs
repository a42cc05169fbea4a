//! Delivering signals in the kit: `signal`, checked as `Client::signal` checks it, and the
//! signals a running step sends through a [`SignalSender`], delivered once it returns.

use gen_durable::{Delivery, Result, Target};
use serde_json::Value;

use super::TestKit;
use crate::builders::{KitSignal, SignalSender};

impl TestKit {
    /// Starts a signal delivery to instance `id`; `.dedup_key(k)` optional, then
    /// `.await` it. Errors exactly as `Client::signal`: `NotFound`, `Finished`, a bad
    /// name or an oversized payload, and nothing stored.
    pub fn signal(
        &mut self,
        to: impl Into<Target>,
        name: impl Into<String>,
        payload: Value,
    ) -> KitSignal<'_> {
        KitSignal::new(self, to.into(), name.into(), payload)
    }

    pub(crate) fn deliver(
        &mut self,
        to: &Target,
        name: &str,
        payload: Value,
        dedup_key: Option<String>,
    ) -> Result<Delivery> {
        gen_durable::backend::check_target(to)?;
        gen_durable::backend::check_signal(
            name,
            &payload,
            dedup_key.as_deref(),
            self.max_signal_payload,
        )?;
        let now = self.now();
        self.store
            .deliver(to, name, payload, dedup_key, now)
            .answer(to)
    }

    /// A handle a step (or anything else) can send signals through while the kit runs:
    /// they are delivered as soon as the running step returns, before its outcome
    /// commits — as a signal that arrives while a step runs does on Postgres. Results
    /// are kept in [`TestKit::sent`].
    pub fn sender(&self) -> SignalSender {
        SignalSender::new(self.outbox.clone())
    }

    /// The deliveries made through [`TestKit::sender`] so far: target, name, result.
    pub fn sent(&self) -> &[(i64, String, Result<Delivery>)] {
        &self.sent
    }

    pub(super) fn deliver_deferred(&mut self) {
        for d in self.outbox.take() {
            let r = self.deliver(&Target::Id(d.id), &d.name, d.payload, d.dedup_key);
            self.sent.push((d.id, d.name, r));
        }
    }
}
