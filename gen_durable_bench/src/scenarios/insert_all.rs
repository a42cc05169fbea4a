//! The `insert_all` scenario: batch inserts of many rows per call.

use std::time::Instant;

use gen_durable::prelude::*;
use gen_durable::Entry;
use serde_json::Map;

use super::{scalar_i64, statements, R};
use crate::fsms::Noop;
use crate::{Bench, Report};
use gen_durable_testkit::statements::by_kind;

/// `insert_all`: 20,000 rows per call.
pub(super) async fn insert_all(b: &Bench) -> R<Report> {
    let (calls, per_call) = if b.smoke() { (2, 200) } else { (5, 20_000) };
    b.clean().await?;
    let pool = b.logged_pool(2).await?;
    let client = b.client(&pool);
    client
        .insert_all::<Noop>(vec![
            Entry::new(crate::fsms::BenchState::new(-1, 0)).queue("warm")
        ])
        .await?;
    b.log.take();
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for c in 0..calls {
        let entries: Vec<Entry<Noop>> = (0..per_call)
            .map(|j| Entry::new(crate::fsms::BenchState::new((c * per_call + j) as i64, 0)))
            .collect();
        let s = Instant::now();
        ids.extend(client.insert_all::<Noop>(entries).await?);
        lat.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let secs = t0.elapsed().as_secs_f64();
    let counts = by_kind(&b.log.take());
    pool.close().await;
    let n = calls * per_call;
    ids.sort_unstable();
    ids.dedup();
    let got = scalar_i64(
        &b.quiet,
        "SELECT count(DISTINCT (state->>'i')) FROM gd_instances WHERE queue = 'bench'",
    )
    .await?;
    if ids.len() != n || got != n as i64 {
        return Err(format!(
            "insert_all: expected {n} rows, got {} ids and {got} rows",
            ids.len()
        )
        .into());
    }
    let mut extra = Map::new();
    extra.insert("rows_per_call".into(), json!(per_call));
    let spr = statements(&counts, n as u64, &mut extra);
    Ok(Report::measured(n as u64, secs, &mut lat, spr, extra))
}
