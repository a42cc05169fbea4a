//! The reaper service: takes back rows whose lease expired (spec §3.2, §7.3).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::error::{Error, Result};
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
            let rows = match reap(&shared).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(target: "gen_durable::reaper", error = %e, "reap failed; reaping row by row");
                    one_by_one(&shared).await
                }
            };
            if rows.is_empty() {
                break;
            }
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
    }
}

async fn reap(shared: &Shared) -> Result<Vec<(i64, bool)>> {
    let mut conn = shared.conn().await?;
    let rows = lease::reap(conn.get(), BATCH, shared.clock.now_param()).await?;
    conn.finish().await?;
    Ok(rows)
}

/// When a batch fails, one row must not stop the reaper (its row stays first in the
/// reaper's order): reap each expired row alone, and leave the ones that fail — logged
/// with their id — for an operator.
async fn one_by_one(shared: &Shared) -> Vec<(i64, bool)> {
    let now = shared.clock.now_param();
    let ids = match lease::expired(&shared.pool, BATCH, now).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(target: "gen_durable::reaper", error = %e, "listing expired leases failed");
            return Vec::new();
        }
    };
    let mut reaped = Vec::new();
    for id in ids {
        let one = async {
            let mut conn = shared.conn().await?;
            let rows = lease::reap_one(conn.get(), id, now).await?;
            conn.finish().await?;
            Ok::<_, Error>(rows)
        };
        match one.await {
            Ok(rows) => reaped.extend(rows),
            Err(e) => {
                tracing::error!(target: "gen_durable::reaper", id, error = %e, "this row cannot be reaped")
            }
        }
    }
    reaped
}
