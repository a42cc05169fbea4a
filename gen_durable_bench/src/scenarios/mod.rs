//! The scenarios, one file each; here the dispatch and what they all share.
//!
//! Each scenario starts from an empty table, measures, then checks its own
//! result and fails loudly (an `Err`) if any instance is not `done` exactly once with
//! the expected state.

mod done_ids;
mod drain;
mod drain_sweep;
mod explain;
mod fan_out;
mod insert;
mod insert_all;
mod latencies;
mod pick_1m;
pub(crate) mod processes;
mod signal_latency;
mod tracker;
mod wait_latency;
mod wake_latency;

use std::collections::BTreeMap;

use gen_durable::prelude::*;
use gen_durable::Entry;
use serde_json::{Map, Value};
use sqlx::PgPool;

use crate::{Bench, BoxError, Report};
use gen_durable_testkit::statements::KindCount;

type R<T> = Result<T, BoxError>;

/// Runs scenario `name`; most give one report, `drain_sweep` one per setting.
pub(crate) async fn run(b: &Bench, name: &str) -> R<Vec<Report>> {
    eprintln!("scenario {name}");
    Ok(match name {
        "insert" => vec![insert::insert(b).await?],
        "insert_all" => vec![insert_all::insert_all(b).await?],
        "drain" => vec![drain::drain(b, &EngineCfg::from_args(b), false).await?],
        "five_step" => vec![drain::drain(b, &EngineCfg::from_args(b), true).await?],
        "drain_gated" => {
            vec![drain::drain_with(b, &EngineCfg::from_args(b), drain::Flow::Gate).await?]
        }
        "drain_rate_limited" => {
            vec![drain::drain_with(b, &EngineCfg::from_args(b), drain::Flow::Rate).await?]
        }
        "signal_latency" => vec![signal_latency::signal_latency(b).await?],
        "wait_latency" => vec![wait_latency::wait_latency(b).await?],
        "wake_latency" => vec![wake_latency::wake_latency(b).await?],
        "fan_out" => vec![fan_out::fan_out(b).await?],
        "pick_1m" => vec![pick_1m::pick_1m(b).await?],
        "drain_sweep" => drain_sweep::drain_sweep(b).await?,
        other => return Err(format!("unknown scenario {other}").into()),
    })
}

/// Engine settings under test.
#[derive(Debug, Clone)]
struct EngineCfg {
    concurrency: usize,
    prefetch: usize,
    min_demand: usize,
    commit_batch: usize,
    pool: u32,
    pooler: gen_durable::Pooler,
    listener: gen_durable::WakeListener,
}

impl EngineCfg {
    fn from_args(b: &Bench) -> Self {
        EngineCfg {
            concurrency: b.args.concurrency,
            prefetch: b.args.prefetch,
            min_demand: b.args.min_demand,
            commit_batch: b.args.commit_batch,
            pool: b.args.pool,
            pooler: b.pooler(),
            listener: b.listener(),
        }
    }
    fn json(&self) -> Value {
        json!({ "concurrency": self.concurrency, "prefetch": self.prefetch, "min_demand": self.min_demand,
                "commit_batch": self.commit_batch, "pool": self.pool })
    }
}

pub(crate) fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    Some(v[i])
}

/// Statements per step, and per kind per step, from the counts of one scenario.
fn statements(
    counts: &BTreeMap<&'static str, KindCount>,
    steps: u64,
    extra: &mut Map<String, Value>,
) -> f64 {
    let total: u64 = counts.values().map(|t| t.statements).sum();
    let by_kind: Map<String, Value> = counts
        .iter()
        .map(|(k, t)| ((*k).to_string(), json!(t.statements)))
        .collect();
    extra.insert("statements".into(), Value::Object(by_kind));
    if let Some(t) = counts.get("claim").filter(|t| t.statements > 0) {
        let avg = t.rows_returned as f64 / t.statements as f64;
        extra.insert("rows_per_claim".into(), json!((avg * 10.0).round() / 10.0));
    }
    total as f64 / steps.max(1) as f64
}

async fn scalar_i64(pool: &PgPool, sql: &str) -> R<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

async fn insert_chunks<F: Fsm<State = crate::fsms::BenchState>>(
    client: &Client,
    n: usize,
    n_field: i64,
) -> R<()> {
    insert_chunks_with::<F>(client, n, n_field, &gen_durable::InsertOptions::default()).await
}

/// `insert_chunks` with insert options on every row.
async fn insert_chunks_with<F: Fsm<State = crate::fsms::BenchState>>(
    client: &Client,
    n: usize,
    n_field: i64,
    opts: &gen_durable::InsertOptions,
) -> R<()> {
    let mut i = 0;
    while i < n {
        let k = (n - i).min(20_000);
        let entries: Vec<Entry<F>> = (i..i + k)
            .map(|j| {
                Entry::new(crate::fsms::BenchState::new(j as i64, n_field)).options(opts.clone())
            })
            .collect();
        client.insert_all::<F>(entries).await?;
        i += k;
    }
    Ok(())
}
