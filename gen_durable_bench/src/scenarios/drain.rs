//! The `drain` and `five_step` scenarios: one engine drains a backlog of one- or five-step rows.

use std::collections::BTreeMap;
use std::time::Duration;

use gen_durable::prelude::*;
use serde_json::Map;

use super::tracker::{start_engine, Tracker};
use super::{insert_chunks_with, scalar_i64, statements, EngineCfg, R};
use crate::fsms::{reset_probe, Five, Noop, PROBE};
use crate::rss::RssSampler;
use crate::{hook, Bench, Report};
use gen_durable::{Gate, InsertOptions, LimitKey, RateLimit};
use gen_durable_testkit::statements::{by_kind, KindCount};

/// `drain` (single-step no-ops) or `five_step` (five `next` steps each): inserts the
/// backlog, then starts one engine and times from the first step to the last commit.
pub(super) async fn drain(b: &Bench, cfg: &EngineCfg, five: bool) -> R<Report> {
    let backlog = Backlog::new(b, five);
    drain_backlog(b, cfg, backlog).await
}

/// Flow control on every row of a single-step drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    None,
    /// One hot key of a gate of K = 256 (above the engine's 256 + 256 in flight only when
    /// the defaults change): what the gate costs when it is not the bottleneck.
    Gate,
    /// One bucket of a rate limit with tokens to spare: what admission costs.
    Rate,
}

/// `drain_gated` / `drain_rate_limited`: the `drain` backlog, every row under `flow`.
pub(super) async fn drain_with(b: &Bench, cfg: &EngineCfg, flow: Flow) -> R<Report> {
    let backlog = Backlog {
        flow,
        ..Backlog::new(b, false)
    };
    drain_backlog(b, cfg, backlog).await
}

async fn drain_backlog(b: &Bench, cfg: &EngineCfg, backlog: Backlog) -> R<Report> {
    backlog.insert(b).await?;
    hook::run(b.args.before_drain.as_deref(), "before-drain", backlog.n)?;
    reset_probe(true);
    // From here on the process holds the engine, not the inserted backlog.
    let rss = RssSampler::start();
    let pool = b.logged_pool(cfg.pool).await?;
    let tracker = Tracker::new(backlog.n as u64);
    b.log.take();
    let engine = start_engine(&pool, cfg, &tracker).await?;
    let waited = tracker.wait_done(backlog.limit(b)).await;
    let mut memory = Map::new();
    rss.finish(&mut memory).await;
    if waited.is_ok() {
        hook::run(b.args.after_drain.as_deref(), "after-drain", backlog.n)?;
    }
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
    let mut r = backlog
        .report(b, cfg, &tracker, &counts, secs, runs)
        .await?;
    r.extra.extend(memory);
    Ok(r)
}

/// The backlog of a drain: `n` rows of `Noop` (`drain`) or `Five` (`five_step`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Backlog {
    pub(super) n: usize,
    pub(super) five: bool,
    pub(super) flow: Flow,
}

impl Backlog {
    /// The scenario's size: `--n`, else 20,000 for `drain` and 5,000 for `five_step`.
    pub(super) fn new(b: &Bench, five: bool) -> Self {
        let n = b.args.n.unwrap_or(match (b.smoke(), five) {
            (true, _) => 200,
            (false, false) => 20_000,
            (false, true) => 5_000,
        });
        Backlog {
            n,
            five,
            flow: Flow::None,
        }
    }

    /// Steps to run: five per instance for `five_step`.
    pub(super) fn steps(&self) -> u64 {
        (self.n * if self.five { 5 } else { 1 }) as u64
    }

    /// How long the drain may take.
    pub(super) fn limit(&self, b: &Bench) -> Duration {
        Duration::from_secs(if b.smoke() { 30 } else { 300 })
    }

    /// An empty table, then the backlog, inserted and vacuumed.
    pub(super) async fn insert(&self, b: &Bench) -> R<()> {
        b.clean().await?;
        let client = Client::new(b.quiet.clone());
        let opts = match self.flow {
            Flow::None => InsertOptions::default(),
            Flow::Gate => {
                client.set_gate("bench_hot", Gate::new(256)).await?;
                InsertOptions::default().gate(LimitKey::global("bench_hot"))
            }
            Flow::Rate => {
                let plenty = RateLimit::per(1_000_000_000, Duration::from_secs(1));
                client.set_rate_limit("bench_plenty", plenty).await?;
                InsertOptions::default().rate_limit("bench_plenty")
            }
        };
        if self.five {
            insert_chunks_with::<Five>(&client, self.n, 0, &opts).await?;
        } else {
            insert_chunks_with::<Noop>(&client, self.n, 0, &opts).await?;
        }
        sqlx::query("VACUUM ANALYZE gd_instances")
            .execute(&b.quiet)
            .await?;
        Ok(())
    }

    /// Checks the drained table against the tracker (every instance done exactly once
    /// with the expected state, `runs` step runs in all) and makes the report of `secs`.
    pub(super) async fn report(
        &self,
        b: &Bench,
        cfg: &EngineCfg,
        tracker: &Tracker,
        counts: &BTreeMap<&'static str, KindCount>,
        secs: f64,
        runs: u64,
    ) -> R<Report> {
        let (n, five, steps) = (self.n, self.five, self.steps());
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
        if crate::schema_experiment().is_none() && (ok != n as i64 || all != n as i64) {
            return Err(format!(
                "expected {n} rows done with the expected state; {ok} of {all} are"
            )
            .into());
        }
        let mut extra = Map::new();
        extra.insert("config".into(), cfg.json());
        extra.insert("instances".into(), json!(n));
        extra.insert("steps".into(), json!(steps));
        extra.insert(
            "unit".into(),
            json!(if five { "steps/s" } else { "instances/s" }),
        );
        let spr = statements(counts, steps, &mut extra);
        tracker.commit_stats(&mut extra);
        let lat = std::mem::take(&mut *tracker.latencies_ms.lock().expect("lat"));
        extra.insert("latency".into(), json!("step start -> outcome committed"));
        let p = (lat.percentile(0.5), lat.percentile(0.99));
        Ok(Report::with_percentiles(steps, secs, p, spr, extra))
    }
}
