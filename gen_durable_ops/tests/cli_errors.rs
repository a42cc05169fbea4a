//! The CLI's failures: each says what to do, and exits with its own code.

mod cli_support;

use cli_support::{gd, gd_on};
use gen_durable_testkit::TestDb;

const USAGE: i32 = 2;
const CONNECT: i32 = 3;
const NOT_MIGRATED: i32 = 4;

#[test]
fn help_lists_every_command_and_the_exit_codes() {
    let r = gd(&["--help"]).expect(0);
    for cmd in [
        "migrate-schema",
        "status",
        "inspect",
        "explain",
        "signal",
        "cancel",
        "retry",
        "gc",
        "migrate-instances",
        "restart",
        "pause",
        "resume",
    ] {
        assert!(r.stdout.contains(cmd), "{cmd} missing from:\n{}", r.stdout);
    }
    assert!(r.stdout.contains("4  the database is not migrated"));
}

#[test]
fn no_database_url() {
    let r = gd(&["status"]).expect(CONNECT);
    assert!(r.stderr.contains("no database given"), "{}", r.stderr);
    assert!(r.stderr.contains("--database-url"), "{}", r.stderr);
    assert!(r.stderr.contains("DATABASE_URL"), "{}", r.stderr);
}

/// `cargo gd` in this tree, given no URL, looks at the examples' database
/// (`.cargo/config.toml` names it) and says so; an explicit URL wins over it.
#[tokio::test]
async fn the_trees_default_database_is_named_on_stderr() {
    let db = TestDb::new().await;
    let url = cli_support::url_of(db.name());
    let default = [("GEN_DURABLE_CLI_DEFAULT_URL", url.as_str())];
    let r = cli_support::gd_with_env(&["status"], &default).expect(0);
    assert!(
        r.stderr
            .contains(&format!("database: {url} (this tree's default")),
        "{}",
        r.stderr
    );
    let r = cli_support::gd_with_env(&["--json", "status"], &default).expect(0);
    assert_eq!(r.stderr, "", "JSON output names nothing on stderr");
    let r = cli_support::gd_with_env(
        &[
            "--database-url",
            "postgres://someone@127.0.0.1:1/db",
            "status",
        ],
        &default,
    )
    .expect(CONNECT);
    assert!(r.stderr.contains("127.0.0.1:1/db"), "{}", r.stderr);
    db.close().await;
}

#[test]
fn malformed_url() {
    let r = gd(&["--database-url", "not a url", "status"]).expect(CONNECT);
    assert!(r.stderr.contains("is not a PostgreSQL URL"), "{}", r.stderr);
    assert!(r.stderr.contains("hint: write it as postgres://"));
}

#[test]
fn unreachable_server_masks_the_password() {
    // Port 1 on the loopback refuses at once.
    let r = gd(&[
        "--database-url",
        "postgres://someone:s3cret@127.0.0.1:1/db",
        "status",
    ])
    .expect(CONNECT);
    assert!(
        r.stderr
            .contains("cannot connect to postgres://someone:***@127.0.0.1:1/db"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
    assert!(r.stderr.contains("check that the server is up"));
}

#[tokio::test]
async fn missing_database() {
    let r = gd(&[
        "--database-url",
        &cli_support::url_of("gd_cli_no_such_database"),
        "status",
    ])
    .expect(CONNECT);
    assert!(r.stderr.contains("does not exist"), "{}", r.stderr);
    assert!(r.stderr.contains("then run `gen_durable migrate-schema`"));
}

#[tokio::test]
async fn not_migrated_then_migrate() {
    let db = TestDb::new().await;
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(db.pool())
        .await
        .unwrap();

    for args in [
        &["status"][..],
        &["inspect", "1"],
        &["signal", "1", "go", "{}"],
        &["cancel", "1"],
        &["retry", "1"],
        &["gc"],
    ] {
        let r = gd_on(&db, args).expect(NOT_MIGRATED);
        assert!(
            r.stderr.contains("this database has no gen_durable schema"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("run `gen_durable migrate-schema`"),
            "{}",
            r.stderr
        );
    }
    let r = gd_on(&db, &["--json", "status"]).expect(NOT_MIGRATED);
    assert_eq!(r.json_error()["error"]["kind"], "not_migrated");

    let r = gd_on(&db, &["migrate-schema"]).expect(0);
    assert!(
        r.stdout.starts_with("migrated: applied 0001 instances"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("0003 nodes"), "{}", r.stdout);
    assert!(r.stdout.contains("0004 commit"), "{}", r.stdout);
    assert!(r.stdout.contains("0005 contention"), "{}", r.stdout);
    assert!(r.stdout.contains("0008 schedules"), "{}", r.stdout);
    assert!(r.stdout.contains("0009 queue pauses"), "{}", r.stdout);
    assert!(r.stdout.contains("0010 node steps"), "{}", r.stdout);
    gd_on(&db, &["status"]).expect(0);
    db.close().await;
}

/// The CLI runs on the schema its gen_durable embeds, as the engine does: a database
/// that lacks a migration is "not migrated" naming what it lacks, one migrated by a later
/// gen_durable says so.
#[tokio::test]
async fn a_schema_older_or_newer_than_the_cli() {
    let db = TestDb::new().await;
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(db.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(newest)
        .execute(db.pool())
        .await
        .unwrap();
    let r = gd_on(&db, &["status"]).expect(NOT_MIGRATED);
    assert!(
        r.stderr.contains(&format!(
            "older than this CLI: it is at migration {}, and migrations [{newest}] are missing",
            newest - 1
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("run `gen_durable migrate-schema`"));

    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'restored', true, '\\x00', 0), ($1 + 1, 'from a later version', true, '\\x00', 0)",
    )
    .bind(newest)
    .execute(db.pool())
    .await
    .unwrap();
    let r = gd_on(&db, &["status"]).expect(1);
    assert!(
        r.stderr.contains("migrated by a later gen_durable"),
        "{}",
        r.stderr
    );
    db.close().await;
}

#[test]
fn bad_arguments_are_usage_errors() {
    // Parsed before connecting, so no database is needed.
    let r = gd(&["inspect", "abc"]).expect(USAGE);
    assert!(r.stderr.contains("invalid value 'abc'"), "{}", r.stderr);
    let r = gd(&["gc", "--older-than", "3 weeks"]).expect(USAGE);
    assert!(
        r.stderr
            .contains("write a whole number and a unit, e.g. 7d"),
        "{}",
        r.stderr
    );
    let r = gd(&["signal", "1", "go"]).expect(USAGE);
    assert!(r.stderr.contains("pass ID NAME JSON"), "{}", r.stderr);
    gd(&["signal", "--key", "k", "1", "go", "{}"]).expect(USAGE);
    gd(&["frobnicate"]).expect(USAGE);
}

/// Instance migrations are the user's Rust code: the stock binary links none, and says
/// how to run the command from a binary that does. Nothing is written.
#[tokio::test]
async fn migrate_instances_from_the_stock_binary_says_where_to_run_it() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue) VALUES ('Order', 1, 's', '{}', 'q')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let r = gd_on(&db, &["migrate-instances", "--fsm", "Order", "--to", "2"]).expect(USAGE);
    assert!(
        r.stderr
            .contains("no instance migration of FSM \"Order\" from v1 to v2"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("gen_durable_ops::main()"), "{}", r.stderr);
    let version: i32 = sqlx::query_scalar("SELECT fsm_version FROM gd_instances")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(version, 1);
    db.close().await;
}
