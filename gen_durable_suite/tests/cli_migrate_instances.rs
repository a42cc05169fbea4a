//! `migrate-instances` through the CLI built into a user's binary (`gd_cli_upgrade`, whose
//! `main` calls `gen_durable_ops::main()` and links a v1 → v2 migration): a dry run
//! reports per outcome and writes nothing, the real run moves the rows and leaves the one
//! whose transform fails on v1 with its `last_error`.

mod common;

use std::process::Command;

use gen_durable_testkit::TestDb;
use serde_json::Value;

/// Runs the binary with `args` on `db`: (exit code, stdout as JSON).
fn run(db: &TestDb, args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_gd_cli_upgrade"))
        .args(["--database-url", &common::database_url(db), "--json"])
        .args(args)
        .output()
        .expect("run gd_cli_upgrade");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

async fn rows(db: &TestDb) -> Vec<(i32, String, Value, Option<String>)> {
    sqlx::query_as("SELECT fsm_version, step, state, last_error FROM gd_instances ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn migrate_instances_from_the_users_binary_reports_then_moves_the_rows() {
    let db = TestDb::new().await;
    for (plan, step) in [("basic", "charge"), ("pro", "notify"), ("gold", "charge")] {
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             VALUES ('billing', 1, $1, jsonb_build_object('plan', $2::text), 'billing')",
        )
        .bind(step)
        .bind(plan)
        .execute(db.pool())
        .await
        .unwrap();
    }
    let before = rows(&db).await;

    let (code, dry) = run(
        &db,
        &[
            "migrate-instances",
            "--fsm",
            "billing",
            "--to",
            "2",
            "--dry-run",
        ],
    );
    assert_eq!(code, 0, "{dry}");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["migrated"]["1"], 2, "{dry}");
    assert_eq!(dry["failed"], 1, "{dry}");
    assert_eq!(rows(&db).await, before, "a dry run writes nothing");

    let (code, done) = run(&db, &["migrate-instances", "--fsm", "billing", "--to", "2"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["migrated"]["1"], 2, "{done}");
    assert_eq!(done["failed"], 1);
    let error = done["failures"][0][1].as_str().unwrap();
    assert!(error.contains("no price for plan \"gold\""), "{error}");
    let after = rows(&db).await;
    assert_eq!(
        (after[0].0, after[0].1.as_str(), &after[0].2),
        (2, "charge", &serde_json::json!({"cents": 500}))
    );
    assert_eq!(
        (after[1].0, after[1].1.as_str(), &after[1].2),
        (2, "email", &serde_json::json!({"cents": 2000}))
    );
    assert_eq!(after[2].0, 1, "the refused row stays on v1");
    assert!(after[2].3.as_deref().unwrap().contains("no price"));
    db.close().await;
}
