//! The vacuum stand-in for a server whose autovacuum is off (see the crate doc).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// `VACUUM (ANALYZE)` of both tables every `every`, throttled as autovacuum is.
pub(crate) async fn vacuum_loop(
    opts: PgConnectOptions,
    every: Duration,
    runs: Arc<Mutex<Vec<f64>>>,
) -> Result<(), sqlx::Error> {
    // Autovacuum's throttling, as startup parameters of the one connection.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            opts.application_name("gd_steady-vacuum")
                .options([("vacuum_cost_delay", "2ms"), ("vacuum_cost_limit", "200")]),
        )
        .await?;
    loop {
        tokio::time::sleep(every).await;
        let start = Instant::now();
        sqlx::raw_sql("VACUUM (ANALYZE) gd_instances")
            .execute(&pool)
            .await?;
        sqlx::raw_sql("VACUUM (ANALYZE) gd_signals")
            .execute(&pool)
            .await?;
        runs.lock()
            .expect("vacuum runs")
            .push(start.elapsed().as_secs_f64());
    }
}
