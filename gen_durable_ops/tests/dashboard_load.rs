//! The dashboard at 1M rows: p50 load time of each page, and the plans of the statements
//! behind them (docs/design/dashboard.md records both). Ignored: it seeds a million rows (and
//! flow control: 12,000 gated rows, 1,000 buckets).
//!
//! ```sh
//! cargo test -p gen_durable_ops --test dashboard_load -- --ignored --nocapture
//! ```

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gen_durable_ops::dashboard::{plans, router};
use gen_durable_testkit::TestDb;
use tower::ServiceExt;

const ROWS: i64 = 1_000_000;
const RUNS: usize = 30;

/// A million rows in one statement: four queues, three FSMs of two versions each; 80%
/// done and 5% failed over the last 7 days (so ~0.3% finished in the last 30 minutes),
/// 8% runnable, 4% awaiting a signal, 2% awaiting children (each with 20 children),
/// 1% executing; every tenth row keyed `order:N`.
const SEED: &str = r#"
INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, result, last_error,
                          awaits, locked_by, lease_expires_at, parent_id, children_pending,
                          unique_key, unique_scope, eligible_at, inserted_at, updated_at)
SELECT (ARRAY['Checkout', 'Mail', 'Report'])[1 + g % 3], 1 + g % 2, 'step', jsonb_build_object('n', g),
       'q' || (g % 4),
       s.status,
       CASE WHEN s.status = 'done' THEN '{"ok": true}'::jsonb END,
       CASE WHEN s.status = 'failed' THEN 'boom' END,
       CASE WHEN s.status = 'awaiting_signal' THEN '{go}'::text[] ELSE '{}' END,
       CASE WHEN s.status = 'executing' THEN 'node-x' END,
       CASE WHEN s.status = 'executing' THEN now() + interval '30 seconds' END,
       CASE WHEN g % 1000 BETWEEN 100 AND 119 THEN g - g % 1000 + 97 END,
       CASE WHEN s.status = 'awaiting_children' AND g % 1000 = 97 THEN 20 ELSE 0 END,
       CASE WHEN g % 10 = 0 THEN 'order:' || g END,
       CASE WHEN g % 10 = 0 THEN '{runnable,executing,awaiting_signal,awaiting_children}'::gd_status[] END,
       now() - (g % 600) * interval '1 second',
       now() - (g % 604800) * interval '1 second' - interval '1 minute',
       now() - (g % 604800) * interval '1 second'
  FROM generate_series(1, $1) g,
       LATERAL (SELECT (CASE WHEN g % 100 < 80 THEN 'done' WHEN g % 100 < 85 THEN 'failed'
                             WHEN g % 100 < 93 THEN 'runnable' WHEN g % 100 < 97 THEN 'awaiting_signal'
                             WHEN g % 100 < 99 THEN 'awaiting_children' ELSE 'executing' END)::gd_status
               AS status) s
"#;

/// Flow control on top of [`SEED`]: gate `stripe` (K = 4) with 2,000 executing rows, 4 in
/// each of 500 keys (every key full), and 10,000 runnable rows waiting in those keys; gate
/// `smtp` with none; rate limit `stripe` with 1,000 buckets, every tenth below zero, and
/// `carrier` with none.
const SEED_FLOW_CONTROL: [&str; 5] = [
    "INSERT INTO gd_gates (name, size) VALUES ('stripe', 4), ('smtp', 2)",
    "INSERT INTO gd_rate_limits (name, per_second, burst) VALUES ('stripe', 10, 20), ('carrier', 1, 5)",
    "UPDATE gd_instances
        SET gate = 'stripe', partition_key = 'tenant:' || ((id / 100) / 5 % 500),
            gate_slot = (id / 100) / 2500
      WHERE status = 'executing' AND (id / 100) % 5 = 0",
    "UPDATE gd_instances SET gate = 'stripe', partition_key = 'tenant:' || (id % 500)
      WHERE status = 'runnable' AND id % 10 = 0",
    "INSERT INTO gd_buckets (name, key, tokens, at)
     SELECT 'stripe', 'tenant:' || g, CASE WHEN g % 10 = 0 THEN -5 ELSE 3 END, now()
       FROM generate_series(1, 1000) g",
];

/// A week of the collector's per-minute rollup: every minute, for all queues and for
/// each of the four (50,400 rows), as the charts over 6 hours to 7 days read it.
const SEED_ROLLUP: &str = r#"
INSERT INTO gd_minutes (minute, queue, done, failed, took_ms)
SELECT date_trunc('minute', now()) - m * interval '1 minute', q, 80, 5,
       array_fill(0::int8, ARRAY[8]) || ARRAY[85::int8] || array_fill(0::int8, ARRAY[23])
  FROM generate_series(1, 7 * 1440) m, unnest(ARRAY['*', 'q0', 'q1', 'q2', 'q3']) q
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "seeds 1M rows; run it to measure (docs/design/dashboard.md)"]
async fn p50_page_loads_at_1m_rows() {
    let db = TestDb::new().await;
    let p = db.pool();
    let t = Instant::now();
    sqlx::query(SEED).bind(ROWS).execute(p).await.unwrap();
    for sql in SEED_FLOW_CONTROL {
        sqlx::query(sql).execute(p).await.unwrap();
    }
    sqlx::query(SEED_ROLLUP).execute(p).await.unwrap();
    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms)
         VALUES ('node-a', '{q0,q1,q2,q3}', '{Checkout@2,Mail@2,Report@2}')",
    )
    .execute(p)
    .await
    .unwrap();
    sqlx::query("INSERT INTO gd_queue_pauses (queue, reason) VALUES ('q3', 'maintenance')")
        .execute(p)
        .await
        .unwrap();
    for table in ["gd_instances", "gd_buckets", "gd_minutes"] {
        sqlx::query(&format!("VACUUM ANALYZE {table}"))
            .execute(p)
            .await
            .unwrap();
    }
    eprintln!("seeded {ROWS} rows in {:?}", t.elapsed());

    // A parent (awaiting children, 20 of them) near the middle.
    let parent = ROWS / 2 + 97;
    let app = router(p.clone());
    let pages = [
        ("/", "overview".to_string()),
        ("/ (window=7d)", "?window=7d".into()),
        ("/instances", "instances".into()),
        (
            "/instances (status=failed, queue=q1)",
            "instances?status=failed&queue=q1".into(),
        ),
        ("/instances (key)", "instances?key=order%3A500000".into()),
        ("/instances (after=500000)", "instances?after=500000".into()),
        (
            "/instances/{id} (a parent of 20)",
            format!("instances/{parent}"),
        ),
        ("/fsms", "fsms".into()),
        ("/limits", "limits".into()),
    ];
    println!("| page | p50 | p95 |\n|---|---|---|");
    for (name, path) in &pages {
        let path = if path == "overview" {
            "/".to_string()
        } else {
            format!("/{path}")
        };
        let mut times: Vec<Duration> = Vec::with_capacity(RUNS);
        for i in 0..RUNS + 3 {
            let t = Instant::now();
            let res = app
                .clone()
                .oneshot(Request::get(&path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{path}");
            axum::body::to_bytes(res.into_body(), usize::MAX)
                .await
                .unwrap();
            if i >= 3 {
                times.push(t.elapsed());
            }
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| {name} | {:.1} ms | {:.1} ms |",
            ms(times[RUNS / 2]),
            ms(times[RUNS * 95 / 100])
        );
    }
    for (what, plan) in plans(p, parent).await.unwrap() {
        println!("\n-- {what}\n{plan}");
    }
    db.close().await;
}
