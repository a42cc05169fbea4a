//! The heartbeat service: one statement per tick extends every lease this node holds,
//! and learns which of its steps were cancelled meanwhile. It also announces the node
//! (its queues and FSM versions) for `gen_durable status`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::store::pg::{admin, lease, millis};

/// The longest gap between two announcements, so a node with a slow heartbeat still
/// counts as live for `gen_durable status` (its window is 60 s).
const ANNOUNCE_AT_LEAST_EVERY: Duration = Duration::from_secs(20);

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let every = shared.cfg.heartbeat().min(ANNOUNCE_AT_LEAST_EVERY);
    let ttl = millis(shared.cfg.lease_ttl);
    loop {
        announce(&shared).await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let held: Vec<(i64, i64)> = {
            let table = shared.leases.lock().expect("lease table");
            table.iter().map(|(id, epoch)| (*id, *epoch)).collect()
        };
        if held.is_empty() {
            continue;
        }
        let beat = async {
            let mut conn = shared.conn().await?;
            let rows = lease::heartbeat(
                conn.get(),
                &held,
                ttl,
                &shared.cfg.node_id,
                shared.clock.now_param(),
            )
            .await?;
            conn.finish().await?;
            Ok::<_, crate::error::Error>(rows)
        };
        match beat.await {
            Ok(rows) => {
                if rows.len() < held.len() {
                    tracing::debug!(target: "gen_durable::lease", held = held.len(), extended = rows.len(),
                        "some leases were not extended: their rows finished, were reaped, or were locked by another transaction (extended at the next beat)");
                }
                for (id, _) in rows.iter().filter(|(_, cancel)| *cancel) {
                    shared.cancel_step(*id);
                }
            }
            Err(e) => tracing::warn!(target: "gen_durable::lease", error = %e, "heartbeat failed"),
        }
    }
}

/// Tells `gen_durable status` which queues and FSM versions this node runs.
async fn announce(shared: &Shared) {
    if let Err(e) = admin::announce(
        &shared.pool,
        &shared.cfg.node_id,
        &shared.queue_names,
        &shared.fsms,
        shared.clock.now_param(),
    )
    .await
    {
        tracing::warn!(target: "gen_durable::lease", error = %e, "node announcement failed");
    }
}
