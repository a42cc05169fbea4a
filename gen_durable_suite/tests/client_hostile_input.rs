//! Every value is bound, never spliced: hostile queue, FSM, step, key and signal names are
//! stored verbatim or refused with a typed error, and the schema is intact afterwards.
//! (Non-UTF-8 cannot reach the API: names are `&str`, payloads JSON.)

mod common;

use std::time::Duration;

use common::Count;
use gen_durable::{Client, Engine, Error, Key, QueueConfig, Registry, Step};
use gen_durable_testkit::{Instance, TestDb};
use serde_json::json;

test_fsm!(Echo, state = Count, queue = "echo", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go'; DROP TABLE gd_signals; --"], Echo::Done)) },
    Done => "done" |ctx| { Ok(Step::done(json!(ctx.awaited()[0].name.clone()))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Echo>();
    r
}

const HOSTILE: &str = "x'); DROP TABLE gd_instances; --\"\\";

#[tokio::test]
async fn hostile_names_are_stored_verbatim_or_refused_and_the_schema_stays() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let gd = Client::new(pool.clone()).with_registry(registry());
    let queue = format!("q{HOSTILE}");
    let key = format!("k{HOSTILE}");

    // Valid text, however it looks: stored as given, and the engine runs it.
    let id = gd
        .insert::<Echo>(Count::default())
        .queue(queue.clone())
        .partition_key(format!("p{HOSTILE}"))
        .correlation_key(key.clone())
        .await
        .unwrap();
    let engine = Engine::builder(pool.clone())
        .with_registry(registry())
        .queue_with(
            queue.clone(),
            QueueConfig::new(2).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();
    gd.signal(
        Key(key.clone()),
        "go'; DROP TABLE gd_signals; --",
        json!({}),
    )
    .dedup_key(format!("d{HOSTILE}"))
    .await
    .unwrap();
    let done = gd
        .wait(id)
        .until_terminal()
        .timeout(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(
        done,
        gen_durable::Settled::Done(json!("go'; DROP TABLE gd_signals; --"))
    );
    let row = Instance::load(pool, id).await.unwrap().unwrap();
    assert_eq!(row.queue, queue);
    assert_eq!(
        row.partition_key.as_deref(),
        Some(format!("p{HOSTILE}").as_str())
    );
    assert_eq!(row.unique_key.as_deref(), Some(key.as_str()));
    engine.shutdown(Duration::from_secs(5)).await;

    // Names that name nothing: typed errors.
    let e = gd
        .insert_json(format!("Echo{HOSTILE}"), 1, json!({}))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnknownFsm { .. }), "{e}");
    let e = gd
        .insert::<Echo>(Count::default())
        .step(format!("park{HOSTILE}"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnknownStep { .. }), "{e}");
    let e = gd
        .signal(Key(format!("none{HOSTILE}")), "x", json!({}))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::KeyNotFound { .. }), "{e}");

    // Values PostgreSQL cannot hold or index: typed errors, nothing written.
    let long = "k".repeat(10 * 1024);
    for bad in ["nul\0here".to_string(), long.clone()] {
        let e = gd
            .insert::<Echo>(Count::default())
            .queue(bad.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidInput { what: "queue", .. }),
            "{e}"
        );
        let e = gd
            .insert::<Echo>(Count::default())
            .partition_key(bad.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    what: "partition_key",
                    ..
                }
            ),
            "{e}"
        );
        let e = gd
            .insert::<Echo>(Count::default())
            .correlation_key(bad.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    what: "correlation_key",
                    ..
                }
            ),
            "{e}"
        );
        let e = gd
            .signal(id, "x", json!({}))
            .dedup_key(bad.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    what: "dedup_key",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = gd.signal(id, long.as_str(), json!({})).await.unwrap_err();
    assert!(matches!(e, Error::InvalidSignalName { .. }), "{e}");
    let e = gd
        .signal(id, "x", json!({ "k": "nul\u{0}" }))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");

    // The schema is intact and only the one instance was ever written.
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables
          WHERE schemaname = 'public' AND tablename IN ('gd_instances', 'gd_signals', 'gd_nodes')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(tables, 3);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_instances")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    db.close().await;
}
