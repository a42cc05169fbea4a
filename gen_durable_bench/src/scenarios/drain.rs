//! The `drain` and `five_step` scenarios: one engine drains a backlog of one- or five-step rows.

use std::time::Duration;

use gen_durable::prelude::*;
use serde_json::Map;

use super::tracker::{start_engine, Tracker};
use super::{insert_chunks, scalar_i64, statements, EngineCfg, R};
use crate::fsms::{reset_probe, Five, Noop, PROBE};
use crate::{Bench, Report};
use gen_durable_testkit::statements::by_kind;

/// `drain` (single-step no-ops) or `five_step` (five `next` steps each): inserts the
/// backlog, then starts one engine and times from the first step to the last commit.
pub(super) async fn drain(b: &Bench, cfg: &EngineCfg, five: bool) -> R<Report> {
    let n = b.args.n.unwrap_or(match (b.smoke(), five) {
        (true, _) => 200,
        (false, false) => 20_000,
        (false, true) => 5_000,
    });
    let steps_per = if five { 5 } else { 1 };
    b.clean().await?;
    let client = Client::new(b.quiet.clone());
    if five {
        insert_chunks::<Five>(&client, n, 0).await?;
    } else {
        insert_chunks::<Noop>(&client, n, 0).await?;
    }
    sqlx::query("VACUUM ANALYZE gd_instances")
        .execute(&b.quiet)
        .await?;
    reset_probe(true);
    let pool = b.logged_pool(cfg.pool).await?;
    let tracker = Tracker::new(n as u64);
    b.log.take();
    let engine = start_engine(&pool, cfg, &tracker).await?;
    let limit = Duration::from_secs(if b.smoke() { 30 } else { 300 });
    let waited = tracker.wait_done(limit).await;
    let counts = by_kind(&b.log.take());
    engine.shutdown(Duration::from_secs(10)).await;
    pool.close().await;
    waited?;
    let (first, runs) = {
        let g = PROBE.lock().expect("probe");
        let p = g.as_ref().expect("probe set");
        (p.first_start, p.runs)
    };
    let first = first.ok_or("no step ran")?;
    let last = tracker.last.lock().expect("last").ok_or("no commit")?;
    let secs = (last - first).as_secs_f64();
    let steps = (n * steps_per) as u64;

    // Verify: every instance done exactly once with the expected state.
    tracker.check_exactly_once(n)?;
    if runs != steps {
        return Err(format!("expected {steps} step runs, counted {runs}").into());
    }
    let sql = if five {
        "SELECT count(*) FROM gd_instances WHERE status = 'done' AND fsm = 'Five'
            AND (state->>'n')::int = 5 AND result = '5'::jsonb"
    } else {
        "SELECT count(*) FROM gd_instances WHERE status = 'done' AND fsm = 'Noop'
            AND result = (state->'i')"
    };
    let ok = scalar_i64(&b.quiet, sql).await?;
    let all = scalar_i64(&b.quiet, "SELECT count(*) FROM gd_instances").await?;
    if ok != n as i64 || all != n as i64 {
        return Err(
            format!("expected {n} rows done with the expected state; {ok} of {all} are").into(),
        );
    }
    let mut extra = Map::new();
    extra.insert("config".into(), cfg.json());
    extra.insert("instances".into(), json!(n));
    extra.insert("steps".into(), json!(steps));
    extra.insert(
        "unit".into(),
        json!(if five { "steps/s" } else { "instances/s" }),
    );
    let spr = statements(&counts, steps, &mut extra);
    tracker.commit_stats(&mut extra);
    let mut lat = std::mem::take(&mut *tracker.latencies_ms.lock().expect("lat"));
    extra.insert("latency".into(), json!("step start -> outcome committed"));
    Ok(Report::measured(steps, secs, &mut lat, spr, extra))
}
