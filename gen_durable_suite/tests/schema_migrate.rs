//! `gen_durable::migrate_schema` is idempotent and safe to run from several places at once.

use gen_durable_testkit::TestDb;

#[tokio::test]
async fn migrate_twice_and_from_two_tasks_at_once() {
    // TestDb::new() has migrated once already.
    let db = TestDb::new().await;
    gen_durable::migrate_schema(db.pool())
        .await
        .expect("second run is a no-op");

    // Two separate pools (as two processes would have) racing on a fresh database.
    let fresh = TestDb::new().await;
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(fresh.pool())
        .await
        .unwrap();
    let a = fresh.new_pool(2).await;
    let b = fresh.new_pool(2).await;
    let (ra, rb) = tokio::join!(
        gen_durable::migrate_schema(&a),
        gen_durable::migrate_schema(&b)
    );
    ra.expect("first migrator");
    rb.expect("second migrator");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&a)
        .await
        .unwrap();
    assert_eq!(applied, gen_durable::backend::schema::embedded() as i64);
    db.close().await;
    fresh.close().await;
}

/// The engine refuses a database without the schema, one behind this version and one
/// ahead of it, each with a typed error that says what to do, and writes nothing.
#[tokio::test]
async fn the_engine_refuses_a_schema_it_cannot_run_on() {
    let start = |pool: sqlx::PgPool| async move {
        gen_durable::Engine::builder(pool)
            .register::<gen_durable_suite::fsms::Audited>()
            .queue("audited", 1)
            .start()
            .await
    };
    let tables = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    // No schema at all.
    let empty = TestDb::new().await;
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(empty.pool())
        .await
        .unwrap();
    let err = start(empty.pool().clone()).await.expect_err("refused");
    assert!(
        matches!(err, gen_durable::Error::SchemaBehind { applied: None, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("migrate-schema"), "{err}");
    assert_eq!(tables(empty.pool().clone()).await, 0, "wrote a table");
    empty.close().await;

    // Behind: the newest migration not applied.
    let behind = TestDb::new().await;
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(behind.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(newest)
        .execute(behind.pool())
        .await
        .unwrap();
    let err = start(behind.pool().clone()).await.expect_err("refused");
    match &err {
        gen_durable::Error::SchemaBehind { applied, missing } => {
            assert_eq!(*applied, Some(newest - 1));
            assert_eq!(missing, &vec![newest]);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("migrate-schema"), "{err}");
    behind.close().await;

    // Ahead: a migration this version does not know.
    let ahead = TestDb::new().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         SELECT max(version) + 1, 'from a later version', true, '\\x00', 0 FROM _sqlx_migrations",
    )
    .execute(ahead.pool())
    .await
    .unwrap();
    let err = start(ahead.pool().clone()).await.expect_err("refused");
    assert!(
        matches!(&err, gen_durable::Error::SchemaAhead { unknown, .. } if unknown.len() == 1),
        "{err:?}"
    );
    let nodes: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_nodes")
        .fetch_one(ahead.pool())
        .await
        .unwrap();
    assert_eq!(nodes, 0, "the refused engine announced itself");
    // Migrating it with this version is refused the same way, not with sqlx's "migration
    // N was previously applied but is missing".
    let err = gen_durable::migrate_schema(ahead.pool())
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, gen_durable::Error::SchemaAhead { unknown, .. } if unknown.len() == 1),
        "{err:?}"
    );
    assert!(err.to_string().contains("later gen_durable"), "{err}");
    ahead.close().await;

    // The schema as this version embeds it: the engine starts.
    let db = TestDb::new().await;
    let engine = start(db.pool().clone()).await.expect("starts");
    engine.shutdown(std::time::Duration::from_secs(5)).await;
    db.close().await;
}

/// The migrations up to (not including) `version`, as an earlier release embedded them.
async fn migrate_before(pool: &sqlx::PgPool, version: i64) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../gen_durable/migrations");
    let mut m = sqlx::migrate::Migrator::new(std::path::Path::new(dir))
        .await
        .unwrap();
    m.migrations = m
        .migrations
        .iter()
        .filter(|m| m.version < version)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    m.run(pool).await.unwrap();
}

/// Migration 32 (the ready log) on a database in use: it refuses to run while a node of
/// the earlier version is live; once the nodes are stopped it runs, and the rows in flight
/// (runnable plain rows, a row with a K = 1 key, a row an earlier node was running when it
/// stopped) each run every step once on a new node.
#[tokio::test]
async fn migration_32_refuses_live_nodes_then_moves_rows_in_flight() {
    use gen_durable_suite::fsms::{create_audit_table, Audited};
    let db = TestDb::new().await;
    let pool = db.pool().clone();
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(&pool)
        .await
        .unwrap();
    migrate_before(&pool, 32).await;
    create_audit_table(&pool).await.unwrap();
    // Rows as the earlier version left them: three runnable plain rows, one with a key,
    // one executing on a node that has since stopped (its lease ran out).
    sqlx::raw_sql(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'Audited', 1, 'one', '{}', 'audited', CASE WHEN g = 4 THEN 'k' END
           FROM generate_series(1, 4) g;
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at)
         VALUES ('Audited', 1, 'two', '{\"trail\": [\"one\"]}', 'audited', 'executing',
                 'old-node', 7, now() - interval '1 minute');
         INSERT INTO gd_audit (instance, step, node)
         SELECT id, 'one', 'old-node' FROM gd_instances WHERE status = 'executing';
         INSERT INTO gd_nodes (node_id, queues, fsms) VALUES ('old-node', '{audited}', '{Audited@1}');",
    )
    .execute(&pool)
    .await
    .unwrap();

    let err = gen_durable::migrate_schema(&pool)
        .await
        .expect_err("refused while a node is live");
    assert!(err.to_string().contains("old-node"), "{err}");
    let applied: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(applied, 31, "the refused migration was recorded");

    // The earlier node stops (a graceful stop deletes its row), then the migration runs,
    // on the same pool: the refused attempt left no migration lock behind on it (sqlx keeps
    // its lock when a migration fails; this waited for it for ever).
    sqlx::query("DELETE FROM gd_nodes")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        gen_durable::migrate_schema(&pool),
    )
    .await
    .expect("the second attempt waited for the first one's lock")
    .unwrap();
    let engine = gen_durable::Engine::builder(pool.clone())
        .register::<Audited>()
        .queue("audited", 8)
        .start()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE status <> 'done'")
                .fetch_one(&pool)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{left} rows not done");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    engine.shutdown(std::time::Duration::from_secs(5)).await;
    // Every step of every row ran once: three steps for each of the five.
    let wrong: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT instance, step FROM gd_audit
                                GROUP BY 1, 2 HAVING count(*) <> 1) x",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(wrong, 0, "a step ran other than once");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(audited, 15);
    db.close().await;
}
