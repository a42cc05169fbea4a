//! The collector service (spec §7.6): deletes `done`/`failed` rows older than the
//! retention, in bounded batches (`SKIP LOCKED`, so several nodes collecting at once
//! only share the work), never a child whose parent is still live.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::store::pg::{admin, millis};

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let retention = millis(shared.cfg.retention);
    let batch = shared.cfg.collector_batch as i64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(shared.cfg.collector_interval) => {}
        }
        loop {
            if stop.is_cancelled() {
                return;
            }
            let collected = async {
                let mut conn = shared.conn().await?;
                let n =
                    admin::gc_batch(conn.get(), retention, batch, shared.clock.now_param()).await?;
                conn.finish().await?;
                Ok::<_, crate::error::Error>(n)
            };
            match collected.await {
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(target: "gen_durable::collector", deleted = n, "collected finished instances");
                    }
                    if (n as i64) < batch {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "gen_durable::collector", error = %e, "collection failed");
                    break;
                }
            }
        }
    }
}
