//! The `fan_out` scenario: one parent fans out to many children and fans their results in.

use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use serde_json::{Map, Value};

use super::tracker::{start_engine, Tracker};
use super::{scalar_i64, statements, EngineCfg, R};
use crate::fsms::{reset_probe, FanParent};
use crate::rss::RssSampler;
use crate::{Bench, Report};
use gen_durable_testkit::statements::by_kind;

/// `fan_out`: one parent, 10,000 children, the parent's fan-in step; from insert to the
/// parent's `done`.
pub(super) async fn fan_out(b: &Bench) -> R<Report> {
    let children = b.args.n.unwrap_or(if b.smoke() { 100 } else { 10_000 });
    b.clean().await?;
    reset_probe(false);
    let pool = b.logged_pool(b.args.pool).await?;
    // Children and the parent: n + 1 instances end done.
    let tracker = Tracker::new(children as u64 + 1);
    let cfg = EngineCfg::from_args(b);
    let rss = RssSampler::start();
    let engine = start_engine(&pool, &cfg, &tracker).await?;
    let client = Client::new(b.quiet.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.log.take();
    let t0 = Instant::now();
    let parent = client
        .insert::<FanParent>(crate::fsms::BenchState::new(0, children as i64))
        .await?;
    let waited = tracker
        .wait_done(Duration::from_secs(if b.smoke() { 30 } else { 300 }))
        .await;
    let mut memory = Map::new();
    rss.finish(&mut memory).await;
    let counts = by_kind(&b.log.take());
    engine.shutdown(Duration::from_secs(10)).await;
    pool.close().await;
    waited?;
    let last = tracker.last.lock().expect("last").ok_or("no commit")?;
    let secs = (last - t0).as_secs_f64();
    let fanned = tracker
        .first_schedule
        .lock()
        .expect("sched")
        .map(|t| (t - t0).as_secs_f64());
    tracker.check_exactly_once(children + 1)?;
    let result: Value = sqlx::query_scalar(
        "SELECT result FROM gd_instances WHERE id = $1 AND status = 'done' AND children_pending = 0",
    )
    .bind(parent)
    .fetch_optional(&b.quiet)
    .await?
    .ok_or("the parent is not done")?;
    let n = children as i64;
    let want = json!({ "total": n, "done": n, "sum": n * (n - 1) / 2 });
    if result != want {
        return Err(format!("parent result {result}, expected {want}").into());
    }
    let kids = scalar_i64(
        &b.quiet,
        &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {parent} AND status = 'done' AND result = state->'i'"),
    )
    .await?;
    if kids != n {
        return Err(format!("{kids} of {n} children done with their result").into());
    }
    let mut extra = Map::new();
    extra.insert("children".into(), json!(children));
    extra.insert(
        "fan_out_secs".into(),
        json!(fanned.map(|s| (s * 1e4).round() / 1e4)),
    );
    extra.insert("unit".into(), json!("children/s, insert -> parent done"));
    let spr = statements(&counts, children as u64 + 2, &mut extra);
    tracker.commit_stats(&mut extra);
    extra.extend(memory);
    Ok(Report {
        n: children as u64,
        secs,
        per_s: children as f64 / secs,
        p50_ms: None,
        p99_ms: None,
        statements_per_step: Some(spr),
        extra,
    })
}
