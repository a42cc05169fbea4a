//! `--processes N[,N…]`: `drain`, `five_step` and `drain_gated` with their engines in N worker processes
//! on the one database, instead of one engine in the harness's own process.
//!
//! The parent inserts the backlog exactly as the in-process scenario does (an empty table,
//! then the rows, then `VACUUM ANALYZE`), takes `LOCK TABLE gd_instances, gd_lanes IN
//! EXCLUSIVE MODE` in a transaction it keeps open (a claim of the ready log starts by
//! locking its lanes' rows; a claim of keyed rows, by reading `gd_instances` for update), and only then spawns N copies of its own binary
//! (`--worker K`, same engine flags: concurrency, prefetch, min_demand, commit_batch and
//! pool are *per process*). Each worker starts one engine, as the in-process scenario
//! does, and says `ready`; its first claim then waits on the lock. Once the claims of all
//! N workers are seen waiting (`pg_stat_activity`, by the workers' `application_name`),
//! the parent rolls its transaction back: the work is released to N started engines at
//! the same instant, with the same backlog in place as in the in-process run, so neither
//! process start-up nor a stagger between workers is timed.
//!
//! `secs` is the span the in-process scenario times: from the first step started in any
//! worker to the last step committed in any worker, read from each worker's wall clock
//! (one host, one clock). `released_to_first_step_ms` is the first claim's wait after the
//! release, outside that span. Every N, 1 included, runs in worker processes, so the
//! counts of one curve compare like with like; `--processes 1` is one worker process, not
//! the in-process run (which differs only by the pipe that reports progress).
//!
//! The protocol is lines on the worker's stdout: `ready`, then `done K` as its count of
//! finished instances grows, then `tally {json}` (its counts, ids, latencies, statements
//! by kind) once its stdin closes, which is how the parent stops it. A worker whose
//! stdout ends early fails the run with its stderr; on any failure the parent kills and
//! reaps every worker, and a worker whose parent dies sees its stdin close and stops.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::ConnectOptions;
use tokio::sync::{mpsc, oneshot};

use super::drain::{Backlog, Flow};
use super::latencies::Latencies;
use super::tracker::{start_engine, Tracker};
use super::{scalar_i64, EngineCfg, R};
use crate::fsms::{reset_probe, PROBE};
use crate::rss::RssSampler;
use crate::{median_report, Args, Bench, Report};
use gen_durable_testkit::statements::{by_kind, KindCount, StatementLog, MARKED_KINDS};

/// The `application_name` of worker K's connections: `gd_bench_worker_K`.
const APP: &str = "gd_bench_worker_";

/// Runs `name` (`drain`, `five_step` or `drain_gated`) with the engines in each count of worker processes
/// of `--processes`, in turn, `--runs` times: `1,2,4` with 3 runs is 1,2,4, 1,2,4, 1,2,4.
/// `emit` gets each run's report, then (with several runs) each count's median report
/// with the number of runs. `scaling` is `per_s` over that of the first count of the
/// list: of the same round on a run's line, of the medians on a median line.
pub(crate) async fn curve(
    b: &Bench,
    name: &str,
    emit: &mut dyn FnMut(&Report, Option<usize>),
) -> R<()> {
    let backlog = match name {
        "drain" => Backlog::new(b, false),
        "five_step" => Backlog::new(b, true),
        // Every process's engine on one hot key of the gate (K = 256 across them all).
        "drain_gated" => Backlog {
            flow: Flow::Gate,
            ..Backlog::new(b, false)
        },
        other => {
            return Err(
                format!("--processes runs drain, five_step and drain_gated, not {other}").into(),
            )
        }
    };
    if b.args.pooler_url.is_some() || b.args.listener.is_some() {
        return Err("--processes does not pass --pooler-url or --listener to its workers".into());
    }
    let counts = &b.args.processes;
    let cfg = EngineCfg::from_args(b);
    let runs = b.args.runs.max(1);
    let mut by_count: Vec<Vec<Report>> = vec![Vec::new(); counts.len()];
    for run in 1..=runs {
        let mut base = None;
        for (k, &procs) in counts.iter().enumerate() {
            eprintln!("scenario {name}: {procs} processes, run {run} of {runs}");
            let mut r = drain_in(b, &cfg, backlog, procs).await?;
            let base = *base.get_or_insert(r.per_s);
            r.extra.insert("run".into(), json!(run));
            r.extra
                .insert("scaling".into(), json!(round3(r.per_s / base)));
            emit(&r, None);
            by_count[k].push(r);
        }
    }
    if runs > 1 {
        let medians: Vec<Report> = by_count.iter().map(|rs| median_report(rs)).collect();
        for mut m in medians.clone() {
            m.extra.remove("run");
            m.extra
                .insert("scaling".into(), json!(round3(m.per_s / medians[0].per_s)));
            emit(&m, Some(runs));
        }
    }
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

/// One drain of `backlog` by `procs` worker processes; see the module's doc.
async fn drain_in(b: &Bench, cfg: &EngineCfg, backlog: Backlog, procs: usize) -> R<Report> {
    backlog.insert(b).await?;
    let mut lock = b.quiet.begin().await?;
    sqlx::query("LOCK TABLE gd_instances, gd_lanes IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await?;
    let mut w = Workers::spawn(&b.args, procs)?;

    // Every engine started, and its first claim waiting on the lock.
    let start = Instant::now() + Duration::from_secs(60);
    let mut ready = 0;
    while ready < procs {
        match w.next(start).await? {
            Some((_, Line::Ready)) => ready += 1,
            Some((i, line)) => return Err(line.unexpected(i)),
            None => return Err("timed out waiting for the workers to start".into()),
        }
    }
    let waiting = format!(
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name LIKE '{APP}%'
           AND wait_event_type = 'Lock'
           AND (query LIKE '/* gd:claim */%' OR query LIKE '/* gd:advance */%')"
    );
    while scalar_i64(&b.quiet, &waiting).await? < procs as i64 {
        let poll = (Instant::now() + Duration::from_millis(2)).min(start);
        if let Some((i, line)) = w.next(poll).await? {
            return Err(line.unexpected(i));
        }
        if Instant::now() >= start {
            return Err("timed out waiting for the workers' first claims".into());
        }
    }

    let released = unix_ns(Instant::now());
    lock.rollback().await?;
    let deadline = Instant::now() + backlog.limit(b);
    let mut done = vec![0u64; procs];
    while done.iter().sum::<u64>() < backlog.n as u64 {
        match w.next(deadline).await? {
            Some((i, Line::Done(k))) => done[i] = k,
            Some((i, line)) => return Err(line.unexpected(i)),
            None => {
                return Err(format!(
                    "timed out after {:?}: {} of {} instances done",
                    backlog.limit(b),
                    done.iter().sum::<u64>(),
                    backlog.n
                )
                .into())
            }
        }
    }

    // Stop the workers: each shuts its engine down and sends its tally.
    w.stdins.clear();
    let end = Instant::now() + Duration::from_secs(60);
    let mut tallies: Vec<Option<Tally>> = (0..procs).map(|_| None).collect();
    while tallies.iter().any(Option::is_none) {
        match w.next(end).await? {
            Some((i, Line::Tally(t))) => tallies[i] = Some(*t),
            Some((_, Line::Done(_))) => {}
            Some((i, line)) => return Err(line.unexpected(i)),
            None => return Err("timed out waiting for the workers' tallies".into()),
        }
    }
    w.reap(end).await?;
    let tallies: Vec<Tally> = tallies.into_iter().flatten().collect();

    // One tracker and one statement count for all the workers, checked and reported as
    // the in-process drain is.
    let tracker = Tracker::new(backlog.n as u64);
    let mut counts: BTreeMap<&'static str, KindCount> = BTreeMap::new();
    let (mut first, mut last, mut runs) = (u64::MAX, 0, 0);
    for t in &tallies {
        first = first.min(t.first_ns.unwrap_or(u64::MAX));
        last = last.max(t.last_ns.unwrap_or(0));
        runs += t.runs;
        t.add_to(&tracker, &mut counts);
    }
    if first == u64::MAX || last < first {
        return Err("no step ran".into());
    }
    let secs = (last - first) as f64 / 1e9;
    let mut r = backlog
        .report(b, cfg, &tracker, &counts, secs, runs)
        .await?;
    r.extra.insert("processes".into(), json!(procs));
    // Each worker's own figures, in worker order: the engines' memory, not the parent's.
    for field in ["rss_start_mb", "rss_peak_mb", "rss_end_mb"] {
        let per: Vec<&Value> = tallies.iter().map(|t| &t.rss[field]).collect();
        r.extra.insert(format!("worker_{field}"), json!(per));
    }
    r.extra.insert(
        "steps_per_process".into(),
        json!(tallies.iter().map(|t| t.steps).collect::<Vec<_>>()),
    );
    r.extra.insert(
        "released_to_first_step_ms".into(),
        json!(round3(first.saturating_sub(released) as f64 / 1e6)),
    );
    Ok(r)
}

/// What a worker sends back at the end: its tracker's counts, and its statements.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Tally {
    /// Unix time (ns) of its first step's start and of its last step's commit.
    first_ns: Option<u64>,
    last_ns: Option<u64>,
    /// Step runs (the probe), and `step.stop` events.
    runs: u64,
    steps: u64,
    lost: u64,
    commits: u64,
    committed: u64,
    commit_ms: Vec<f64>,
    saturation: (u64, u64, u64),
    latencies_ms: Latencies,
    /// `(id, times done)` of every instance it finished.
    done_ids: Vec<(i64, u32)>,
    /// `(kind, statements, rows returned, rows affected)`.
    statements: Vec<(String, u64, u64, u64)>,
    /// Its resident memory from engine start to the end of the drain (`rss_start_mb`,
    /// `rss_peak_mb`, `rss_end_mb`).
    #[serde(default)]
    rss: Map<String, Value>,
}

impl Tally {
    fn of(tracker: &Tracker, counts: &BTreeMap<&'static str, KindCount>) -> Self {
        let (first, runs) = {
            let g = PROBE.lock().expect("probe");
            let p = g.as_ref().expect("probe set");
            (p.first_start, p.runs)
        };
        let take = |m: &std::sync::Mutex<Vec<f64>>| std::mem::take(&mut *m.lock().expect("ms"));
        Tally {
            first_ns: first.map(unix_ns),
            last_ns: tracker.last.lock().expect("last").map(unix_ns),
            runs,
            steps: tracker.steps.load(Ordering::Relaxed),
            lost: tracker.lost.load(Ordering::Relaxed),
            commits: tracker.commits.load(Ordering::Relaxed),
            committed: tracker.committed.load(Ordering::Relaxed),
            commit_ms: take(&tracker.commit_ms),
            saturation: *tracker.saturation.lock().expect("saturation"),
            latencies_ms: std::mem::take(&mut *tracker.latencies_ms.lock().expect("lat")),
            done_ids: tracker.done_ids.lock().expect("ids").iter().collect(),
            statements: counts
                .iter()
                .map(|(k, c)| {
                    (
                        k.to_string(),
                        c.statements,
                        c.rows_returned,
                        c.rows_affected,
                    )
                })
                .collect(),
            rss: Map::new(),
        }
    }

    /// Adds this worker's counts to the parent's tracker and statement counts.
    fn add_to(&self, tracker: &Tracker, counts: &mut BTreeMap<&'static str, KindCount>) {
        let add = |a: &std::sync::atomic::AtomicU64, v| a.fetch_add(v, Ordering::Relaxed);
        add(&tracker.steps, self.steps);
        add(&tracker.lost, self.lost);
        add(&tracker.commits, self.commits);
        add(&tracker.committed, self.committed);
        let mut ids = tracker.done_ids.lock().expect("ids");
        for (id, k) in &self.done_ids {
            ids.add(*id, *k);
        }
        tracker
            .commit_ms
            .lock()
            .expect("commit_ms")
            .extend(&self.commit_ms);
        tracker
            .latencies_ms
            .lock()
            .expect("lat")
            .merge(&self.latencies_ms);
        let mut s = tracker.saturation.lock().expect("saturation");
        s.0 += self.saturation.0;
        s.1 += self.saturation.1;
        s.2 += self.saturation.2;
        for (kind, n, returned, affected) in &self.statements {
            let c = counts.entry(static_kind(kind)).or_default();
            c.statements += n;
            c.rows_returned += returned;
            c.rows_affected += affected;
        }
    }
}

/// The `&'static str` of a statement kind a worker named.
fn static_kind(kind: &str) -> &'static str {
    const UNMARKED: &[&str] = &["type_lookup", "begin", "commit", "rollback", "listen"];
    MARKED_KINDS
        .iter()
        .chain(UNMARKED)
        .find(|k| **k == kind)
        .copied()
        .unwrap_or("other")
}

/// `at` as unix time in ns: the wall clock, which every process of the host shares.
fn unix_ns(at: Instant) -> u64 {
    let ago = Instant::now().saturating_duration_since(at);
    (SystemTime::now() - ago)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A line from a worker.
#[derive(Debug)]
enum Line {
    Ready,
    Done(u64),
    Tally(Box<Tally>),
    /// Anything else: a protocol error.
    Other(String),
    /// Its stdout closed.
    Closed,
}

impl Line {
    /// A line that should not come now.
    fn unexpected(self, worker: usize) -> crate::BoxError {
        match self {
            Line::Other(s) => format!("worker {worker} said {s:?}").into(),
            line => format!("worker {worker}: unexpected {line:?}").into(),
        }
    }
}

/// The worker processes of one drain. Dropped, it kills and reaps those still running.
#[derive(Debug)]
struct Workers {
    children: Vec<Child>,
    /// Closing a worker's stdin stops it.
    stdins: Vec<ChildStdin>,
    /// Each worker's stderr, read to its end by a thread.
    stderr: Vec<Option<JoinHandle<String>>>,
    tallied: Vec<bool>,
    lines: mpsc::UnboundedReceiver<(usize, Line)>,
}

impl Workers {
    /// Spawns `procs` workers: this binary with `--worker K` and the engine flags of `args`.
    fn spawn(args: &Args, procs: usize) -> R<Self> {
        let exe = std::env::current_exe()?;
        let (tx, lines) = mpsc::unbounded_channel();
        let mut w = Workers {
            children: Vec::new(),
            stdins: Vec::new(),
            stderr: Vec::new(),
            tallied: vec![false; procs],
            lines,
        };
        for i in 0..procs {
            let mut cmd = Command::new(&exe);
            cmd.arg("--worker").arg(i.to_string());
            for (flag, v) in [
                ("--concurrency", args.concurrency.to_string()),
                ("--prefetch", args.prefetch.to_string()),
                ("--min-demand", args.min_demand.to_string()),
                ("--commit-batch", args.commit_batch.to_string()),
                ("--pool", args.pool.to_string()),
            ] {
                cmd.arg(flag).arg(v);
            }
            if args.no_ping {
                cmd.arg("--no-ping");
            }
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            let (stdin, stdout, mut stderr) = (
                child.stdin.take().expect("piped"),
                child.stdout.take().expect("piped"),
                child.stderr.take().expect("piped"),
            );
            w.children.push(child);
            w.stdins.push(stdin);
            w.stderr.push(Some(std::thread::spawn(move || {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s);
                s
            })));
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { break };
                    let line = match l.split_once(' ') {
                        None if l == "ready" => Line::Ready,
                        Some(("done", k)) => k.parse().map_or(Line::Other(l.clone()), Line::Done),
                        Some(("tally", t)) => serde_json::from_str(t).map_or_else(
                            |e| Line::Other(format!("a tally that does not parse: {e}")),
                            Line::Tally,
                        ),
                        _ => Line::Other(l),
                    };
                    if tx.send((i, line)).is_err() {
                        return;
                    }
                }
                let _ = tx.send((i, Line::Closed));
            });
        }
        Ok(w)
    }

    /// The next line of any worker before `until` (`None` at `until`). A worker whose
    /// stdout closes before its tally fails the run, with its exit status and stderr.
    async fn next(&mut self, until: Instant) -> R<Option<(usize, Line)>> {
        loop {
            let got = tokio::time::timeout_at(until.into(), self.lines.recv()).await;
            match got {
                Err(_) => return Ok(None),
                Ok(None) => return Err("every worker's stdout closed".into()),
                Ok(Some((i, Line::Closed))) if self.tallied[i] => continue,
                Ok(Some((i, Line::Closed))) => return Err(self.failed(i)),
                Ok(Some((i, line))) => {
                    if matches!(line, Line::Tally(_)) {
                        self.tallied[i] = true;
                    }
                    return Ok(Some((i, line)));
                }
            }
        }
    }

    /// Waits for every worker to exit (they have sent their tallies), each with success.
    async fn reap(&mut self, until: Instant) -> R<()> {
        for i in 0..self.children.len() {
            loop {
                match self.children[i].try_wait()? {
                    Some(s) if s.success() => break,
                    Some(_) => return Err(self.failed(i)),
                    None if Instant::now() >= until => {
                        return Err(format!("worker {i} did not exit after its tally").into())
                    }
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        }
        Ok(())
    }

    /// Worker `i` failed: its exit status and stderr.
    fn failed(&mut self, i: usize) -> crate::BoxError {
        let status = match self.children[i].wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("unknown status ({e})"),
        };
        let stderr = self.stderr[i]
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let stderr = match stderr.trim_end() {
            "" => "its stderr is empty".to_string(),
            s => format!("its stderr:\n{s}"),
        };
        format!("worker {i} stopped ({status}); {stderr}").into()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stdins.clear();
        for c in &mut self.children {
            // Neither signals nor waits on a worker already reaped.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `--worker K`: one engine on the bench database, with the engine flags; see the
/// module's doc for the protocol. Its connections are named `gd_bench_worker_K`.
pub(crate) async fn worker(args: Args, index: usize) -> R<()> {
    let log = StatementLog::new();
    tracing::subscriber::set_global_default(log.clone())?;
    let logged = crate::server()?
        .database("gen_durable_bench")
        .application_name(&format!("{APP}{index}"));
    let quiet = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(logged.clone().disable_statement_logging());
    let b = Bench {
        args,
        quiet,
        direct: logged.clone(),
        logged,
        log,
    };
    let cfg = EngineCfg::from_args(&b);
    reset_probe(true);
    let pool = b.logged_pool(cfg.pool).await?;
    let tracker = Tracker::new(u64::MAX);
    b.log.take();
    let rss = RssSampler::start();
    let engine = start_engine(&pool, &cfg, &tracker).await?;
    println!("ready");

    let (closed, stop) = oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let t = tracker.clone();
    let progress = tokio::spawn(async move {
        let mut said = 0;
        loop {
            let done = t.done.load(Ordering::Relaxed);
            if done != said {
                println!("done {done}");
                said = done;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let _ = stop.await;
    progress.abort();
    let _ = progress.await;
    let mut memory = Map::new();
    rss.finish(&mut memory).await;

    let counts = by_kind(&b.log.take());
    engine.shutdown(Duration::from_secs(10)).await;
    pool.close().await;
    let tally = Tally {
        rss: memory,
        ..Tally::of(&tracker, &counts)
    };
    println!("tally {}", serde_json::to_string(&tally)?);
    Ok(())
}
