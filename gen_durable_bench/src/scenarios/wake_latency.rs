//! The `wake_latency` scenario: how long a new instance waits for an idle engine, by the
//! way the engine hears of it — what `WakeListener` costs behind a pooler.

use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::{Event, OutcomeKind, Pooler, QueueConfig};
use serde_json::Map;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;

use super::{percentile, R};
use crate::fsms::{BenchState, Noop};
use crate::{Bench, Listen, Report};

/// `wake_latency`: one engine at a time with the queue's default polling (1 s, backing off
/// to 5 s when idle), idle between inserts (a pseudo-random 0–300 ms gap after each
/// one ran); the time from a single `insert` being called to its one no-op step
/// committing. Modes: LISTEN on the pool, without a pooler; and with `--pooler-url`,
/// through the pooler with LISTEN on a direct connection, then with no LISTEN at all.
pub(super) async fn wake_latency(b: &Bench) -> R<Report> {
    let samples = if b.smoke() { 3 } else { 40 };
    let mut modes = vec![("direct_listen_pool", Pooler::None, Listen::Pool)];
    if b.pooler() == Pooler::Transaction {
        modes.push(("pooled_listen_direct", Pooler::Transaction, Listen::Direct));
        modes.push(("pooled_no_listen", Pooler::Transaction, Listen::Off));
    }
    let mut extra = Map::new();
    let mut first = Vec::new();
    let mut gap = 0x9e37_79b9_u64;
    for (name, pooler, listen) in modes {
        b.clean().await?;
        let opts = match pooler {
            Pooler::Transaction => b.logged.clone(),
            _ => b.direct.clone(),
        };
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let engine = Engine::builder(pool.clone())
            .with_pooler(pooler)
            .with_listener(b.listener_for(listen))
            .queue_with("bench", QueueConfig::new(4))
            .on_event(move |e| {
                if let Event::StepStop { id, kind, .. } = e {
                    if *kind == OutcomeKind::Done {
                        let _ = tx.send((*id, Instant::now()));
                    }
                }
            })
            .start()
            .await?;
        let client = Client::new(pool.clone()).with_pooler(pooler);
        let mut ms = Vec::with_capacity(samples);
        for i in 0..samples {
            gap ^= gap << 13;
            gap ^= gap >> 7;
            gap ^= gap << 17;
            tokio::time::sleep(Duration::from_millis(gap % 300)).await;
            let t = Instant::now();
            let id = client.insert::<Noop>(BenchState::new(i as i64, 0)).await?;
            let (done, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .map_err(|_| format!("{name}: instance {id} did not run within 30 s"))?
                .ok_or("the engine stopped")?;
            if done != id {
                return Err(format!("{name}: expected {id} to run, {done} did").into());
            }
            ms.push(at.duration_since(t).as_secs_f64() * 1e3);
        }
        engine.shutdown(Duration::from_secs(10)).await;
        pool.close().await;
        let r3 = |v: Option<f64>| json!(v.map(|x| (x * 1000.0).round() / 1000.0));
        extra.insert(format!("{name}_p50_ms"), r3(percentile(&mut ms, 0.5)));
        extra.insert(format!("{name}_p99_ms"), r3(percentile(&mut ms, 0.99)));
        if first.is_empty() {
            first = ms;
        }
    }
    extra.insert(
        "latency".into(),
        json!("insert called -> its step committed"),
    );
    let secs = first.iter().sum::<f64>() / 1e3;
    Ok(Report {
        n: samples as u64,
        secs,
        per_s: samples as f64 / secs,
        p50_ms: percentile(&mut first, 0.5),
        p99_ms: percentile(&mut first, 0.99),
        statements_per_step: None,
        extra,
    })
}
