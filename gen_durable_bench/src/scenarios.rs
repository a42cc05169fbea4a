//! The scenarios. Each one starts from an empty table, measures, then checks its own
//! result and fails loudly (an `Err`) if any instance is not `done` exactly once with
//! the expected state.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gen_durable::prelude::*;
use gen_durable::{Entry, Event, QueueConfig};
use serde_json::{Map, Value};
use sqlx::PgPool;
use tokio::sync::{mpsc, Notify};

use crate::fsms::{reset_probe, FanParent, Five, Noop, Waiter, PROBE};
use crate::{Bench, BoxError, Report};
use gen_durable_testkit::statements::{by_kind, KindCount};

type R<T> = Result<T, BoxError>;

/// Runs scenario `name`; most give one report, `drain_sweep` one per setting.
pub(crate) async fn run(b: &Bench, name: &str) -> R<Vec<Report>> {
    eprintln!("scenario {name}");
    Ok(match name {
        "insert" => vec![insert(b).await?],
        "insert_all" => vec![insert_all(b).await?],
        "drain" => vec![drain(b, &EngineCfg::from_args(b), false).await?],
        "five_step" => vec![drain(b, &EngineCfg::from_args(b), true).await?],
        "signal_latency" => vec![signal_latency(b).await?],
        "fan_out" => vec![fan_out(b).await?],
        "pick_1m" => vec![pick_1m(b).await?],
        "drain_sweep" => drain_sweep(b).await?,
        other => return Err(format!("unknown scenario {other}").into()),
    })
}

/// Engine settings under test.
#[derive(Debug, Clone)]
pub(crate) struct EngineCfg {
    concurrency: usize,
    prefetch: usize,
    min_demand: usize,
    commit_batch: usize,
    pool: u32,
}

impl EngineCfg {
    fn from_args(b: &Bench) -> Self {
        EngineCfg {
            concurrency: b.args.concurrency,
            prefetch: b.args.prefetch,
            min_demand: b.args.min_demand,
            commit_batch: b.args.commit_batch,
            pool: b.args.pool,
        }
    }
    fn json(&self) -> Value {
        json!({ "concurrency": self.concurrency, "prefetch": self.prefetch, "min_demand": self.min_demand,
                "commit_batch": self.commit_batch, "pool": self.pool })
    }
}

/// Follows committed outcomes through the engine's telemetry.
#[derive(Debug, Default)]
struct Tracker {
    target_done: AtomicU64,
    done: AtomicU64,
    steps: AtomicU64,
    lost: AtomicU64,
    commits: AtomicU64,
    committed: AtomicU64,
    commit_ms: Mutex<Vec<f64>>,
    /// Sums of the queue's in-flight steps and buffered rows over its saturation events.
    saturation: Mutex<(u64, u64, u64)>,
    last: Mutex<Option<Instant>>,
    latencies_ms: Mutex<Vec<f64>>,
    done_ids: Mutex<HashMap<i64, u32>>,
    first_schedule: Mutex<Option<Instant>>,
    notify: Notify,
}

impl Tracker {
    fn new(target_done: u64) -> Arc<Self> {
        let t = Tracker::default();
        t.target_done.store(target_done, Ordering::Relaxed);
        Arc::new(t)
    }

    fn on(&self, e: &Event) {
        match e {
            Event::StepStop { id, kind, .. } => {
                let now = Instant::now();
                self.steps.fetch_add(1, Ordering::Relaxed);
                *self.last.lock().expect("last") = Some(now);
                let start = PROBE
                    .lock()
                    .expect("probe")
                    .as_mut()
                    .and_then(|p| p.starts.remove(id));
                if let Some(s) = start {
                    self.latencies_ms
                        .lock()
                        .expect("lat")
                        .push((now - s).as_secs_f64() * 1e3);
                }
                if *kind == "schedule_childs" {
                    self.first_schedule
                        .lock()
                        .expect("sched")
                        .get_or_insert(now);
                }
                if *kind == "done" {
                    *self.done_ids.lock().expect("ids").entry(*id).or_default() += 1;
                    let d = self.done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d >= self.target_done.load(Ordering::Relaxed) {
                        self.notify.notify_one();
                    }
                }
            }
            Event::LeaseLost { .. } => {
                self.lost.fetch_add(1, Ordering::Relaxed);
            }
            Event::SchedulerSaturation {
                in_flight, buffer, ..
            } => {
                let mut g = self.saturation.lock().expect("saturation");
                g.0 += 1;
                g.1 += *in_flight as u64;
                g.2 += *buffer as u64;
            }
            Event::CommitStop {
                committed,
                duration,
                ..
            } => {
                self.commit_ms
                    .lock()
                    .expect("commit_ms")
                    .push(duration.as_secs_f64() * 1e3);
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.committed
                    .fetch_add(*committed as u64, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    async fn wait_done(&self, limit: Duration) -> R<()> {
        let deadline = tokio::time::Instant::now() + limit;
        while self.done.load(Ordering::Relaxed) < self.target_done.load(Ordering::Relaxed) {
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                return Err(format!(
                    "timed out after {limit:?}: {} of {} instances done",
                    self.done.load(Ordering::Relaxed),
                    self.target_done.load(Ordering::Relaxed)
                )
                .into());
            }
        }
        Ok(())
    }

    /// Outcomes per group commit, from the engine's `commit.stop` events.
    fn commit_stats(&self, extra: &mut Map<String, Value>) {
        let commits = self.commits.load(Ordering::Relaxed);
        if commits > 0 {
            let avg = self.committed.load(Ordering::Relaxed) as f64 / commits as f64;
            extra.insert("commits".into(), json!(commits));
            extra.insert(
                "outcomes_per_commit".into(),
                json!((avg * 10.0).round() / 10.0),
            );
            let (n, f, b) = *self.saturation.lock().expect("saturation");
            if let (Some(f), Some(b)) = (f.checked_div(n), b.checked_div(n)) {
                extra.insert("mean_in_flight".into(), json!(f));
                extra.insert("mean_buffer".into(), json!(b));
            }
            let mut ms = std::mem::take(&mut *self.commit_ms.lock().expect("commit_ms"));
            extra.insert("commit_p50_ms".into(), json!(percentile(&mut ms, 0.5)));
        }
    }

    /// Every id done exactly once, and no lease lost.
    fn check_exactly_once(&self, expected: usize) -> R<()> {
        let ids = self.done_ids.lock().expect("ids");
        let twice: Vec<_> = ids.iter().filter(|(_, n)| **n != 1).take(5).collect();
        if ids.len() != expected || !twice.is_empty() {
            return Err(format!(
                "expected {expected} instances done once each; {} done, some more than once: {twice:?}",
                ids.len()
            )
            .into());
        }
        let lost = self.lost.load(Ordering::Relaxed);
        if lost > 0 {
            return Err(format!("{lost} leases lost during the run").into());
        }
        Ok(())
    }
}

async fn start_engine(pool: &PgPool, cfg: &EngineCfg, tracker: &Arc<Tracker>) -> R<Engine> {
    let t = tracker.clone();
    Ok(Engine::builder(pool.clone())
        .queue_with(
            "bench",
            QueueConfig::new(cfg.concurrency)
                .prefetch(cfg.prefetch)
                .min_demand(cfg.min_demand.clamp(1, cfg.concurrency + cfg.prefetch)),
        )
        .commit_batch(cfg.commit_batch)
        .on_event(move |e| t.on(e))
        .start()
        .await?)
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

async fn scalar_i64(pool: &PgPool, sql: &str) -> R<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

async fn insert_chunks<F: Fsm<State = crate::fsms::BenchState>>(
    client: &Client,
    n: usize,
    n_field: i64,
) -> R<()> {
    let mut i = 0;
    while i < n {
        let k = (n - i).min(20_000);
        let entries: Vec<Entry<F>> = (i..i + k)
            .map(|j| {
                Entry::new(crate::fsms::BenchState {
                    i: j as i64,
                    n: n_field,
                })
            })
            .collect();
        client.insert_all::<F>(entries).await?;
        i += k;
    }
    Ok(())
}

/// `insert`: single inserts from 8 concurrent callers.
///
/// Two passes: 1,000 inserts on a pool whose statements are counted, then the timed
/// pass on one whose statements are not logged — sqlx formats the text of every logged
/// statement (`sqlformat`), client work that pgbench, the baseline, doesn't do.
async fn insert(b: &Bench) -> R<Report> {
    let n = if b.smoke() { 200 } else { 20_000 };
    let counted = n.min(1_000);
    let callers = 8;
    b.clean().await?;

    let pool = b.pool(callers as u32, true).await?;
    let client = Client::new(pool.clone());
    single_inserts(&client, callers, 0..callers, -1).await?; // warm every connection
    b.log.take();
    single_inserts(&client, callers, 0..counted, 0).await?;
    let counts = by_kind(&b.log.take());
    pool.close().await;

    let pool = b.pool(callers as u32, false).await?;
    let client = Client::new(pool.clone());
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
                let state = crate::fsms::BenchState {
                    i: if warm < 0 { warm } else { j as i64 },
                    n: 0,
                };
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

/// `insert_all`: 20,000 rows per call.
async fn insert_all(b: &Bench) -> R<Report> {
    let (calls, per_call) = if b.smoke() { (2, 200) } else { (5, 20_000) };
    b.clean().await?;
    let pool = b.logged_pool(2).await?;
    let client = Client::new(pool.clone());
    client
        .insert_all::<Noop>(vec![
            Entry::new(crate::fsms::BenchState { i: -1, n: 0 }).queue("warm")
        ])
        .await?;
    b.log.take();
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for c in 0..calls {
        let entries: Vec<Entry<Noop>> = (0..per_call)
            .map(|j| {
                Entry::new(crate::fsms::BenchState {
                    i: (c * per_call + j) as i64,
                    n: 0,
                })
            })
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

/// `drain` (single-step no-ops) or `five_step` (five `next` steps each): inserts the
/// backlog, then starts one engine and times from the first step to the last commit.
async fn drain(b: &Bench, cfg: &EngineCfg, five: bool) -> R<Report> {
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

/// `drain_sweep`: the drain under several engine settings, to choose the defaults.
async fn drain_sweep(b: &Bench) -> R<Vec<Report>> {
    let mut out = Vec::new();
    // (concurrency, prefetch, min_demand, commit_batch, pool)
    let settings: &[(usize, usize, usize, usize, u32)] = if b.smoke() {
        &[(8, 0, 1, 512, 4), (16, 16, 16, 512, 8)]
    } else {
        &[
            (32, 32, 32, 512, 10),
            (64, 0, 32, 512, 10),
            (64, 64, 64, 512, 10),
            (64, 64, 64, 512, 20),
            (128, 128, 128, 512, 20),
            (128, 128, 64, 512, 20),
            (256, 256, 256, 1024, 20),
        ]
    };
    for &(concurrency, prefetch, min_demand, commit_batch, pool) in settings {
        let cfg = EngineCfg {
            concurrency,
            prefetch,
            min_demand,
            commit_batch,
            pool,
        };
        out.push(drain(b, &cfg, false).await?);
    }
    Ok(out)
}

/// `signal_latency`: an idle engine, instances parked on `go`; time from the `signal()`
/// call to the woken step starting.
async fn signal_latency(b: &Bench) -> R<Report> {
    let samples = if b.smoke() { 10 } else { 200 };
    b.clean().await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    reset_probe(false);
    PROBE.lock().expect("probe").as_mut().expect("probe").woken = Some(tx);
    let pool = b.logged_pool(b.args.pool).await?;
    let tracker = Tracker::new(samples as u64);
    let cfg = EngineCfg::from_args(b);
    let engine = start_engine(&pool, &cfg, &tracker).await?;
    let client = Client::new(pool.clone());
    let entries: Vec<Entry<Waiter>> = (0..samples)
        .map(|i| Entry::new(crate::fsms::BenchState { i: i as i64, n: 0 }))
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

/// `fan_out`: one parent, 10,000 children, the parent's fan-in step; from insert to the
/// parent's `done`.
async fn fan_out(b: &Bench) -> R<Report> {
    let children = b.args.n.unwrap_or(if b.smoke() { 100 } else { 10_000 });
    b.clean().await?;
    reset_probe(false);
    let pool = b.logged_pool(b.args.pool).await?;
    // Children and the parent: n + 1 instances end done.
    let tracker = Tracker::new(children as u64 + 1);
    let cfg = EngineCfg::from_args(b);
    let engine = start_engine(&pool, &cfg, &tracker).await?;
    let client = Client::new(b.quiet.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.log.take();
    let t0 = Instant::now();
    let parent = client
        .insert::<FanParent>(crate::fsms::BenchState {
            i: 0,
            n: children as i64,
        })
        .await?;
    let waited = tracker
        .wait_done(Duration::from_secs(if b.smoke() { 30 } else { 300 }))
        .await;
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

/// Finds a node in an EXPLAIN (FORMAT JSON) plan tree.
fn find_nodes<'a>(plan: &'a Value, pred: &dyn Fn(&Value) -> bool, out: &mut Vec<&'a Value>) {
    if pred(plan) {
        out.push(plan);
    }
    if let Some(kids) = plan.get("Plans").and_then(Value::as_array) {
        for k in kids {
            find_nodes(k, pred, out);
        }
    }
}

/// Runs the engine briefly so the counter captures the exact SQL of its hot statements.
async fn capture_statements(b: &Bench) -> R<()> {
    b.clean().await?;
    reset_probe(false);
    let pool = b.logged_pool(4).await?;
    let client = Client::new(pool.clone());
    insert_chunks::<Five>(&client, 10, 0).await?;
    let w = client
        .insert::<Waiter>(crate::fsms::BenchState { i: 0, n: 0 })
        .await?;
    let tracker = Tracker::new(10);
    let engine = start_engine(&pool, &EngineCfg::from_args(b), &tracker).await?;
    tracker.wait_done(Duration::from_secs(30)).await?;
    loop {
        let st: String = sqlx::query_scalar("SELECT status::text FROM gd_instances WHERE id = $1")
            .bind(w)
            .fetch_one(&b.quiet)
            .await?;
        if st == "awaiting_signal" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.signal(w, "go", json!({})).await?;
    engine.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    b.log.take();
    Ok(())
}

/// Calls `gd_commit_outcomes` with a `next` outcome for each claimed row, with
/// auto_explain on for its nested statements, and returns their plans.
async fn explain_commit(
    tx: &mut sqlx::PgConnection,
    b: &Bench,
    apply_sql: &str,
    claimed: &[(i64, i64)],
) -> R<String> {
    for set in [
        "LOAD 'auto_explain'",
        "SET LOCAL auto_explain.log_min_duration = 0",
        "SET LOCAL auto_explain.log_analyze = on",
        "SET LOCAL auto_explain.log_buffers = on",
        "SET LOCAL auto_explain.log_nested_statements = on",
        "SET LOCAL auto_explain.log_level = notice",
    ] {
        sqlx::query(set).execute(&mut *tx).await?;
    }
    let k = claimed.len();
    b.log.take_notices();
    let r = sqlx::query(apply_sql)
        .bind("explain-node")
        .bind(claimed.iter().map(|c| c.0).collect::<Vec<_>>())
        .bind(claimed.iter().map(|c| c.1).collect::<Vec<_>>())
        .bind(vec!["next"; k])
        .bind(vec![Some("run"); k])
        .bind(vec![json!({"i": 1}); k])
        .bind(vec![None::<Value>; k])
        .bind(vec![None::<String>; k])
        .bind(vec![None::<i64>; k])
        .bind(vec![None::<String>; k])
        .bind(vec![0i32; k])
        .bind(vec![false; k])
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .bind(vec!["bench"])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .execute(&mut *tx)
        .await;
    sqlx::query("SET LOCAL auto_explain.log_min_duration = -1")
        .execute(&mut *tx)
        .await?;
    r?;
    Ok(b.log.take_notices().join("\n"))
}

async fn explain_text(
    tx: &mut sqlx::PgConnection,
    sql: &str,
    bind: impl FnOnce(
        sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> R<String> {
    let q = format!("EXPLAIN (ANALYZE, BUFFERS) {sql}");
    let rows: Vec<String> = {
        let query = bind(sqlx::query(&q));
        use sqlx::Row;
        query
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.get::<String, _>(0))
            .collect()
    };
    Ok(rows.join("\n"))
}

/// `pick_1m`: 1,000,000 rows, 200,000 of them runnable; EXPLAIN (ANALYZE, BUFFERS) of the
/// engine's claim statement (captured from the engine itself), plus the group commit (its
/// inner statements through auto_explain) and a signal delivery on the same table,
/// printed to stderr. Everything rolls back.
async fn pick_1m(b: &Bench) -> R<Report> {
    let (rows, runnable_every) = if b.smoke() {
        (10_000, 5)
    } else {
        (1_000_000, 5)
    };
    capture_statements(b).await?;
    let claim_sql = b.log.text("claim").ok_or("the claim was not captured")?;
    let apply_sql = b.log.text("apply").ok_or("the apply was not captured")?;
    let signal_sql = b
        .log
        .text("signal")
        .ok_or("the delivery was not captured")?;
    b.clean().await?;
    let t = Instant::now();
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, eligible_at, updated_at)
         SELECT 'Noop', 1, 'run', jsonb_build_object('i', g), 'bench',
                (CASE WHEN g % $2 = 0 THEN 'runnable' ELSE 'done' END)::gd_status,
                now() - interval '1 hour' + g * interval '1 millisecond', now()
           FROM generate_series(1, $1::int8) g",
    )
    .bind(rows as i64)
    .bind(runnable_every as i64)
    .execute(&b.quiet)
    .await?;
    sqlx::query("VACUUM ANALYZE gd_instances")
        .execute(&b.quiet)
        .await?;
    eprintln!(
        "pick_1m: {rows} rows loaded in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let runnable = scalar_i64(
        &b.quiet,
        "SELECT count(*) FROM gd_instances WHERE status = 'runnable'",
    )
    .await?;
    if runnable < rows as i64 / 5 {
        return Err(format!("only {runnable} runnable rows").into());
    }
    let names = vec!["Noop".to_string()];
    let versions = vec![1i32];
    let mut exec_ms: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    let mut index_scan = true;
    let mut stops_at_batch = true;
    let mut shared_hit = 0i64;
    for batch in [1i64, 100, 512] {
        for _ in 0..3 {
            let mut tx = b.quiet.begin().await?;
            let plan: Value = sqlx::query_scalar(&format!(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim_sql}"
            ))
            .bind("bench")
            .bind(&names)
            .bind(&versions)
            .bind(batch)
            .bind("explain-node")
            .bind(30_000i64)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            .fetch_one(&mut *tx)
            .await?;
            tx.rollback().await?;
            let top = &plan[0];
            exec_ms
                .entry(batch)
                .or_default()
                .push(top["Execution Time"].as_f64().unwrap_or(f64::NAN));
            let mut scans = Vec::new();
            find_nodes(
                &top["Plan"],
                &|n| n["Index Name"].as_str() == Some("gd_instances_pick"),
                &mut scans,
            );
            let scan = scans.first();
            index_scan &= scan.is_some_and(|s| {
                s["Node Type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("Index"))
            });
            // The pick scan reads the index in order and stops at the batch: it returns
            // at most `batch` rows (fewer only if rows were skipped as locked).
            stops_at_batch &= scan.is_some_and(|s| {
                s["Actual Rows"].as_f64().unwrap_or(f64::MAX)
                    * s["Actual Loops"].as_f64().unwrap_or(1.0)
                    <= batch as f64
            });
            if batch == 100 {
                shared_hit = top["Plan"]["Shared Hit Blocks"].as_i64().unwrap_or(-1);
            }
        }
    }

    // The text plans of the hot statements, for PERFORMANCE.md.
    let mut tx = b.quiet.begin().await?;
    let plan = explain_text(&mut tx, &claim_sql, |q| {
        q.bind("bench")
            .bind(names.clone())
            .bind(versions.clone())
            .bind(100i64)
            .bind("explain-node")
            .bind(30_000i64)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
    })
    .await?;
    eprintln!("---- EXPLAIN claim (batch 100, {rows} rows, {runnable} runnable)\n{plan}");
    // Claim 100 for real (inside this transaction), then commit them as `next`.
    let claimed: Vec<(i64, i64)> = {
        use sqlx::Row;
        sqlx::query(&claim_sql)
            .bind("bench")
            .bind(&names)
            .bind(&versions)
            .bind(100i64)
            .bind("explain-node")
            .bind(30_000i64)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| (r.get::<i64, _>("id"), r.get::<i64, _>("lease_epoch")))
            .collect()
    };
    if !claimed.is_empty() {
        // The group commit is a function: its statements' plans come from auto_explain,
        // as notices (a superuser may LOAD it; otherwise say so and go on).
        let plans = explain_commit(&mut tx, b, &apply_sql, &claimed)
            .await
            .unwrap_or_else(|e| format!("(could not EXPLAIN the commit: {e})"));
        eprintln!(
            "---- EXPLAIN commit of {} `next` outcomes (gd_commit_outcomes, via auto_explain)\n{plans}",
            claimed.len()
        );
    }
    tx.rollback().await?;
    let mut tx = b.quiet.begin().await?;
    let target = scalar_i64(
        &b.quiet,
        "SELECT id FROM gd_instances WHERE status = 'runnable' ORDER BY id DESC LIMIT 1",
    )
    .await?;
    let plan = explain_text(&mut tx, &signal_sql, |q| {
        q.bind(target)
            .bind("go")
            .bind(json!({}))
            .bind(None::<String>)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
    })
    .await?;
    eprintln!("---- EXPLAIN signal delivery\n{plan}");
    tx.rollback().await?;

    let mut v100 = exec_ms.get(&100).cloned().unwrap_or_default();
    let med = percentile(&mut v100, 0.5).unwrap_or(f64::NAN);
    let mut extra = Map::new();
    extra.insert("runnable".into(), json!(runnable));
    extra.insert("batch".into(), json!(100));
    extra.insert(
        "exec_ms_by_batch".into(),
        json!(exec_ms
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                (k.to_string(), json!(percentile(&mut v, 0.5)))
            })
            .collect::<Map<String, Value>>()),
    );
    extra.insert("index_scan_on_gd_instances_pick".into(), json!(index_scan));
    extra.insert("stops_at_batch".into(), json!(stops_at_batch));
    extra.insert("shared_hit_blocks".into(), json!(shared_hit));
    extra.insert(
        "unit".into(),
        json!("rows claimed/s by one claim statement of 100 (plan execution time)"),
    );
    if !index_scan || !stops_at_batch {
        return Err(format!(
            "the claim is not O(batch) at {rows} rows: index scan on gd_instances_pick {index_scan}, stops at the batch {stops_at_batch}"
        )
        .into());
    }
    Ok(Report {
        n: rows as u64,
        secs: med / 1e3,
        per_s: 100.0 / (med / 1e3),
        p50_ms: Some(med),
        p99_ms: percentile(&mut v100, 0.99),
        statements_per_step: Some(1.0),
        extra,
    })
}
