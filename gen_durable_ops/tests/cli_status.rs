//! `gen_durable status` and `inspect` against rows made directly in the database.

mod cli_support;

use cli_support::{gd_on, node, Row};
use gen_durable_testkit::TestDb;
use serde_json::json;

#[tokio::test]
async fn status_of_an_empty_database() {
    let db = TestDb::new().await;
    let r = gd_on(&db, &["status"]).expect(0);
    assert!(r.stdout.contains("no instances"), "{}", r.stdout);
    assert!(r.stdout.contains("0 live nodes"), "{}", r.stdout);
    assert!(
        r.stdout.contains("none has announced itself"),
        "{}",
        r.stdout
    );
    let j = gd_on(&db, &["status", "--json"]).expect(0).json();
    assert_eq!(j["queues"], json!([]));
    assert_eq!(j["unrunnable"], json!([]));
    assert_eq!(j["live_window_seconds"], 60);
    db.close().await;
}

#[tokio::test]
async fn status_lists_the_schedules_and_why_a_fire_was_skipped() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO gd_schedules (name, pattern, timezone, catch_up, next_fire, last_fire,
                                   last_id, skipped, last_error)
         VALUES ('nightly', '0 2 * * *', 'Europe/Paris', 'run_once',
                 '2026-01-02T01:00:00Z', '2026-01-01T01:00:00Z', 42, 3, NULL),
                ('broken', '* * * * *', 'UTC', 'skip', NULL, NULL, NULL, 1,
                 'fire time 2026-01-01 00:01:00 UTC: invalid correlation_key')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = gd_on(&db, &["status"]).expect(0).stdout;
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}: {out}"))
            .to_string()
    };
    let nightly = line("nightly ");
    assert!(
        nightly.contains("0 2 * * *") && nightly.contains("Europe/Paris"),
        "{nightly}"
    );
    assert!(
        nightly.contains("run_once") && nightly.contains(" 42 "),
        "{nightly}"
    );
    assert!(line("broken ").contains("never"), "{out}");
    assert!(
        out.contains("broken: last skipped fire: fire time 2026-01-01 00:01:00 UTC"),
        "{out}"
    );
    let j = gd_on(&db, &["status", "--json"]).expect(0).json();
    assert_eq!(j["schedules"][1]["name"], "nightly");
    assert_eq!(j["schedules"][1]["last_id"], 42);
    assert_eq!(j["schedules"][0]["skipped"], 1);
    db.close().await;
}

#[tokio::test]
async fn status_counts_lag_unrunnable_rows_expired_leases_and_nodes() {
    let db = TestDb::new().await;
    let p = db.pool();
    // checkout: two ready rows (the oldest waiting 90 s), one scheduled for later, one
    // parked, one done.
    Row::new("Checkout", "checkout", "runnable")
        .version(2)
        .age_secs(90)
        .insert(p)
        .await;
    Row::new("Checkout", "checkout", "runnable")
        .version(2)
        .insert(p)
        .await;
    let later = Row::new("Checkout", "checkout", "runnable")
        .version(2)
        .insert(p)
        .await;
    sqlx::query("UPDATE gd_instances SET eligible_at = now() + interval '1 hour' WHERE id = $1")
        .bind(later)
        .execute(p)
        .await
        .unwrap();
    let parked = Row::new("Checkout", "checkout", "awaiting_signal")
        .version(2)
        .insert(p)
        .await;
    // The parked row holds a correlation key.
    sqlx::query(
        "UPDATE gd_instances SET unique_key = 'order:1',
                unique_scope = '{runnable,executing,awaiting_signal,awaiting_children}'
          WHERE id = $1",
    )
    .bind(parked)
    .execute(p)
    .await
    .unwrap();
    Row::new("Checkout", "checkout", "done")
        .version(2)
        .insert(p)
        .await;
    // An old version nobody runs any more, and a queue nobody picks from.
    Row::new("Checkout", "checkout", "runnable")
        .version(1)
        .insert(p)
        .await;
    Row::new("Mail", "mail", "awaiting_signal").insert(p).await;
    // An executing row whose node died 5 minutes ago, and one whose lease is fine.
    let dead = Row::new("Checkout", "checkout", "executing")
        .version(2)
        .insert(p)
        .await;
    let alive = Row::new("Checkout", "checkout", "executing")
        .version(2)
        .insert(p)
        .await;
    sqlx::query(
        "UPDATE gd_instances SET locked_by = CASE WHEN id = $1 THEN 'node-dead' ELSE 'node-a' END,
                lease_expires_at = CASE WHEN id = $1 THEN now() - interval '5 minutes'
                                        ELSE now() + interval '30 seconds' END
          WHERE id IN ($1, $2)",
    )
    .bind(dead)
    .bind(alive)
    .execute(p)
    .await
    .unwrap();
    // node-a runs checkout v2 and is live; node-old ran mail, but not in the last minute.
    node(p, "node-a", &["checkout"], &["Checkout@2"], 5).await;
    node(p, "node-old", &["mail"], &["Mail@1"], 120).await;

    let j = gd_on(&db, &["--json", "status"]).expect(0).json();
    let queues = j["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 2, "{j:#}");
    let checkout = &queues[0];
    assert_eq!(checkout["queue"], "checkout");
    assert_eq!(
        checkout["counts"],
        json!({"runnable": 4, "executing": 2, "awaiting_signal": 1,
               "awaiting_children": 0, "done": 1, "failed": 0})
    );
    // The v1 row counts as ready too: readiness is about time, not about who runs it.
    assert_eq!(checkout["ready"], 3);
    let lag = checkout["lag_seconds"].as_f64().unwrap();
    assert!((90.0..120.0).contains(&lag), "lag {lag}");
    assert_eq!(checkout["keyed"], 1);
    assert_eq!(queues[1]["queue"], "mail");
    assert_eq!(queues[1]["lag_seconds"], json!(null));

    assert_eq!(
        j["unrunnable"],
        json!([
            {"queue": "checkout", "fsm": "Checkout", "fsm_version": 1, "rows": 1, "runnable": 1},
            {"queue": "mail", "fsm": "Mail", "fsm_version": 1, "rows": 1, "runnable": 0},
        ])
    );
    let expired = j["expired_leases"].as_array().unwrap();
    assert_eq!(expired.len(), 1, "{j:#}");
    assert_eq!(expired[0]["locked_by"], "node-dead");
    assert_eq!(expired[0]["count"], 1);
    assert_eq!(expired[0]["ids"], json!([dead]));
    let nodes = j["nodes"].as_array().unwrap();
    assert_eq!(nodes[0]["node_id"], "node-a");
    assert_eq!(nodes[0]["live"], true);
    assert_eq!(nodes[0]["fsms"], json!(["Checkout@2"]));
    assert_eq!(nodes[1]["node_id"], "node-old");
    assert_eq!(nodes[1]["live"], false);

    let r = gd_on(&db, &["status"]).expect(0);
    let out = &r.stdout;
    let header = out
        .lines()
        .find(|l| l.starts_with("queue "))
        .expect("queue table");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "queue",
            "runnable",
            "executing",
            "awaiting_signal",
            "awaiting_children",
            "done",
            "failed",
            "ready",
            "lag",
            "keyed"
        ]
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("checkout "))
        .expect("checkout line");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &cells[..8],
        ["checkout", "4", "2", "1", "0", "1", "0", "3"],
        "{out}"
    );
    // The oldest ready row was made 90 s before the command ran (plus the test's time).
    assert_eq!(cells[8], "1m", "lag of {line:?}");
    let secs: u32 = cells[9].trim_end_matches('s').parse().unwrap();
    assert!((30..60).contains(&secs), "lag of {line:?}");
    assert_eq!(cells[10], "1", "keyed of {line:?}");
    assert!(
        out.contains("1 live node; live = announced in the last 60 s"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["mail", "Mail", "1", "1", "0"]),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("checkout  node-dead")),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("node-old  no")), "{out}");
    db.close().await;
}

#[tokio::test]
async fn inspect_shows_row_inbox_and_children() {
    let db = TestDb::new().await;
    let p = db.pool();
    let parent = Row::new("Fan", "default", "awaiting_children")
        .step("sum")
        .insert(p)
        .await;
    let done = Row::new("Leaf", "default", "done")
        .parent(parent)
        .insert(p)
        .await;
    let failed = Row::new("Leaf", "default", "failed")
        .parent(parent)
        .error("leaf broke")
        .insert(p)
        .await;
    let running = Row::new("Leaf", "default", "runnable")
        .parent(parent)
        .insert(p)
        .await;
    sqlx::query("UPDATE gd_instances SET children_pending = 1, state = '{\"n\": 3}' WHERE id = $1")
        .bind(parent)
        .execute(p)
        .await
        .unwrap();
    sqlx::query("INSERT INTO gd_signals (target_id, name, payload, dedup_key) VALUES ($1, 'nudge', '{\"k\": 1}', 'd-1')")
        .bind(parent)
        .execute(p)
        .await
        .unwrap();

    let j = gd_on(&db, &["inspect", &parent.to_string(), "--json"])
        .expect(0)
        .json();
    assert_eq!(j["instance"]["id"], parent);
    assert_eq!(j["instance"]["fsm"], "Fan");
    assert_eq!(j["instance"]["step"], "sum");
    assert_eq!(j["instance"]["status"], "awaiting_children");
    assert_eq!(j["instance"]["state"], json!({"n": 3}));
    assert_eq!(j["instance"]["children_pending"], 1);
    assert_eq!(j["inbox_total"], 1);
    assert_eq!(j["inbox"][0]["name"], "nudge");
    assert_eq!(j["inbox"][0]["payload"], json!({"k": 1}));
    assert_eq!(j["inbox"][0]["dedup_key"], "d-1");
    assert_eq!(
        j["children_by_status"],
        json!({"done": 1, "failed": 1, "runnable": 1})
    );
    let kids: Vec<i64> = j["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_i64().unwrap())
        .collect();
    assert_eq!(kids, [done, failed, running]);
    assert_eq!(j["children"][1]["last_error"], "leaf broke");

    let out = gd_on(&db, &["inspect", &parent.to_string()])
        .expect(0)
        .stdout;
    let field = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in:\n{out}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(field("status"), "awaiting_children");
    assert_eq!(field("step"), "sum");
    assert_eq!(field("state"), r#"{"n":3}"#);
    assert_eq!(field("last_error"), "-");
    assert!(out.contains("inbox: 1 signal\n"), "{out}");
    assert!(
        out.contains("children: 3 (done 1, failed 1, runnable 1)\n"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == [
                failed.to_string().as_str(),
                "Leaf",
                "v1",
                "run",
                "failed",
                "leaf",
                "broke"
            ]),
        "{out}"
    );
    db.close().await;
}

#[tokio::test]
async fn inspect_lists_at_most_100_children_but_counts_them_all() {
    let db = TestDb::new().await;
    let p = db.pool();
    let parent = Row::new("Fan", "default", "awaiting_children")
        .insert(p)
        .await;
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, parent_id)
         SELECT 'Leaf', 1, 'run', '{}', 'default', 'done', $1 FROM generate_series(1, 150)",
    )
    .bind(parent)
    .execute(p)
    .await
    .unwrap();
    let j = gd_on(&db, &["--json", "inspect", &parent.to_string()])
        .expect(0)
        .json();
    assert_eq!(j["children"].as_array().unwrap().len(), 100);
    assert_eq!(j["children_by_status"], json!({"done": 150}));
    let out = gd_on(&db, &["inspect", &parent.to_string()])
        .expect(0)
        .stdout;
    assert!(
        out.contains("children: 150 (done 150), the first 100 shown"),
        "{out}"
    );
    db.close().await;
}

#[tokio::test]
async fn inspect_unknown_id() {
    let db = TestDb::new().await;
    let r = gd_on(&db, &["inspect", "4242"]).expect(5);
    assert!(
        r.stderr.contains("no instance with id 4242"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("hint: check the id"), "{}", r.stderr);
    let r = gd_on(&db, &["inspect", "4242", "--json"]).expect(5);
    assert_eq!(r.json_error()["error"]["kind"], "not_found");
    assert!(r.stdout.is_empty());
    db.close().await;
}

#[tokio::test]
async fn status_shows_each_gate_keys_use_and_each_buckets_tokens() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "INSERT INTO gd_gates (name, size) VALUES ('stripe', 3), ('idle', 5);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                                   status, gate_slot)
         VALUES ('F', 1, 's', '{}', 'q', 'stripe', 'acme', 'executing', 0),
                ('F', 1, 's', '{}', 'q', 'stripe', 'acme', 'executing', 1),
                ('F', 1, 's', '{}', 'q', 'stripe', 'acme', 'runnable', NULL);
         INSERT INTO gd_rate_limits (name, per_second, burst)
         VALUES ('smtp', 2, 10), ('digest', 1.0 / 60, 1);
         INSERT INTO gd_buckets (name, key, tokens, at)
         VALUES ('smtp', 'eu', -4, now()), ('digest', 'all', 0.5, now());",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = gd_on(&db, &["status"]).expect(0).stdout;
    let line = |start: &str| {
        out.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line for {start}: {out}"))
            .to_string()
    };
    let acme: Vec<String> = line("stripe ")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(acme, ["stripe", "3", "\"acme\"", "2", "1"], "{out}");
    assert!(
        line("idle ").contains(" - "),
        "a gate with no key in use: {out}"
    );
    let smtp: Vec<String> = line("smtp ").split_whitespace().map(String::from).collect();
    assert_eq!(&smtp[..4], ["smtp", "2/s", "10", "\"eu\""], "{out}");
    // A slow rate reads as a period, and tokens with two decimals at most.
    let digest: Vec<String> = line("digest ")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(&digest[..5], ["digest", "1", "every", "1m", "0s"], "{out}");
    assert!(digest[7].len() <= 4, "tokens rounded: {out}");
    let tokens: f64 = smtp[4].parse().unwrap();
    assert!(
        (-4.0..-3.0).contains(&tokens),
        "refilled to now, still reserved: {out}"
    );
    let j = gd_on(&db, &["status", "--json"]).expect(0).json();
    let stripe = j["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == "stripe")
        .unwrap();
    assert_eq!(
        (&stripe["running"], &stripe["waiting"]),
        (&json!(2), &json!(1))
    );
    let smtp = j["rate_limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "smtp")
        .unwrap();
    assert_eq!(smtp["key"], "eu");
    db.close().await;
}
