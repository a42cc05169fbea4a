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
    let err = start(empty.pool().clone()).await.err().expect("refused");
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
    let err = start(behind.pool().clone()).await.err().expect("refused");
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
    let err = start(ahead.pool().clone()).await.err().expect("refused");
    assert!(
        matches!(&err, gen_durable::Error::SchemaAhead { unknown, .. } if unknown.len() == 1),
        "{err:?}"
    );
    let nodes: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_nodes")
        .fetch_one(ahead.pool())
        .await
        .unwrap();
    assert_eq!(nodes, 0, "the refused engine announced itself");
    ahead.close().await;

    // The schema as this version embeds it: the engine starts.
    let db = TestDb::new().await;
    let engine = start(db.pool().clone()).await.expect("starts");
    engine.shutdown(std::time::Duration::from_secs(5)).await;
    db.close().await;
}
