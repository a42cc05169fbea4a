//! The CLI commands that change something: migrate, signal, cancel, retry, gc.

mod cli_support;

use cli_support::{gd_on, status_of, Row};
use gen_durable_testkit::TestDb;
use serde_json::json;

const USAGE: i32 = 2;
const NOT_FOUND: i32 = 5;
const CONFLICT: i32 = 6;

#[tokio::test]
async fn migrate_is_idempotent() {
    let db = TestDb::new().await;
    let r = gd_on(&db, &["migrate-schema"]).expect(0);
    assert!(r.stdout.starts_with("already up to date ("), "{}", r.stdout);
    let j = gd_on(&db, &["migrate-schema", "--json"]).expect(0).json();
    assert_eq!(j["applied"], json!([]));
    assert!(j["schema_version"].as_i64().unwrap() >= 3);
    db.close().await;
}

#[tokio::test]
async fn signal_wakes_stores_deduplicates_and_refuses() {
    let db = TestDb::new().await;
    let p = db.pool();
    let parked = Row::new("Checkout", "checkout", "awaiting_signal")
        .step("ship")
        .insert(p)
        .await;
    sqlx::query("UPDATE gd_instances SET awaits = '{payment_confirmed}' WHERE id = $1")
        .bind(parked)
        .execute(p)
        .await
        .unwrap();
    let id = parked.to_string();

    // Not awaited: stored, no wake-up.
    let r = gd_on(&db, &["signal", &id, "note", r#""hello""#]).expect(0);
    assert!(r.stdout.contains("waits in its inbox"), "{}", r.stdout);
    assert_eq!(
        status_of(p, parked).await.as_deref(),
        Some("awaiting_signal")
    );

    // Awaited: stored and woken; then the same dedup key stores nothing.
    let j = gd_on(
        &db,
        &[
            "--json",
            "signal",
            &id,
            "payment_confirmed",
            r#"{"amount": 100}"#,
            "--dedup-key",
            "evt-7",
        ],
    )
    .expect(0)
    .json();
    assert_eq!(j["woke"], true);
    assert_eq!(j["deduplicated"], false);
    assert!(j["signal_id"].is_i64());
    assert_eq!(status_of(p, parked).await.as_deref(), Some("runnable"));
    let r = gd_on(
        &db,
        &[
            "signal",
            &id,
            "payment_confirmed",
            r#"{"amount": 100}"#,
            "--dedup-key",
            "evt-7",
        ],
    )
    .expect(0);
    assert!(
        r.stdout.contains(r#"nothing stored: instance "#),
        "{}",
        r.stdout
    );
    let payloads: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT payload FROM gd_signals WHERE target_id = $1 ORDER BY id")
            .bind(parked)
            .fetch_all(p)
            .await
            .unwrap();
    assert_eq!(payloads, [json!("hello"), json!({"amount": 100})]);

    // Bad JSON, a bad name, an unknown id, a finished instance: nothing stored.
    let r = gd_on(&db, &["signal", &id, "x", "{amount: 1}"]).expect(USAGE);
    assert!(r.stderr.contains("the payload is not JSON"), "{}", r.stderr);
    assert!(r.stderr.contains("quoted for your shell"), "{}", r.stderr);
    let r = gd_on(&db, &["signal", &id, "", "{}"]).expect(USAGE);
    assert!(
        r.stderr.contains("signal name must be 1 to 255 bytes"),
        "{}",
        r.stderr
    );
    let r = gd_on(&db, &["signal", "999999", "x", "{}"]).expect(NOT_FOUND);
    assert!(
        r.stderr.contains("no instance with id 999999"),
        "{}",
        r.stderr
    );
    let done = Row::new("Checkout", "checkout", "done").insert(p).await;
    let r = gd_on(&db, &["signal", &done.to_string(), "x", "{}"]).expect(CONFLICT);
    assert!(
        r.stderr.contains("has already finished (done)"),
        "{}",
        r.stderr
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_signals")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(stored, 2);
    db.close().await;
}

#[tokio::test]
async fn cancel_fails_the_instance_and_its_live_children() {
    let db = TestDb::new().await;
    let p = db.pool();
    let parent = Row::new("Fan", "default", "awaiting_children")
        .insert(p)
        .await;
    let child = Row::new("Leaf", "default", "runnable")
        .parent(parent)
        .insert(p)
        .await;
    let finished = Row::new("Leaf", "default", "done")
        .parent(parent)
        .insert(p)
        .await;
    sqlx::query("UPDATE gd_instances SET children_pending = 1 WHERE id = $1")
        .bind(parent)
        .execute(p)
        .await
        .unwrap();

    let r = gd_on(&db, &["cancel", &parent.to_string()]).expect(0);
    assert!(
        r.stdout.contains(&format!(
            "cancelled instance {parent}: 2 instance(s) failed"
        )),
        "{}",
        r.stdout
    );
    assert_eq!(status_of(p, parent).await.as_deref(), Some("failed"));
    assert_eq!(status_of(p, child).await.as_deref(), Some("failed"));
    assert_eq!(status_of(p, finished).await.as_deref(), Some("done"));
    // The history records the cancel of both, as done by the user who ran the command.
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.trim().is_empty()));
    let by = user.map_or("cli".to_string(), |u| format!("{} (cli)", u.trim()));
    for id in [parent, child] {
        let h = gd_on(&db, &["history", &id.to_string(), "--json"])
            .expect(0)
            .json();
        assert_eq!(h[0]["kind"], "cancelled", "{h}");
        assert_eq!(h[0]["actor"], by.as_str(), "{h}");
    }
    let h = gd_on(&db, &["history", &parent.to_string()]).expect(0);
    assert!(h.stdout.contains(&by), "{}", h.stdout);

    let r = gd_on(&db, &["cancel", &parent.to_string()]).expect(CONFLICT);
    assert!(
        r.stderr.contains("already finished (failed)"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&format!("`gen_durable retry {parent}`")),
        "{}",
        r.stderr
    );
    gd_on(&db, &["cancel", "999999"]).expect(NOT_FOUND);

    let other = Row::new("Leaf", "default", "awaiting_signal")
        .insert(p)
        .await;
    let j = gd_on(&db, &["cancel", &other.to_string(), "--json"])
        .expect(0)
        .json();
    assert_eq!(
        j,
        json!({"id": other, "failed": 1, "after_current_step": 0})
    );
    db.close().await;
}

#[tokio::test]
async fn retry_makes_a_failed_instance_runnable() {
    let db = TestDb::new().await;
    let p = db.pool();
    let failed = Row::new("Mail", "mail", "failed")
        .step("send")
        .error("smtp down")
        .insert(p)
        .await;
    let r = gd_on(&db, &["retry", &failed.to_string()]).expect(0);
    assert!(r.stdout.contains("is runnable again"), "{}", r.stdout);
    let (status, step, attempt): (String, String, i32) =
        sqlx::query_as("SELECT status::text, step, attempt FROM gd_instances WHERE id = $1")
            .bind(failed)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), step.as_str(), attempt),
        ("runnable", "send", 0)
    );

    let r = gd_on(&db, &["retry", &failed.to_string()]).expect(CONFLICT);
    assert!(
        r.stderr.contains("only a failed instance can be retried"),
        "{}",
        r.stderr
    );
    let r = gd_on(&db, &["retry", "999999", "--json"]).expect(NOT_FOUND);
    assert_eq!(r.json_error()["error"]["exit_code"], NOT_FOUND);
    db.close().await;
}

#[tokio::test]
async fn gc_deletes_old_terminal_rows_in_batches_and_keeps_children_of_live_parents() {
    let db = TestDb::new().await;
    let p = db.pool();
    const DAY: i64 = 86_400;
    let old_done = Row::new("A", "q", "done").age_secs(8 * DAY).insert(p).await;
    let old_failed = Row::new("A", "q", "failed")
        .age_secs(8 * DAY)
        .insert(p)
        .await;
    let recent_done = Row::new("A", "q", "done").age_secs(DAY).insert(p).await;
    let old_live = Row::new("A", "q", "runnable")
        .age_secs(8 * DAY)
        .insert(p)
        .await;
    let live_parent = Row::new("P", "q", "awaiting_children").insert(p).await;
    let kept_child = Row::new("C", "q", "done")
        .parent(live_parent)
        .age_secs(8 * DAY)
        .insert(p)
        .await;
    let done_parent = Row::new("P", "q", "done").age_secs(DAY).insert(p).await;
    let freed_child = Row::new("C", "q", "done")
        .parent(done_parent)
        .age_secs(8 * DAY)
        .insert(p)
        .await;
    sqlx::query("INSERT INTO gd_signals (target_id, name, payload) VALUES ($1, 'late', 'null')")
        .bind(old_live)
        .execute(p)
        .await
        .unwrap();

    // Default: older than 7 days.
    let r = gd_on(&db, &["gc"]).expect(0);
    assert_eq!(
        r.stdout,
        "deleted 3 done/failed instance(s) last updated more than 7d ago (1 batch)\n"
    );
    for gone in [old_done, old_failed, freed_child] {
        assert_eq!(status_of(p, gone).await, None, "{gone} should be deleted");
    }
    for kept in [recent_done, old_live, live_parent, kept_child, done_parent] {
        assert!(status_of(p, kept).await.is_some(), "{kept} should be kept");
    }

    // 2,500 more old rows: three batches of at most 1,000.
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, updated_at)
         SELECT 'A', 1, 'run', '{}', 'q', 'done', now() - interval '2 days'
           FROM generate_series(1, 2500)",
    )
    .execute(p)
    .await
    .unwrap();
    let j = gd_on(&db, &["--json", "gc", "--older-than", "36h"])
        .expect(0)
        .json();
    assert_eq!(
        j,
        json!({"deleted": 2500, "batches": 3, "older_than_seconds": 36 * 3600})
    );
    let r = gd_on(&db, &["gc", "--older-than", "36h"]).expect(0);
    assert!(r.stdout.starts_with("deleted 0 "), "{}", r.stdout);
    for kept in [recent_done, old_live, live_parent, kept_child, done_parent] {
        assert!(status_of(p, kept).await.is_some(), "{kept} should be kept");
    }
    db.close().await;
}

#[tokio::test]
async fn signal_and_inspect_by_key() {
    let db = TestDb::new().await;
    let p = db.pool();
    let holder = Row::new("Checkout", "checkout", "awaiting_signal")
        .step("ship")
        .insert(p)
        .await;
    sqlx::query(
        "UPDATE gd_instances SET awaits = '{paid}', unique_key = 'order:9',
                unique_scope = '{runnable,executing,awaiting_signal,awaiting_children}'
          WHERE id = $1",
    )
    .bind(holder)
    .execute(p)
    .await
    .unwrap();

    let j = gd_on(&db, &["--json", "signal", "--key", "order:9", "paid", "{}"])
        .expect(0)
        .json();
    assert_eq!(j["id"], holder);
    assert_eq!(j["woke"], true);
    let j = gd_on(&db, &["--json", "inspect", "--key", "order:9"])
        .expect(0)
        .json();
    assert_eq!(j["instance"]["id"], holder);

    // No holder: not found, nothing stored; a key with an id is a usage error.
    let r = gd_on(&db, &["signal", "--key", "order:10", "paid", "{}"]).expect(NOT_FOUND);
    assert!(
        r.stderr
            .contains(r#"no live instance holds the key "order:10""#),
        "{}",
        r.stderr
    );
    let r = gd_on(&db, &["signal", "--key", "order:9", "1", "paid", "{}"]).expect(USAGE);
    assert!(
        r.stderr.contains("with --key, pass only NAME and JSON"),
        "{}",
        r.stderr
    );
    let r = gd_on(&db, &["inspect", "--key", "order:10"]).expect(NOT_FOUND);
    assert!(r.stderr.contains("order:10"), "{}", r.stderr);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_signals")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(stored, 1);

    // Once the holder finished (freeing the key), inspect --key still finds it.
    sqlx::query("UPDATE gd_instances SET status = 'done' WHERE id = $1")
        .bind(holder)
        .execute(p)
        .await
        .unwrap();
    let j = gd_on(&db, &["--json", "inspect", "--key", "order:9"])
        .expect(0)
        .json();
    assert_eq!(j["instance"]["id"], holder);
    db.close().await;
}
