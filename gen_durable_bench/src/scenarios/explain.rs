//! The EXPLAIN helpers: capture the engine's hot statements, and read their plans.

use std::time::Duration;

use gen_durable::prelude::*;
use serde_json::Value;

use super::tracker::{start_engine, Tracker};
use super::{insert_chunks, EngineCfg, R};
use crate::fsms::{reset_probe, Five, Waiter};
use crate::Bench;

/// Finds a node in an EXPLAIN (FORMAT JSON) plan tree.
pub(super) fn find_nodes<'a>(
    plan: &'a Value,
    pred: &dyn Fn(&Value) -> bool,
    out: &mut Vec<&'a Value>,
) {
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
pub(super) async fn capture_statements(b: &Bench) -> R<()> {
    b.clean().await?;
    reset_probe(false);
    let pool = b.logged_pool(4).await?;
    let client = b.client(&pool);
    insert_chunks::<Five>(&client, 10, 0).await?;
    let w = client
        .insert::<Waiter>(crate::fsms::BenchState::new(0, 0))
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

/// Turns on auto_explain for the nested statements of the functions this transaction calls
/// (their plans come back as notices).
pub(super) async fn auto_explain(tx: &mut sqlx::PgConnection, on: bool) -> R<()> {
    let sets: &[&str] = if on {
        &[
            "LOAD 'auto_explain'",
            "SET LOCAL auto_explain.log_min_duration = 0",
            "SET LOCAL auto_explain.log_analyze = on",
            "SET LOCAL auto_explain.log_buffers = on",
            "SET LOCAL auto_explain.log_nested_statements = on",
            "SET LOCAL auto_explain.log_level = notice",
        ]
    } else {
        &["SET LOCAL auto_explain.log_min_duration = -1"]
    };
    for set in sets {
        sqlx::query(set).execute(&mut *tx).await?;
    }
    Ok(())
}

/// Calls `gd_commit_outcomes` with a `next` outcome for each claimed row, with
/// auto_explain on for its nested statements, and returns their plans.
pub(super) async fn explain_commit(
    tx: &mut sqlx::PgConnection,
    b: &Bench,
    apply_sql: &str,
    claimed: &[(i64, i64)],
) -> R<String> {
    auto_explain(tx, true).await?;
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
        // No transition: the keys and limits of the rows stay.
        .bind(None::<Vec<bool>>)
        .bind(None::<Vec<Option<String>>>)
        .bind(None::<Vec<Option<String>>>)
        .bind(None::<Vec<Option<String>>>)
        .bind(None::<Vec<Option<String>>>)
        .bind(None::<Vec<Option<f64>>>)
        .execute(&mut *tx)
        .await;
    // The apply's own error first: after it, the transaction refuses every statement.
    r?;
    auto_explain(tx, false).await?;
    Ok(b.log.take_notices().join("\n"))
}

pub(super) async fn explain_text(
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
