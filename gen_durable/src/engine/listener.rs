//! The wake-up listener: one LISTEN connection per engine. A notification names a
//! queue; its picker picks at once. A `gd_cancel` notification names an instance whose
//! running step should see `ctx.cancelled()` resolve. Polling stays the source of truth, so a lost
//! notification (or a dropped listener connection) only costs one poll interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::store::pg::{CANCEL_CHANNEL, WAKE_CHANNEL};

pub(crate) async fn run(
    shared: Arc<Shared>,
    queues: HashMap<String, Arc<Notify>>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut listener = match connect(&shared).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(target: "gen_durable::listener", error = %e, "cannot LISTEN; polling only for now");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        // Anything may have been missed while we were not listening.
        queues.values().for_each(|n| n.notify_one());
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = listener.try_recv() => m,
            };
            match msg {
                Ok(Some(n)) if n.channel() == CANCEL_CHANNEL => {
                    if let Ok(id) = n.payload().parse::<i64>() {
                        shared.cancel_step(id);
                    }
                }
                Ok(Some(n)) => {
                    if let Some(wake) = queues.get(n.payload()) {
                        wake.notify_one();
                    }
                }
                Ok(None) => {
                    // The connection dropped; sqlx reconnects on the next call. Wake every
                    // queue since notifications may have been lost meanwhile.
                    queues.values().for_each(|n| n.notify_one());
                }
                Err(e) => {
                    tracing::warn!(target: "gen_durable::listener", error = %e, "listener failed; reconnecting");
                    break;
                }
            }
        }
    }
}

async fn connect(shared: &Shared) -> sqlx::Result<PgListener> {
    let mut l = PgListener::connect_with(&shared.pool).await?;
    l.listen_all([WAKE_CHANNEL, CANCEL_CHANNEL]).await?;
    Ok(l)
}
