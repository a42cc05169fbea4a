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
