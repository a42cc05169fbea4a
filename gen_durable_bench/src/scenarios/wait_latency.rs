//! The `wait_latency` scenario: from an instance's last commit to `Client::wait`
//! returning, when the commit is made by an engine of the same process (the in-process
//! wake-up) and by another node (the client's probe) — and what addressing a signal by
//! correlation key costs next to addressing it by id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::{Entry, Event, Key, OutcomeKind, QueueConfig, Settled};
use serde_json::Map;

use super::{percentile, scalar_i64, EngineCfg, R};
use crate::fsms::{BenchState, Waiter};
use crate::{Bench, Report};

/// `wait_latency`: `samples` parked instances, each waited on (`until_terminal`) while it
/// is signalled; the time from its `done` commit to the wait's return. Then, with no
/// engine, rows finished by an UPDATE on another connection (another node's commit):
/// the time from that commit to the wait's return. Then signals by id and by key.
pub(super) async fn wait_latency(b: &Bench) -> R<Report> {
    let samples = if b.smoke() { 10 } else { 200 };
    b.clean().await?;
    let pool = b.pool(b.args.pool, false).await?;
    let client = b.client(&pool);
    let keyed = |i: usize| {
        Entry::<Waiter>::new(BenchState::new(i as i64, 0)).correlation_key(format!("w:{i}"))
    };

    // In-process: the engine's commit wakes the wait.
    let committed: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let seen = committed.clone();
    let cfg = EngineCfg::from_args(b);
    let engine = Engine::builder(pool.clone())
        .with_pooler(cfg.pooler)
        .with_listener(cfg.listener.clone())
        .queue_with(
            "bench",
            QueueConfig::new(cfg.concurrency).with_prefetch(cfg.prefetch),
        )
        .on_event(move |e| {
            if let Event::StepStop { id, kind, .. } = e {
                if *kind == OutcomeKind::Done {
                    seen.lock().expect("commits").insert(*id, Instant::now());
                }
            }
        })
        .start()
        .await?;
    let ids = client.insert_all((0..samples).map(keyed)).await?;
    parked(b, samples).await?;
    let mut in_process = Vec::with_capacity(samples);
    for &id in &ids {
        let wait = tokio::spawn({
            let client = client.clone();
            async move {
                let r = client
                    .wait(id)
                    .until_terminal()
                    .timeout(Duration::from_secs(10))
                    .await;
                (r, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        client.signal(id, "go", json!({})).await?;
        let (settled, returned) = wait.await?;
        if !matches!(settled?, Settled::Done(_)) {
            return Err(format!("the wait on {id} did not see it done").into());
        }
        let at = committed
            .lock()
            .expect("commits")
            .get(&id)
            .copied()
            .ok_or("no done commit seen")?;
        in_process.push(returned.saturating_duration_since(at).as_secs_f64() * 1e3);
    }
    engine.shutdown(Duration::from_secs(10)).await;

    // Another node's commit: no engine here; the probe finds it.
    b.clean().await?;
    let ids = client.insert_all((0..samples).map(keyed)).await?;
    let mut cross = Vec::with_capacity(samples);
    for &id in &ids {
        let wait = tokio::spawn({
            let client = client.clone();
            async move {
                let r = client.wait(id).timeout(Duration::from_secs(10)).await;
                (r, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        sqlx::query("UPDATE gd_instances SET status = 'done', result = '1' WHERE id = $1")
            .bind(id)
            .execute(&b.quiet)
            .await?;
        let at = Instant::now();
        let (settled, returned) = wait.await?;
        if !matches!(settled?, Settled::Done(_)) {
            return Err(format!("the wait on {id} did not see the other node's commit").into());
        }
        cross.push(returned.saturating_duration_since(at).as_secs_f64() * 1e3);
    }

    // Signal by id vs by key, interleaved, to rows that do not await the name.
    b.clean().await?;
    let ids = client.insert_all((0..samples).map(keyed)).await?;
    let (mut by_id, mut by_key) = (Vec::new(), Vec::new());
    for (i, &id) in ids.iter().enumerate() {
        let t = Instant::now();
        client.signal(id, "note", json!({})).await?;
        by_id.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        client
            .signal(Key(format!("w:{i}")), "note", json!({}))
            .await?;
        by_key.push(t.elapsed().as_secs_f64() * 1e3);
    }
    pool.close().await;

    let mut extra = Map::new();
    let ms = |v: Option<f64>| json!(v.map(|x| (x * 1000.0).round() / 1000.0));
    extra.insert("latency".into(), json!("outcome committed -> wait returns"));
    extra.insert(
        "in_process_p50_ms".into(),
        ms(percentile(&mut in_process, 0.5)),
    );
    extra.insert(
        "in_process_p99_ms".into(),
        ms(percentile(&mut in_process, 0.99)),
    );
    extra.insert(
        "cross_process_p50_ms".into(),
        ms(percentile(&mut cross, 0.5)),
    );
    extra.insert(
        "cross_process_p99_ms".into(),
        ms(percentile(&mut cross, 0.99)),
    );
    let (id50, key50) = (percentile(&mut by_id, 0.5), percentile(&mut by_key, 0.5));
    extra.insert("signal_by_id_p50_ms".into(), ms(id50));
    extra.insert("signal_by_key_p50_ms".into(), ms(key50));
    if let (Some(i), Some(k)) = (id50, key50) {
        extra.insert("key_vs_id".into(), json!((k / i * 1000.0).round() / 1000.0));
    }
    let secs: f64 = in_process.iter().sum::<f64>() / 1e3;
    Ok(Report::measured(
        samples as u64,
        secs,
        &mut in_process,
        0.0,
        extra,
    ))
}

/// Waits until `n` instances are parked.
async fn parked(b: &Bench, n: usize) -> R<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let parked = scalar_i64(
            &b.quiet,
            "SELECT count(*) FROM gd_instances WHERE status = 'awaiting_signal'",
        )
        .await?;
        if parked == n as i64 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("instances did not park".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
