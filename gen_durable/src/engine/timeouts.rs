//! The await-timeout service: parked rows past their deadline become runnable with
//! nothing awaited (spec §5). It sleeps until the earliest deadline it knows of, at
//! most `timeout_interval`, and is woken early when this node parks a row with a timeout.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::store::pg::lease;

const BATCH: i64 = 1000;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let mut wait = shared.cfg.timeout_interval;
        let sweep = async {
            let mut conn = shared.conn().await?;
            let n = lease::expire_awaits(conn.get(), BATCH, shared.clock.now_param()).await?;
            conn.finish().await?;
            Ok::<_, crate::error::Error>(n)
        };
        match sweep.await {
            Ok(n) if n == BATCH => wait = Duration::ZERO,
            Ok(_) => {
                if let Ok(Some(ms)) =
                    lease::next_deadline_ms(&shared.pool, shared.clock.now_param()).await
                {
                    let until = Duration::from_millis(ms.max(0) as u64 + 1);
                    wait = wait.min(until);
                }
            }
            Err(e) => {
                tracing::warn!(target: "gen_durable::timeouts", error = %e, "await sweep failed")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.timeouts_wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
