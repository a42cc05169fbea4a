//! The `pick_1m` scenario: the claim's plan on a large table must stay O(batch).

use std::collections::BTreeMap;
use std::time::Instant;

use gen_durable::prelude::*;
use serde_json::{Map, Value};

use super::explain::{capture_statements, explain_commit, explain_text, find_nodes};
use super::{percentile, scalar_i64, R};
use crate::{Bench, Report};

/// `pick_1m`: 1,000,000 rows, 200,000 of them runnable; EXPLAIN (ANALYZE, BUFFERS) of the
/// engine's claim statement (captured from the engine itself), plus the group commit (its
/// inner statements through auto_explain) and a signal delivery on the same table,
/// printed to stderr. Everything rolls back.
pub(super) async fn pick_1m(b: &Bench) -> R<Report> {
    let (rows, runnable_every) = if b.smoke() {
        (10_000, 5)
    } else {
        (1_000_000, 5)
    };
    capture_statements(b).await?;
    let claim_sql = b.log.text("claim").ok_or("the claim was not captured")?;
    // The engine calls `gd_claim_plain`; EXPLAIN shows the statement inside it.
    let explained_sql = gen_durable::backend::prepared_statements()
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
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {explained_sql}"
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
    let plan = explain_text(&mut tx, &explained_sql, |q| {
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
