//! The heartbeat service: one statement per tick extends every lease this node holds,
//! and learns which of its steps were cancelled meanwhile.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::store::pg::{lease, millis};

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let every = shared.cfg.heartbeat();
    let ttl = millis(shared.cfg.lease_ttl);
    loop {
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
        match lease::heartbeat(
            &shared.pool,
            &held,
            ttl,
            &shared.cfg.node_id,
            shared.clock.now_param(),
        )
        .await
        {
            Ok(rows) => {
                if rows.len() < held.len() {
                    tracing::debug!(target: "gen_durable::lease", held = held.len(), extended = rows.len(),
                        "some leases were not extended: their rows finished or were reaped");
                }
                for (id, _) in rows.iter().filter(|(_, cancel)| *cancel) {
                    shared.cancel_step(*id);
                }
            }
            Err(e) => tracing::warn!(target: "gen_durable::lease", error = %e, "heartbeat failed"),
        }
    }
}
