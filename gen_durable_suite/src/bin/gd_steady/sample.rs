//! The periodic report: one sample of the tally's interval figures, the tables' rows,
//! sizes and dead tuples, and the node's RSS; and its one-line print.

use std::time::Instant;

use sqlx::{PgPool, Row};

use crate::tally::Shared;

/// This process's resident set, MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

pub(crate) fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One report line's figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) t: f64,
    pub(crate) offered: f64,
    pub(crate) completed: f64,
    /// Instances done since the start.
    pub(crate) done_total: u64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    pub(crate) backlog: i64,
    pub(crate) parked: i64,
    pub(crate) rows: i64,
    pub(crate) inst_heap: i64,
    pub(crate) inst_idx: i64,
    pub(crate) inst_total: i64,
    pub(crate) inst_dead: i64,
    pub(crate) sig_total: i64,
    pub(crate) sig_dead: i64,
    pub(crate) rss: f64,
}

const DB_STATS: &str = "SELECT
    (SELECT count(*) FROM gd_instances WHERE status IN ('runnable', 'executing')) AS backlog,
    (SELECT count(*) FROM gd_instances WHERE status = 'awaiting_signal') AS parked,
    (SELECT count(*) FROM gd_instances) AS rows,
    pg_relation_size('gd_instances') + pg_relation_size('gd_instances', 'fsm')
        + pg_relation_size('gd_instances', 'vm') AS inst_heap,
    pg_indexes_size('gd_instances') AS inst_idx,
    pg_total_relation_size('gd_instances') AS inst_total,
    pg_total_relation_size('gd_signals') AS sig_total,
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'gd_instances'), 0) AS inst_dead,
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'gd_signals'), 0) AS sig_dead";

pub(crate) async fn sample(
    shared: &Shared,
    stats: &PgPool,
    since: &mut Instant,
) -> Result<Report, sqlx::Error> {
    let now = Instant::now();
    let secs = (now - *since).as_secs_f64().max(1e-3);
    *since = now;
    let (offered, lat, done_total) = {
        let mut t = shared.tally();
        (
            std::mem::take(&mut t.offered),
            std::mem::take(&mut t.interval),
            t.completed,
        )
    };
    let row = sqlx::query(DB_STATS).fetch_one(stats).await?;
    Ok(Report {
        t: (now - shared.t0).as_secs_f64(),
        offered: offered as f64 / secs,
        completed: lat.n as f64 / secs,
        done_total,
        p50: lat.quantile_ms(0.50),
        p99: lat.quantile_ms(0.99),
        max: lat.quantile_ms(1.0),
        backlog: row.try_get("backlog")?,
        parked: row.try_get("parked")?,
        rows: row.try_get("rows")?,
        inst_heap: row.try_get("inst_heap")?,
        inst_idx: row.try_get("inst_idx")?,
        inst_total: row.try_get("inst_total")?,
        inst_dead: row.try_get("inst_dead")?,
        sig_total: row.try_get("sig_total")?,
        sig_dead: row.try_get("sig_dead")?,
        rss: rss_mib(),
    })
}

pub(crate) fn print_report(r: &Report) {
    println!(
        "steady: t={:>5.0}s offered/s={:>7.1} completed/s={:>7.1} p50={:>6.1}ms p99={:>7.1}ms max={:>7.1}ms \
         backlog={:>5} parked={:>5} rows={:>7} gd_instances={:>6.2}MiB(heap {:.2}+idx {:.2}) dead={:>6} \
         gd_signals={:>5.2}MiB dead={:>5} rss={:>6.1}MiB",
        r.t,
        r.offered,
        r.completed,
        r.p50,
        r.p99,
        r.max,
        r.backlog,
        r.parked,
        r.rows,
        mib(r.inst_total),
        mib(r.inst_heap),
        mib(r.inst_idx),
        r.inst_dead,
        mib(r.sig_total),
        r.sig_dead,
        r.rss
    );
}
