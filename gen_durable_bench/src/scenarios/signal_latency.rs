//! The `signal_latency` scenario: from a `signal()` call to the woken step starting, when idle.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::Entry;
use serde_json::Map;
use tokio::sync::mpsc;

use super::tracker::{start_engine, Tracker};
use super::{percentile, scalar_i64, statements, EngineCfg, R};
use crate::fsms::{reset_probe, Waiter, PROBE};
use crate::{Bench, BoxError, Report};
use gen_durable_testkit::statements::{by_kind, KindCount};

/// `signal_latency`: an idle engine, instances parked on `go`; time from the `signal()`
/// call to the woken step starting.
pub(super) async fn signal_latency(b: &Bench) -> R<Report> {
    let samples = if b.smoke() { 10 } else { 200 };
    b.clean().await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    reset_probe(false);
    PROBE.lock().expect("probe").as_mut().expect("probe").woken = Some(tx);
    let pool = b.logged_pool(b.args.pool).await?;
    let tracker = Tracker::new(samples as u64);
    let cfg = EngineCfg::from_args(b);
    let engine = start_engine(&pool, &cfg, &tracker).await?;
    let client = b.client(&pool);
    let entries: Vec<Entry<Waiter>> = (0..samples)
        .map(|i| Entry::new(crate::fsms::BenchState::new(i as i64, 0)))
        .collect();
    let ids = client.insert_all::<Waiter>(entries).await?;
    let parked = async {
        loop {
            let n = scalar_i64(
                &b.quiet,
                "SELECT count(*) FROM gd_instances WHERE status = 'awaiting_signal'",
            )
            .await?;
            if n == samples as i64 {
                return Ok::<_, BoxError>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), parked)
        .await
        .map_err(|_| "instances did not park")??;
    // Let the engine go idle (its picks back off to the longest poll interval).
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.log.take();
    let mut lat = Vec::with_capacity(samples);
    let mut call = Vec::with_capacity(samples);
    for &id in &ids {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let t0 = Instant::now();
        let d = client.signal(id, "go", json!({})).await?;
        call.push(t0.elapsed().as_secs_f64() * 1e3);
        if !d.woke {
            return Err(format!("signal to {id} did not wake it").into());
        }
        let (woken, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| format!("instance {id} not woken within 10 s"))?
            .ok_or("probe channel closed")?;
        if woken != id {
            return Err(format!("woke {woken}, expected {id}").into());
        }
        lat.push((at - t0).as_secs_f64() * 1e3);
    }
    let waited = tracker.wait_done(Duration::from_secs(30)).await;
    let counts = by_kind(&b.log.take());
    report_unclassified(b, &counts);
    engine.shutdown(Duration::from_secs(10)).await;
    pool.close().await;
    waited?;
    tracker.check_exactly_once(samples)?;
    let ok = scalar_i64(
        &b.quiet,
        "SELECT count(*) FROM gd_instances WHERE status = 'done' AND result = '1'::jsonb
            AND NOT EXISTS (SELECT 1 FROM gd_signals)",
    )
    .await?;
    if ok != samples as i64 {
        return Err(format!("expected {samples} woken and done with one signal, {ok} are").into());
    }
    let secs: f64 = lat.iter().sum::<f64>() / 1e3;
    let mut extra = Map::new();
    extra.insert(
        "signal_call_p50_ms".into(),
        json!(percentile(&mut call, 0.5).map(|x| (x * 1000.0).round() / 1000.0)),
    );
    extra.insert(
        "latency".into(),
        json!("signal() call -> woken step starts"),
    );
    let spr = statements(&counts, samples as u64, &mut extra);
    tracker.commit_stats(&mut extra);
    Ok(Report::measured(samples as u64, secs, &mut lat, spr, extra))
}

/// Names what the counter could not classify, so a new statement shows up in the output.
fn report_unclassified(b: &Bench, counts: &BTreeMap<&'static str, KindCount>) {
    if counts.contains_key("other") {
        if let Some(t) = b.log.text("other") {
            eprintln!(
                "unclassified statement (first seen): {}",
                t.chars().take(300).collect::<String>()
            );
        }
    }
}
