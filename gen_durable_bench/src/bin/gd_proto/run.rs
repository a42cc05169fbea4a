//! One run of one candidate, and the rounds of runs.

use std::str::FromStr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{Connection, PgPool, Row};

use crate::candidate::{self, Candidate};
use crate::counters;
use crate::graphile::{self, Graphile};
use crate::report;
use crate::Args;

const DB: &str = "gd_proto";

/// What a run's clients send.
#[derive(Debug, Clone)]
enum Cycle {
    Sql {
        claim: String,
        read: Option<String>,
        commit: String,
    },
    Graphile {
        get_jobs: String,
        complete_jobs: String,
        tasks: Vec<i32>,
    },
}

pub(crate) async fn main(args: &Args) -> Result<(), String> {
    let mut names: Vec<String> = if args.candidate_files {
        candidate::all()
    } else if args.candidates.is_empty() {
        std::iter::once("graphile".to_string())
            .chain(candidate::all())
            .collect()
    } else {
        args.candidates.clone()
    };
    // Read every file first: a typo fails before the first run. A design that cannot run
    // this many steps is left out.
    let mut skipped = Vec::new();
    for name in names.iter().filter(|n| *n != "graphile") {
        if Candidate::load(name)?
            .max_steps
            .is_some_and(|m| args.steps > m)
        {
            skipped.push(name.clone());
        }
    }
    if args.steps != 1 {
        skipped.push("graphile".to_string());
    }
    names.retain(|n| !skipped.contains(n));
    if !skipped.is_empty() {
        eprintln!(
            "gd_proto: not run at {} steps: {}",
            args.steps,
            skipped.join(", ")
        );
    }
    let mut lines = Vec::new();
    for round in 1..=args.rounds {
        for name in &names {
            let line = run_one(args, name, round).await?;
            println!("{line}");
            lines.push(line);
        }
    }
    report::print(&lines, args);
    Ok(())
}

fn err(what: &str) -> impl Fn(sqlx::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The URL of database `DB` on `url`'s server.
fn db_url(url: &str) -> String {
    let base = url.split('?').next().unwrap_or(url);
    match base.rsplit_once('/') {
        Some((server, _)) if server.contains("//") && server != "postgres:/" => {
            format!("{server}/{DB}")
        }
        _ => format!("{base}/{DB}"),
    }
}

async fn run_one(args: &Args, name: &str, round: usize) -> Result<Value, String> {
    let server = PgConnectOptions::from_str(&args.database_url).map_err(|e| e.to_string())?;
    let mut admin = PgConnection::connect_with(&server)
        .await
        .map_err(err("connect"))?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"),
        format!("CREATE DATABASE {DB}"),
    ] {
        sqlx::raw_sql(&statement)
            .execute(&mut admin)
            .await
            .map_err(err("create database"))?;
    }
    admin.close().await.ok();
    let opts = server.clone().database(DB);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(opts.clone())
        .await
        .map_err(err("connect gd_proto"))?;
    sqlx::raw_sql("CREATE EXTENSION pg_walinspect")
        .execute(&pool)
        .await
        .map_err(err("pg_walinspect"))?;

    let (cycle, tables, gc, about) = if name == "graphile" {
        let g: Graphile = graphile::setup(&db_url(&args.database_url), args.batch)?;
        sqlx::query(graphile::SEED)
            .bind(args.n)
            .execute(&pool)
            .await
            .map_err(err("graphile seed"))?;
        let tasks: Vec<i32> = sqlx::query_scalar(graphile::TASK_IDS)
            .fetch_one(&pool)
            .await
            .map_err(err("graphile tasks"))?;
        let about = format!("graphile-worker {}: its schema and statements", g.version);
        let cycle = Cycle::Graphile {
            get_jobs: g.get_jobs,
            complete_jobs: g.complete_jobs,
            tasks,
        };
        let tables = graphile::TABLES.map(String::from).to_vec();
        (cycle, tables, None, about)
    } else {
        let c = Candidate::load(name)?;
        if c.migrate {
            gen_durable::migrate_schema(&pool)
                .await
                .map_err(|e| format!("{name}: migrate: {e}"))?;
        }
        sqlx::raw_sql(&c.setup)
            .execute(&pool)
            .await
            .map_err(|e| format!("{name}: setup: {e}"))?;
        sqlx::query(&c.seed)
            .bind(args.n)
            .execute(&pool)
            .await
            .map_err(|e| format!("{name}: seed: {e}"))?;
        let cycle = Cycle::Sql {
            claim: c.claim,
            read: c.read,
            commit: c.commit,
        };
        (cycle, c.tables, c.gc, c.about)
    };
    for statement in ["VACUUM ANALYZE", "CHECKPOINT"] {
        sqlx::raw_sql(statement)
            .execute(&pool)
            .await
            .map_err(err("vacuum"))?;
    }

    let mut conns = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..args.clients {
        let mut conn = PgConnection::connect_with(&opts)
            .await
            .map_err(err("connect client"))?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .map_err(err("pid"))?;
        pids.push(pid as u32);
        conns.push(conn);
    }

    let target = args.n * i64::from(args.steps);
    let tuples0 = counters::tuples(&pool, &tables)
        .await
        .map_err(err("stats"))?;
    let lsn0 = counters::wal_lsn(&pool).await.map_err(err("lsn"))?;
    let cpu0 = counters::server_cpu();
    let backends0 = counters::backends_cpu(&pids);
    let written = Arc::new(AtomicI64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, conn) in conns.into_iter().enumerate() {
        let cycle = cycle.clone();
        let written = written.clone();
        let (batch, steps) = (args.batch, args.steps);
        tasks.push(tokio::spawn(async move {
            client(conn, format!("w{i}"), cycle, batch, steps, target, written).await
        }));
    }
    let mut conns = Vec::new();
    let (mut claiming, mut committing) = (Duration::ZERO, Duration::ZERO);
    for t in tasks {
        let (conn, claim, commit) = t.await.map_err(|e| e.to_string())??;
        conns.push(conn);
        claiming += claim;
        committing += commit;
    }
    let secs = started.elapsed().as_secs_f64();
    let backends = counters::backends_cpu(&pids) - backends0;
    let cpu = counters::server_cpu() - cpu0;
    let lsn1 = counters::wal_lsn(&pool).await.map_err(err("lsn"))?;
    for c in conns {
        c.close().await.ok();
    }
    let total = written.load(Ordering::SeqCst);
    if total != target {
        return Err(format!(
            "{name}: {total} outcomes written, {target} expected"
        ));
    }
    let tuples1 = counters::settled_tuples(&pool, &tables)
        .await
        .map_err(err("stats"))?;
    let records = counters::wal_records(&pool, lsn0)
        .await
        .map_err(err("pg_walinspect"))?;
    let size = counters::size(&pool, &tables).await.map_err(err("size"))?;
    let per = |x: f64| x / target as f64;
    let t = |a: i64, b: i64| per((b - a) as f64);
    let upd = tuples1.upd - tuples0.upd;
    let mut wal = counters::wal_writes(&records);
    for v in wal.as_object_mut().expect("an object").values_mut() {
        *v = json!(round2(per(v.as_f64().unwrap_or(0.0))));
    }

    let gc_figures = if args.no_gc {
        Value::Null
    } else {
        retention(&pool, gc.as_deref(), &tables, args.n).await?
    };
    pool.close().await;
    Ok(json!({
        "candidate": name,
        "about": about,
        "round": round,
        "n": args.n,
        "steps": args.steps,
        "clients": args.clients,
        "batch": args.batch,
        "secs": round2(secs),
        "steps_per_s": (target as f64 / secs).round(),
        "server_cpu_us_per_step": round2(per(cpu) * 1e6),
        "client_backends_cpu_us_per_step": round2(per(backends) * 1e6),
        "claim_latency_us_per_step": round2(per(claiming.as_secs_f64()) * 1e6),
        "commit_latency_us_per_step": round2(per(committing.as_secs_f64()) * 1e6),
        "wal_bytes_per_step": round2(t(lsn0, lsn1)),
        "wal_per_step": wal,
        "tuples_per_step": {
            "inserted": round2(t(tuples0.ins, tuples1.ins)),
            "updated": round2(t(tuples0.upd, tuples1.upd)),
            "hot_updated": round2(t(tuples0.hot, tuples1.hot)),
            "deleted": round2(t(tuples0.del, tuples1.del)),
        },
        "hot_ratio": if upd > 0 { round2((tuples1.hot - tuples0.hot) as f64 / upd as f64) } else { 0.0 },
        "bytes_after_drain": size,
        "gc": gc_figures,
    }))
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// One client: claim, commit, until `target` outcomes are written by all.
async fn client(
    mut conn: PgConnection,
    worker: String,
    cycle: Cycle,
    batch: i64,
    steps: u32,
    target: i64,
    written: Arc<AtomicI64>,
) -> Result<(PgConnection, Duration, Duration), String> {
    let (mut claiming, mut committing) = (Duration::ZERO, Duration::ZERO);
    while written.load(Ordering::SeqCst) < target {
        let t0 = Instant::now();
        let n = match &cycle {
            Cycle::Sql {
                claim,
                read,
                commit,
            } => {
                let mut rows = sqlx::query(claim)
                    .bind(&worker)
                    .bind(batch)
                    .fetch_all(&mut conn)
                    .await
                    .map_err(err("claim"))?;
                // A claim of ranges: the rows are read by a second statement, per range.
                if let Some(read) = read {
                    let ranges: Vec<(i64, i64)> =
                        rows.iter().map(|r| (r.get("lo"), r.get("hi"))).collect();
                    rows = Vec::new();
                    for (lo, hi) in ranges {
                        rows.extend(
                            sqlx::query(read)
                                .bind(lo)
                                .bind(hi)
                                .fetch_all(&mut conn)
                                .await
                                .map_err(err("read"))?,
                        );
                    }
                }
                claiming += t0.elapsed();
                let mut claimed: Vec<(i64, i64, String)> = rows
                    .iter()
                    .map(|r| (r.get("id"), r.get("epoch"), r.get("step")))
                    .collect();
                if claimed.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                claimed.sort_unstable();
                let mut ids = Vec::with_capacity(claimed.len());
                let mut epochs = Vec::with_capacity(claimed.len());
                let mut nexts: Vec<Option<String>> = Vec::with_capacity(claimed.len());
                let mut states = Vec::with_capacity(claimed.len());
                for (id, epoch, step) in claimed {
                    let k: u32 = step.trim_start_matches('s').parse().unwrap_or(0);
                    ids.push(id);
                    epochs.push(epoch);
                    nexts.push((k + 1 < steps).then(|| format!("s{}", k + 1)));
                    states.push(json!({"i": id, "step": k + 1}));
                }
                let t1 = Instant::now();
                let n = commit_all(&mut conn, commit, &worker, ids, epochs, nexts, states).await?;
                committing += t1.elapsed();
                n
            }
            Cycle::Graphile {
                get_jobs,
                complete_jobs,
                tasks,
            } => {
                let rows = sqlx::query(get_jobs)
                    .bind(&worker)
                    .bind(tasks)
                    .fetch_all(&mut conn)
                    .await
                    .map_err(err("get_jobs"))?;
                claiming += t0.elapsed();
                let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
                if ids.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let t1 = Instant::now();
                let done = sqlx::query(complete_jobs)
                    .bind(&ids)
                    .execute(&mut conn)
                    .await
                    .map_err(err("complete_jobs"))?
                    .rows_affected() as i64;
                committing += t1.elapsed();
                if done != ids.len() as i64 {
                    return Err(format!("complete_jobs deleted {done} of {}", ids.len()));
                }
                done
            }
        };
        written.fetch_add(n, Ordering::SeqCst);
    }
    Ok((conn, claiming, committing))
}

/// Commits a batch, and again the outcomes the candidate deferred (v1 defers a row another
/// transaction holds locked for a moment: a claim locks rows it then finds already
/// claimed); fails unless every outcome was written (the fence held).
async fn commit_all(
    conn: &mut PgConnection,
    commit: &str,
    worker: &str,
    mut ids: Vec<i64>,
    mut epochs: Vec<i64>,
    mut nexts: Vec<Option<String>>,
    mut states: Vec<Value>,
) -> Result<i64, String> {
    let total = ids.len() as i64;
    let mut written = 0;
    loop {
        let row = sqlx::query(commit)
            .bind(&ids)
            .bind(&epochs)
            .bind(worker)
            .bind(&nexts)
            .bind(&states)
            .fetch_one(&mut *conn)
            .await
            .map_err(err("commit"))?;
        written += row.get::<i64, _>(0);
        let deferred: Vec<i64> = if row.len() > 1 {
            row.get::<Option<Vec<i64>>, _>(1).unwrap_or_default()
        } else {
            Vec::new()
        };
        if deferred.is_empty() {
            break;
        }
        let keep: Vec<bool> = ids.iter().map(|id| deferred.contains(id)).collect();
        let pick = |v: &mut Vec<_>| {
            let mut k = keep.iter();
            v.retain(|_| *k.next().unwrap_or(&false));
        };
        pick(&mut ids);
        pick(&mut epochs);
        let mut k = keep.iter();
        nexts.retain(|_| *k.next().unwrap_or(&false));
        let mut k = keep.iter();
        states.retain(|_| *k.next().unwrap_or(&false));
    }
    if written != total {
        return Err(format!(
            "commit wrote {written} of {total} outcomes: the fence refused a live lease"
        ));
    }
    Ok(written)
}

/// Retention after the drain: the candidate's `gc` until it collects nothing, then a
/// `VACUUM` of its tables (what the dead rows its drain and its `gc` left cost to reclaim;
/// for graphile-worker, which deletes as it completes, only that).
async fn retention(
    pool: &PgPool,
    statement: Option<&str>,
    tables: &[String],
    n: i64,
) -> Result<Value, String> {
    let lsn0 = counters::wal_lsn(pool).await.map_err(err("lsn"))?;
    let cpu0 = counters::server_cpu();
    let started = Instant::now();
    while let Some(statement) = statement {
        let collected: Option<i64> = sqlx::query_scalar(statement)
            .fetch_optional(pool)
            .await
            .map_err(err("gc"))?;
        if collected.unwrap_or(0) <= 0 {
            break;
        }
    }
    let schema = if tables.iter().any(|t| t.starts_with("_private")) {
        "graphile_worker."
    } else {
        ""
    };
    let list: Vec<String> = tables.iter().map(|t| format!("{schema}{t}")).collect();
    sqlx::raw_sql(&format!("VACUUM {}", list.join(", ")))
        .execute(pool)
        .await
        .map_err(err("vacuum"))?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = counters::server_cpu() - cpu0;
    let lsn1 = counters::wal_lsn(pool).await.map_err(err("lsn"))?;
    let size = counters::size(pool, tables).await.map_err(err("size"))?;
    Ok(json!({
        "secs": round2(secs),
        "server_cpu_us_per_instance": round2(cpu / n as f64 * 1e6),
        "wal_bytes_per_instance": round2((lsn1 - lsn0) as f64 / n as f64),
        "bytes_after": size,
    }))
}
