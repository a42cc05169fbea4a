//! `gen_durable explain`: the reason's line and its evidence, or the Explanation as JSON.

mod cli_support;

use cli_support::{gd_on, Row};
use gen_durable_testkit::TestDb;

const NOT_FOUND: i32 = 5;

/// A row parked on "paid" for 3 more minutes, with an unrelated signal in its inbox and
/// a correlation key.
async fn parked(db: &TestDb) -> i64 {
    let p = db.pool();
    let id = Row::new("Checkout", "checkout", "awaiting_signal")
        .step("ship")
        .insert(p)
        .await;
    sqlx::query(
        "UPDATE gd_instances
            SET awaits = '{paid}', await_deadline = now() + interval '3 min 30 s',
                unique_key = 'order:42', unique_scope = '{runnable,executing,awaiting_signal,awaiting_children}'
          WHERE id = $1",
    )
    .bind(id)
    .execute(p)
    .await
    .unwrap();
    sqlx::query("INSERT INTO gd_signals (target_id, name, payload) VALUES ($1, 'shipped', '{}')")
        .bind(id)
        .execute(p)
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn explain_prints_the_reason_then_its_evidence() {
    let db = TestDb::new().await;
    let id = parked(&db).await;
    let r = gd_on(&db, &["explain", &id.to_string()]).expect(0);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines[0].starts_with("awaiting signal \"paid\" until "),
        "{}",
        r.stdout
    );
    assert!(
        lines[0].ends_with(" UTC (in 3 min); 1 unrelated signal in the inbox: \"shipped\""),
        "{}",
        r.stdout
    );
    assert_eq!(
        lines[1],
        format!("  instance: {id} (Checkout v1) in queue \"checkout\"")
    );
    assert_eq!(
        lines[2],
        "  status: awaiting_signal at step \"ship\", attempt 1"
    );
    assert!(lines.contains(&"  awaits: \"paid\""), "{}", r.stdout);
    assert!(
        lines.contains(&"  unrelated signals: 1 \"shipped\""),
        "{}",
        r.stdout
    );

    // By key: the same instance.
    let r = gd_on(&db, &["explain", "--key", "order:42"]).expect(0);
    assert!(
        r.stdout.contains(&format!("instance: {id} ")),
        "{}",
        r.stdout
    );
    db.close().await;
}

#[tokio::test]
async fn explain_json_is_the_explanation() {
    let db = TestDb::new().await;
    let id = parked(&db).await;
    let j = gd_on(&db, &["--json", "explain", &id.to_string()])
        .expect(0)
        .json();
    assert_eq!(j["id"], id);
    assert_eq!(j["fsm"], "Checkout");
    assert_eq!(j["status"], "awaiting_signal");
    assert_eq!(j["reason"]["kind"], "awaiting_signals");
    assert_eq!(j["reason"]["names"], serde_json::json!(["paid"]));
    assert_eq!(
        j["reason"]["unrelated"],
        serde_json::json!({ "n": 1, "capped": false })
    );
    assert_eq!(
        j["reason"]["unrelated_names"],
        serde_json::json!(["shipped"])
    );
    assert!(j["reason"]["deadline"].is_string());
    // It reads back as the library's type.
    let back: gen_durable::Explanation = serde_json::from_value(j).unwrap();
    assert_eq!(back.id, id);

    // A runnable row no node runs says so.
    let lone = Row::new("Report", "reports", "runnable")
        .insert(db.pool())
        .await;
    let r = gd_on(&db, &["explain", &lone.to_string()]).expect(0);
    assert!(
        r.stdout
            .starts_with("no live node serves queue \"reports\" (no node is live at all)\n"),
        "{}",
        r.stdout
    );
    db.close().await;
}

#[tokio::test]
async fn explain_of_an_unknown_id_or_key_is_not_found() {
    let db = TestDb::new().await;
    let r = gd_on(&db, &["explain", "4242"]).expect(NOT_FOUND);
    assert!(
        r.stderr.contains("no instance with id 4242"),
        "{}",
        r.stderr
    );
    let r = gd_on(&db, &["--json", "explain", "--key", "nobody"]).expect(NOT_FOUND);
    assert_eq!(r.json_error()["error"]["kind"], "not_found");
    db.close().await;
}
