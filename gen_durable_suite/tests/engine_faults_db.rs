//! Reliability against the database: connections killed mid-step and
//! mid-commit, a lost LISTEN connection, tokio cancellation at every await.

mod common;

use std::time::{Duration, Instant};

use common::{count, eventually, finished};
use gen_durable::{Client, Engine, Entry, Pooler, QueueConfig, WakeListener};
use gen_durable_suite::fsms::{create_audit_table, Audited, Plan};
use gen_durable_testkit::pg::direct_options;
use gen_durable_testkit::TestDb;
use sqlx::postgres::PgPoolOptions;

async fn exactly_once(db: &TestDb, ids: &[i64]) {
    let wrong = count(
        db.direct(),
        "SELECT count(*) FROM (SELECT instance, step FROM gd_audit GROUP BY 1, 2 HAVING count(*) <> 1) x",
    )
    .await;
    assert_eq!(wrong, 0, "an (instance, step) audited other than once");
    assert_eq!(
        count(db.direct(), "SELECT count(*) FROM gd_audit").await,
        3 * ids.len() as i64
    );
}

async fn engine_on(db: &TestDb, app: &str, pool_size: u32) -> Engine {
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .connect_with(db.options().application_name(app))
        .await
        .unwrap();
    Engine::builder(pool)
        .with_pooler(db.pooler())
        .with_listener(db.listener())
        .queue_with(
            "audited",
            QueueConfig::new(8).with_poll_interval(Duration::from_millis(50)),
        )
        .with_lease_ttl(Duration::from_millis(1000))
        .with_reaper_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn killing_the_engines_connections_mid_step_and_mid_commit_loses_and_duplicates_nothing() {
    let db = TestDb::new().await;
    create_audit_table(db.direct()).await.unwrap();
    let gd = Client::new(db.pool().clone()).with_pooler(db.pooler());
    let ids = gd
        .insert_all::<Audited>((0..200).map(|_| {
            Entry::new(Plan {
                step_ms: 10,
                ..Default::default()
            })
        }))
        .await
        .unwrap();
    let engine = engine_on(&db, "victim", 8).await;
    // Terminate every backend of the engine's pool, again and again, whatever it is
    // doing: claiming, running a step's transaction, committing, heartbeating.
    let killer = {
        let pool = db.direct().clone();
        tokio::spawn(async move {
            let mut kills = 0i64;
            for _ in 0..15 {
                tokio::time::sleep(Duration::from_millis(150)).await;
                kills += sqlx::query_scalar::<_, i64>(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'victim'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
            }
            kills
        })
    };
    let kills = killer.await.unwrap();
    assert!(kills > 0, "the test killed some connections");
    for &id in &ids {
        let st = finished(db.direct(), id, 60).await;
        let err = common::column(db.direct(), id, "last_error").await;
        assert_eq!(st, "done", "instance {id}: {err:?}");
    }
    exactly_once(&db, &ids).await;
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_lost_listen_connection_costs_at_most_one_poll_interval() {
    let db = TestDb::new().await;
    create_audit_table(db.direct()).await.unwrap();
    let gd = Client::new(db.pool().clone()).with_pooler(db.pooler());
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(db.options().application_name("listener-victim"))
        .await
        .unwrap();
    // Behind a pooler the engine LISTENs on a connection of its own to the server.
    let listener = match db.pooler() {
        Pooler::None => WakeListener::Pool,
        _ => WakeListener::direct(
            direct_options()
                .database(db.name())
                .application_name("listener-victim"),
        ),
    };
    let engine = Engine::builder(pool)
        .with_pooler(db.pooler())
        .with_listener(listener)
        .queue_with(
            "audited",
            QueueConfig::new(2)
                .with_poll_interval(Duration::from_millis(500))
                .with_max_poll_interval(Duration::from_millis(500)),
        )
        .start()
        .await
        .unwrap();
    eventually(10, "listening", || async {
        count(db.direct(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'listener-victim' AND query LIKE 'LISTEN%'").await > 0
    })
    .await;
    let killed = count(
        db.direct(),
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'listener-victim' AND query LIKE 'LISTEN%'",
    )
    .await;
    assert_eq!(killed, 1);
    let t = Instant::now();
    let id = gd.insert::<Audited>(Plan::default()).await.unwrap();
    assert_eq!(finished(db.direct(), id, 10).await, "done");
    // Three steps; the first must start within a poll interval (plus slack for the machine).
    assert!(
        t.elapsed() < Duration::from_millis(500 * 3 + 1500),
        "took {:?}",
        t.elapsed()
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn cancelling_the_engine_at_any_await_leaves_no_transaction_or_lock_behind() {
    let db = TestDb::new().await;
    create_audit_table(db.direct()).await.unwrap();
    let gd = Client::new(db.pool().clone()).with_pooler(db.pooler());
    let ids = gd
        .insert_all::<Audited>((0..60).map(|_| {
            Entry::new(Plan {
                step_ms: 3,
                ..Default::default()
            })
        }))
        .await
        .unwrap();
    // A pool of two: one connection for LISTEN, one for everything else, so claims,
    // step transactions and commits queue behind each other and get cut at every await.
    for round in 0..25u64 {
        let engine = engine_on(&db, "cut", 2).await;
        tokio::time::sleep(Duration::from_millis(5 + (round * 7) % 60)).await;
        drop(engine);
        eventually(10, "no session left idle in a transaction, no lock held", || async {
            count(db.direct(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cut' AND state LIKE 'idle in transaction%'").await == 0
                && count(db.direct(), "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'cut' AND l.locktype IN ('tuple', 'transactionid', 'advisory')").await == 0
        })
        .await;
    }
    // Whatever was cut, a clean engine finishes everything exactly once.
    sqlx::raw_sql(
        "UPDATE gd_instances SET lease_expires_at = now() WHERE status = 'executing';
         UPDATE gd_batches SET expires_at = now();",
    )
    .execute(db.direct())
    .await
    .unwrap();
    let engine = engine_on(&db, "clean", 8).await;
    for &id in &ids {
        assert_eq!(finished(db.direct(), id, 60).await, "done");
    }
    exactly_once(&db, &ids).await;
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
