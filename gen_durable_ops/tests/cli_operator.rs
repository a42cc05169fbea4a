//! The operator commands: pause / resume (and `status` listing paused queues), restart
//! from a step, and cancel / retry by filter with `--dry-run`.

mod cli_support;

use cli_support::{gd, gd_on, status_of, Row};
use gen_durable_testkit::TestDb;
use serde_json::json;

const USAGE: i32 = 2;
const NOT_FOUND: i32 = 5;
const CONFLICT: i32 = 6;

#[tokio::test]
async fn pause_and_resume_a_queue_shown_by_status() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms) VALUES ('n1', '{checkout,mail}', '{}')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let r = gd_on(&db, &["pause", "checkout", "--reason", "deploy 42"]).expect(0);
    assert!(
        r.stdout.contains("paused queue \"checkout\""),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("warning"), "{}", r.stdout);
    let j = gd_on(&db, &["--json", "pause", "checkout"])
        .expect(0)
        .json();
    assert_eq!(
        j,
        json!({ "queue": "checkout", "paused": true, "newly_paused": false, "warning": null })
    );

    let r = gd_on(&db, &["status"]).expect(0);
    assert!(r.stdout.contains("paused queues:"), "{}", r.stdout);
    assert!(r.stdout.contains("deploy 42"), "{}", r.stdout);
    let j = gd_on(&db, &["--json", "status"]).expect(0).json();
    assert_eq!(j["paused_queues"][0]["queue"], "checkout");
    assert_eq!(j["paused_queues"][0]["reason"], "deploy 42");

    let j = gd_on(&db, &["--json", "resume", "checkout"])
        .expect(0)
        .json();
    assert_eq!(j["resumed"], true);
    let r = gd_on(&db, &["resume", "checkout"]).expect(0);
    assert!(r.stdout.contains("was not paused"), "{}", r.stdout);
    let j = gd_on(&db, &["--json", "status"]).expect(0).json();
    assert_eq!(j["paused_queues"], json!([]));

    // A queue no node announced is paused (a node may start on it) with a warning that
    // names the queues nodes do pick.
    let r = gd_on(&db, &["pause", "chekout"]).expect(0);
    assert!(
        r.stdout
            .contains("warning: no node has announced queue \"chekout\"")
            && r.stdout.contains("the announced queues: checkout, mail"),
        "{}",
        r.stdout
    );
    let j = gd_on(&db, &["--json", "resume", "chekout"])
        .expect(0)
        .json();
    assert_eq!(j["resumed"], true);

    let r = gd_on(&db, &["pause", ""]).expect(USAGE);
    assert!(r.stderr.contains("invalid queue: is empty"), "{}", r.stderr);
    db.close().await;
}

#[tokio::test]
async fn restart_checks_the_step_against_live_nodes_and_refuses_executing_rows() {
    let db = TestDb::new().await;
    let p = db.pool();
    let done = Row::new("Checkout", "checkout", "done")
        .version(2)
        .step("ship")
        .insert(p)
        .await;
    let id = done.to_string();

    // The stock CLI links no FSM, and no node announces Checkout v2.
    let r = gd_on(&db, &["restart", &id, "--step", "reserve"]).expect(USAGE);
    assert!(
        r.stderr
            .contains("steps of FSM \"Checkout\" v2 are unknown"),
        "{}",
        r.stderr
    );
    assert_eq!(status_of(p, done).await.as_deref(), Some("done"));

    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms, steps)
         VALUES ('n1', '{checkout}', '{Checkout@2}', '{\"Checkout@2\": [\"reserve\", \"ship\"]}')",
    )
    .execute(p)
    .await
    .unwrap();
    let r = gd_on(&db, &["restart", &id, "--step", "teleport"]).expect(USAGE);
    assert!(
        r.stderr.contains("has no step \"teleport\""),
        "{}",
        r.stderr
    );

    let j = gd_on(&db, &["--json", "restart", &id, "--step", "reserve"])
        .expect(0)
        .json();
    assert_eq!(
        j,
        json!({ "id": done, "restarted": true, "step": "reserve" })
    );
    let (status, step): (String, String) =
        sqlx::query_as("SELECT status::text, step FROM gd_instances WHERE id = $1")
            .bind(done)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!((status.as_str(), step.as_str()), ("runnable", "reserve"));

    let running = Row::new("Checkout", "checkout", "executing")
        .version(2)
        .insert(p)
        .await;
    let r = gd_on(&db, &["restart", &running.to_string(), "--step", "ship"]).expect(CONFLICT);
    assert!(r.stderr.contains("a step of it is running"), "{}", r.stderr);
    gd_on(&db, &["restart", "999999", "--step", "ship"]).expect(NOT_FOUND);
    db.close().await;
}

/// `restart --entry` takes a history entry's step and state; `fork` needs the FSM's code,
/// which the stock CLI does not link, and says so; both refuse what has no state.
#[tokio::test]
async fn restart_from_an_entry_and_fork_from_the_cli() {
    let db = TestDb::new().await;
    let p = db.pool();
    let done = Row::new("Checkout", "checkout", "done")
        .version(2)
        .step("ship")
        .insert(p)
        .await;
    let id = done.to_string();
    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms, steps)
         VALUES ('n1', '{checkout}', '{Checkout@2}', '{\"Checkout@2\": [\"reserve\", \"ship\"]}')",
    )
    .execute(p)
    .await
    .unwrap();
    let entries: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO gd_history (instance_id, at, kind, step, attempt, state)
         VALUES ($1, now(), 'next', 'reserve', 1, '{\"order\": 7}'),
                ($1, now(), 'done', 'ship', 1, NULL)
         RETURNING entry",
    )
    .bind(done)
    .fetch_all(p)
    .await
    .unwrap();
    let (full, bare) = (entries[0].to_string(), entries[1].to_string());

    let r = gd_on(&db, &["restart", &id, "--entry", &bare]).expect(USAGE);
    assert!(r.stderr.contains("holds no state"), "{}", r.stderr);
    gd_on(&db, &["restart", &id, "--entry", "999999"]).expect(NOT_FOUND);
    gd_on(&db, &["restart", &id, "--entry", &full, "--step", "ship"]).expect(USAGE);
    let j = gd_on(&db, &["--json", "restart", &id, "--entry", &full])
        .expect(0)
        .json();
    assert_eq!(
        j,
        json!({ "id": done, "restarted": true, "entry": entries[0] })
    );
    let (status, step, state): (String, String, serde_json::Value) =
        sqlx::query_as("SELECT status::text, step, state FROM gd_instances WHERE id = $1")
            .bind(done)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), step.as_str(), state),
        ("runnable", "reserve", json!({"order": 7}))
    );

    let r = gd_on(&db, &["fork", &id, "--entry", &full]).expect(USAGE);
    assert!(r.stderr.contains("gen_durable_ops::main()"), "{}", r.stderr);
    let instances: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_instances")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(instances, 1, "a refused fork inserts nothing");
    db.close().await;
}

#[tokio::test]
async fn cancel_and_retry_by_filter_with_a_dry_run() {
    let db = TestDb::new().await;
    let p = db.pool();
    let mut old = Vec::new();
    for _ in 0..3 {
        old.push(
            Row::new("Sync", "jobs", "runnable")
                .age_secs(7_200)
                .insert(p)
                .await,
        );
    }
    let young = Row::new("Sync", "jobs", "runnable").insert(p).await;
    let other = Row::new("Mail", "jobs", "runnable")
        .age_secs(7_200)
        .insert(p)
        .await;

    let args = [
        "cancel",
        "--queue",
        "jobs",
        "--fsm",
        "Sync",
        "--older-than",
        "1h",
    ];
    let r = gd_on(&db, &[&args[..], &["--dry-run"]].concat()).expect(0);
    assert!(
        r.stdout
            .starts_with("dry run: 3 live instance(s) match queue=jobs fsm=Sync older-than=1h"),
        "{}",
        r.stdout
    );
    assert_eq!(status_of(p, old[0]).await.as_deref(), Some("runnable"));

    let j = gd_on(&db, &[&["--json"][..], &args[..]].concat())
        .expect(0)
        .json();
    assert_eq!(
        (j["matched"].as_u64(), j["changed"].as_u64()),
        (Some(3), Some(3))
    );
    for id in &old {
        assert_eq!(status_of(p, *id).await.as_deref(), Some("failed"));
    }
    assert_eq!(status_of(p, young).await.as_deref(), Some("runnable"));
    assert_eq!(status_of(p, other).await.as_deref(), Some("runnable"));
    // By the text of their last error, in any case: the three just cancelled.
    for (text, matched) in [("CANCEL", 3), ("boom", 0)] {
        let j = gd_on(
            &db,
            &[
                "--json",
                "retry",
                "--fsm",
                "Sync",
                "--error-contains",
                text,
                "--dry-run",
            ],
        )
        .expect(0)
        .json();
        assert_eq!(j["matched"], matched, "{text}");
    }

    // Nothing matches: a count of 0, not an error.
    let j = gd_on(&db, &["--json", "cancel", "--fsm", "Nope"])
        .expect(0)
        .json();
    assert_eq!(j["matched"], 0);

    let j = gd_on(&db, &["--json", "retry", "--fsm", "Sync", "--dry-run"])
        .expect(0)
        .json();
    assert_eq!(
        (j["matched"].as_u64(), j["dry_run"].as_bool()),
        (Some(3), Some(true))
    );
    assert_eq!(status_of(p, old[0]).await.as_deref(), Some("failed"));
    let r = gd_on(&db, &["retry", "--fsm", "Sync"]).expect(0);
    assert!(
        r.stdout.starts_with("retried 3 of 3 failed instance(s)"),
        "{}",
        r.stdout
    );
    for id in &old {
        assert_eq!(status_of(p, *id).await.as_deref(), Some("runnable"));
    }
    db.close().await;
}

#[test]
fn bulk_forms_are_checked_before_connecting() {
    // An id and a filter, or neither: usage errors from clap.
    gd(&["cancel", "1", "--fsm", "F"]).expect(USAGE);
    gd(&["cancel"]).expect(USAGE);
    gd(&["retry", "--dry-run"]).expect(USAGE);
    let r = gd(&["cancel", "--fsm", "F", "--status", "sleeping"]).expect(USAGE);
    assert!(r.stderr.contains("is not a status"), "{}", r.stderr);
    gd(&["restart", "1"]).expect(USAGE);
}
