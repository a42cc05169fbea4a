//! The `insert` scenario: single inserts from concurrent callers, against pgbench's rate.

use std::process::Command;
use std::time::Instant;

use gen_durable::prelude::*;
use serde_json::Map;

use super::{scalar_i64, statements, R};
use crate::fsms::Noop;
use crate::{Bench, Report};
use gen_durable_testkit::statements::by_kind;

/// `insert`: single inserts from 8 concurrent callers.
///
/// Two passes: 1,000 inserts on a pool whose statements are counted, then the timed
/// pass on one whose statements are not logged — sqlx formats the text of every logged
/// statement (`sqlformat`), client work that pgbench, the baseline, doesn't do.
pub(super) async fn insert(b: &Bench) -> R<Report> {
    let n = if b.smoke() { 200 } else { 20_000 };
    let counted = n.min(1_000);
    let callers = 8;
    b.clean().await?;

    let pool = b.pool(callers as u32, true).await?;
    let client = b.client(&pool);
    single_inserts(&client, callers, 0..callers, -1).await?; // warm every connection
    b.log.take();
    single_inserts(&client, callers, 0..counted, 0).await?;
    let counts = by_kind(&b.log.take());
    pool.close().await;

    let pool = b.pool(callers as u32, false).await?;
    let client = b.client(&pool);
    single_inserts(&client, callers, 0..callers, -1).await?;
    let t0 = Instant::now();
    let mut lat = single_inserts(&client, callers, counted..n + counted, 0).await?;
    let secs = t0.elapsed().as_secs_f64();
    pool.close().await;
    let got = scalar_i64(
        &b.quiet,
        "SELECT count(DISTINCT (state->>'i')) FROM gd_instances WHERE queue = 'bench' AND status = 'runnable'
            AND (state->>'i')::int >= 0",
    )
    .await?;
    if got != (n + counted) as i64 {
        return Err(format!(
            "insert: expected {} distinct runnable rows, found {got}",
            n + counted
        )
        .into());
    }
    let mut extra = Map::new();
    extra.insert("callers".into(), json!(callers));
    extra.insert("counted_inserts".into(), json!(counted));
    let spr = statements(&counts, counted as u64, &mut extra);
    if !b.smoke() && !b.args.no_ceiling {
        match pgbench_insert(b, callers) {
            Ok(tps) => {
                extra.insert("pgbench_insert_per_s".into(), json!(tps.round()));
                extra.insert(
                    "ratio_to_pgbench".into(),
                    json!(((n as f64 / secs) / tps * 1000.0).round() / 1000.0),
                );
            }
            Err(e) => eprintln!("pgbench insert baseline failed: {e}"),
        }
    }
    Ok(Report::measured(n as u64, secs, &mut lat, spr, extra))
}

/// Inserts one `Noop` per `i` in `range` from `callers` tasks (state `i`, or `warm` < 0
/// for warm-up rows on another queue); returns each call's latency in ms.
async fn single_inserts(
    client: &Client,
    callers: usize,
    range: std::ops::Range<usize>,
    warm: i64,
) -> R<Vec<f64>> {
    let mut tasks = Vec::new();
    for c in 0..callers {
        let client = client.clone();
        let range = range.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(range.len() / callers + 1);
            for j in (range.start + c..range.end).step_by(callers) {
                let s = Instant::now();
                let state = crate::fsms::BenchState::new(if warm < 0 { warm } else { j as i64 }, 0);
                let insert = client.insert::<Noop>(state);
                if warm < 0 {
                    insert.queue("warm").await?;
                } else {
                    insert.await?;
                }
                lat.push(s.elapsed().as_secs_f64() * 1e3);
            }
            Ok::<_, gen_durable::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    Ok(lat)
}

/// pgbench's single-row insert rate into the same table, at the same concurrency: the
/// baseline of the `insert` scenario.
fn pgbench_insert(b: &Bench, clients: usize) -> R<f64> {
    let script = std::env::temp_dir().join(format!("gd_bench_insert_{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue) \
         VALUES ('Noop', 1, 'run', '{\"i\": 1}', 'pgbench');\n",
    )?;
    let o = &b.logged;
    let out = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-T", "5", "-j", "2"])
        .arg("-c")
        .arg(clients.to_string())
        .arg("-f")
        .arg(&script)
        .arg("-h")
        .arg(o.get_host())
        .arg("-p")
        .arg(o.get_port().to_string())
        .arg("-U")
        .arg(o.get_username())
        .arg("gen_durable_bench")
        .output()?;
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("tps = ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
        })
        .ok_or_else(|| format!("no tps in pgbench's output: {text}").into())
}
