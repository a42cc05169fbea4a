//! The `pick_1m` scenario: a claim's cost on a large table must stay O(batch), for rows
//! claimed from the ready log (storage v2) and for rows claimed by themselves (a K = 1
//! key, a gate, a rate limit: the v1 claim by the pick index).

use std::collections::BTreeMap;
use std::time::Instant;

use gen_durable::prelude::*;
use serde_json::{Map, Value};

use super::explain::{auto_explain, capture_statements, explain_commit, explain_text, find_nodes};
use super::{percentile, scalar_i64, R};
use crate::{Bench, Report};

/// The log's claim for the EXPLAIN node: the ranges (`gd_advance`), then their rows
/// (`gd_read`). Returns the claimed `(id, entry)` pairs.
async fn log_claim(
    tx: &mut sqlx::PgConnection,
    advance_sql: &str,
    read_sql: &str,
    names: &[String],
    versions: &[i32],
    demand: i64,
) -> R<Vec<(i64, i64)>> {
    use sqlx::Row;
    let ranges: Vec<(Option<i32>, Option<i64>, bool)> = sqlx::query_as(advance_sql)
        .bind("bench")
        .bind(names)
        .bind(demand)
        .bind("explain-node")
        .bind(30_000i64)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .fetch_all(&mut *tx)
        .await?;
    let pairs: Vec<i64> = ranges
        .iter()
        .filter_map(|r| r.0.zip(r.1))
        .flat_map(|(lane, batch)| [i64::from(lane), batch])
        .collect();
    Ok(sqlx::query(read_sql)
        .bind(pairs)
        .bind(names)
        .bind(versions)
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| (r.get::<i64, _>("id"), r.get::<i64, _>("lease_epoch")))
        .collect())
}

/// `pick_1m`: 1,000,000 rows, 200,000 of them runnable (half plain, in the ready log; half
/// with a K = 1 key each). The log's claim (its two statements, captured from the engine
/// itself) timed at batches of 1, 100 and 512, with its inner plans through auto_explain;
/// EXPLAIN (ANALYZE, BUFFERS) of the keyed rows' claim; the group commit of the log's rows
/// and a signal delivery on the same table, printed to stderr. Everything rolls back.
pub(super) async fn pick_1m(b: &Bench) -> R<Report> {
    let rows: i64 = if b.smoke() { 10_000 } else { 1_000_000 };
    capture_statements(b).await?;
    let advance_sql = b
        .log
        .text("advance")
        .ok_or("the log's advance was not captured")?;
    let read_sql = b
        .log
        .text("claim")
        .ok_or("the log's read was not captured")?;
    // The keyed rows' claim is `gd_claim_plain`; EXPLAIN shows the statement inside it.
    let keyed_sql = gen_durable::backend::prepared_statements()
        .into_iter()
        .find(|(name, _, _)| *name == "claim_plain")
        .map(|(_, _, sql)| sql.into_owned())
        .ok_or("no claim_plain statement")?;
    let apply_sql = b.log.text("apply").ok_or("the apply was not captured")?;
    let signal_sql = b
        .log
        .text("signal")
        .ok_or("the delivery was not captured")?;
    b.clean().await?;
    let t = Instant::now();
    // Every fifth row runnable: every tenth with a key of its own, the others plain, their
    // entries appended below in one call (as migration 0032 appends a live table's).
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, partition_key,
                                   ready_seq, eligible_at, updated_at)
         SELECT 'Noop', 1, 'run', jsonb_build_object('i', g), 'bench',
                (CASE WHEN g % 5 = 0 THEN 'runnable' ELSE 'done' END)::gd_status,
                CASE WHEN g % 10 = 0 THEN 'u' || g END,
                CASE WHEN g % 5 = 0 AND g % 10 <> 0 THEN 0 END,
                now() - interval '1 hour' + g * interval '1 millisecond', now()
           FROM generate_series(1, $1::int8) g",
    )
    .bind(rows)
    .execute(&b.quiet)
    .await?;
    sqlx::query(
        "SELECT count(*) FROM gd_append(ARRAY(
             SELECT id FROM gd_instances WHERE ready_seq = 0 ORDER BY eligible_at, id), NULL)",
    )
    .execute(&b.quiet)
    .await?;
    for table in ["gd_instances", "gd_ready", "gd_lanes"] {
        sqlx::query(&format!("VACUUM ANALYZE {table}"))
            .execute(&b.quiet)
            .await?;
    }
    eprintln!(
        "pick_1m: {rows} rows loaded in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let runnable = scalar_i64(
        &b.quiet,
        "SELECT count(*) FROM gd_instances WHERE status = 'runnable'",
    )
    .await?;
    let entries = scalar_i64(&b.quiet, "SELECT count(*) FROM gd_ready").await?;
    if runnable < rows / 5 || entries < rows / 10 {
        return Err(format!("only {runnable} runnable rows, {entries} entries").into());
    }
    let names = vec!["Noop".to_string()];
    let versions = vec![1i32];

    // The log's claim: wall time of its two statements (client round trips included).
    let mut log_ms: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    let mut log_rows_ok = true;
    for batch in [1i64, 100, 512] {
        for _ in 0..3 {
            let mut tx = b.quiet.begin().await?;
            let t = Instant::now();
            let got = log_claim(&mut tx, &advance_sql, &read_sql, &names, &versions, batch).await?;
            log_ms
                .entry(batch)
                .or_default()
                .push(t.elapsed().as_secs_f64() * 1e3);
            tx.rollback().await?;
            // Keyed rows are due too, so the log's claim takes half the demand (at least 1).
            log_rows_ok &= !got.is_empty() && got.len() as i64 <= batch;
        }
    }
    // Its inner plans at a batch of 100: no statement may scan a table whole.
    let mut tx = b.quiet.begin().await?;
    auto_explain(&mut tx, true).await?;
    b.log.take_notices();
    let claimed = log_claim(&mut tx, &advance_sql, &read_sql, &names, &versions, 100).await?;
    auto_explain(&mut tx, false).await?;
    let log_plans = b.log.take_notices().join("\n");
    let log_seq_scans: Vec<String> = log_plans
        .lines()
        .filter(|l| {
            ["gd_instances", "gd_ready", "gd_batches", "gd_due"]
                .iter()
                .any(|t| l.contains(&format!("Seq Scan on {t} ")))
        })
        .map(|l| l.trim().to_string())
        .collect();
    eprintln!(
        "---- the log's claim of 100 (gd_advance, gd_read; {rows} rows, {entries} entries), via auto_explain\n{log_plans}"
    );
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

    // The keyed rows' claim: EXPLAIN (ANALYZE) of the statement inside `gd_claim_plain`.
    let mut keyed_ms: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    let mut index_scan = true;
    let mut stops_at_batch = true;
    let mut shared_hit = 0i64;
    for batch in [1i64, 100, 512] {
        for _ in 0..3 {
            let mut tx = b.quiet.begin().await?;
            let plan: Value = sqlx::query_scalar(&format!(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {keyed_sql}"
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
            keyed_ms
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
    let mut tx = b.quiet.begin().await?;
    let plan = explain_text(&mut tx, &keyed_sql, |q| {
        q.bind("bench")
            .bind(names.clone())
            .bind(versions.clone())
            .bind(100i64)
            .bind("explain-node")
            .bind(30_000i64)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
    })
    .await?;
    eprintln!("---- EXPLAIN keyed claim (batch 100, {rows} rows, {runnable} runnable)\n{plan}");
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

    let med = |m: &BTreeMap<i64, Vec<f64>>| -> Map<String, Value> {
        m.iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                (k.to_string(), json!(percentile(&mut v, 0.5)))
            })
            .collect()
    };
    let mut v100 = log_ms.get(&100).cloned().unwrap_or_default();
    let log_med = percentile(&mut v100, 0.5).unwrap_or(f64::NAN);
    let mut extra = Map::new();
    extra.insert("runnable".into(), json!(runnable));
    extra.insert("entries".into(), json!(entries));
    extra.insert("batch".into(), json!(100));
    extra.insert("log_ms_by_batch".into(), json!(med(&log_ms)));
    extra.insert("log_seq_scans".into(), json!(log_seq_scans));
    extra.insert("keyed_exec_ms_by_batch".into(), json!(med(&keyed_ms)));
    extra.insert("index_scan_on_gd_instances_pick".into(), json!(index_scan));
    extra.insert("stops_at_batch".into(), json!(stops_at_batch));
    extra.insert("shared_hit_blocks".into(), json!(shared_hit));
    extra.insert(
        "unit".into(),
        json!("claims of 100 from the log per second (its two statements' wall time)"),
    );
    if !log_rows_ok || !log_seq_scans.is_empty() {
        return Err(format!(
            "the log's claim is not O(batch) at {rows} rows: rows within the batch {log_rows_ok}, whole-table scans {log_seq_scans:?}"
        )
        .into());
    }
    if !index_scan || !stops_at_batch {
        return Err(format!(
            "the keyed claim is not O(batch) at {rows} rows: index scan on gd_instances_pick {index_scan}, stops at the batch {stops_at_batch}"
        )
        .into());
    }
    Ok(Report {
        n: rows as u64,
        secs: log_med / 1e3,
        per_s: 100.0 / (log_med / 1e3),
        p50_ms: Some(log_med),
        p99_ms: percentile(&mut v100, 0.99),
        statements_per_step: Some(2.0),
        extra,
    })
}
