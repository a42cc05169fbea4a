//! Delivering a signal: [`Client::signal`] and its pending delivery, [`SignalSend`].

use std::future::IntoFuture;

use serde_json::Value;
use sqlx::PgExecutor;

use super::{BoxFut, Client};
use crate::model::answers::Delivery;
use crate::model::error::Result;
use crate::model::target::Target;
use crate::store::pg;

impl Client {
    /// Starts a signal delivery to an instance, named by its id or by its correlation
    /// key (`Key("order:42")`). `.await` it (or `.execute(&mut *tx)`). Resolving the key,
    /// storing the signal and waking the instance are one statement; a key no instance
    /// holds is [`Error::KeyNotFound`](crate::Error::KeyNotFound), a finished holder
    /// [`Error::Finished`](crate::Error::Finished), and nothing is stored.
    pub fn signal(
        &self,
        to: impl Into<Target>,
        name: impl Into<String>,
        payload: Value,
    ) -> SignalSend<'_> {
        SignalSend {
            client: self,
            target: to.into(),
            name: name.into(),
            payload,
            dedup_key: None,
            shard: None,
        }
    }
}

/// A pending signal delivery; see [`Client::signal`].
#[derive(Debug)]
#[must_use = "a signal is not sent until awaited or executed"]
pub struct SignalSend<'c> {
    client: &'c Client,
    target: Target,
    name: String,
    payload: Value,
    dedup_key: Option<String>,
    /// The shard of a [`crate::ShardedClient`] it goes to, named by its database errors.
    shard: Option<usize>,
}

impl SignalSend<'_> {
    /// A redelivery with the same key to the same instance stores nothing and succeeds.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// Delivered on shard `shard` of a [`crate::ShardedClient`]: its database errors
    /// name it.
    pub(crate) fn on_shard(mut self, shard: usize) -> Self {
        self.shard = Some(shard);
        self
    }

    /// Checks the target, name, payload and dedup key, then delivers on `db` in one
    /// statement.
    pub async fn execute<'e>(self, db: impl PgExecutor<'e>) -> Result<Delivery> {
        let shard = self.shard;
        self.deliver(db).await.map_err(|e| e.on_shard(shard))
    }

    async fn deliver<'e>(self, db: impl PgExecutor<'e>) -> Result<Delivery> {
        crate::model::validate::check_target(&self.target)?;
        crate::model::validate::check_signal(
            &self.name,
            &self.payload,
            self.dedup_key.as_deref(),
            self.client.max_signal_payload,
        )?;
        pg::signal::deliver(
            self.client.pooler.on(db),
            &self.target,
            &self.name,
            &self.payload,
            self.dedup_key.as_deref(),
            self.client.clock.now_param(),
        )
        .await?
        .answer(&self.target)
    }
}

into_future_on_pool!(SignalSend<'c>, Delivery);
