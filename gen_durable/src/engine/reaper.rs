//! The reaper service: takes back rows whose lease expired (spec §3.2, §7.3).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::store::pg::lease;
use crate::telemetry::Event;

/// Rows reaped per statement; the reaper loops while batches come back full.
const BATCH: i64 = 500;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(shared.cfg.reaper_interval) => {}
        }
        loop {
            match lease::reap(&shared.pool, BATCH, shared.clock.now_param()).await {
                Ok(rows) if rows.is_empty() => break,
                Ok(rows) => {
                    let full = rows.len() as i64 == BATCH;
                    let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
                    shared.telemetry.emit(Event::ReaperReaped {
                        count: ids.len(),
                        ids,
                    });
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "gen_durable::reaper", error = %e, "reap failed");
                    break;
                }
            }
        }
    }
}
