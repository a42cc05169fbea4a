//! Registry and versions: a node claims only what it can run.

mod common;

use std::time::Duration;

use common::{column, eventually, finished, status, Count};
use gen_durable::{Client, Engine, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

mod v1 {
    use super::*;
    test_fsm!(Checkout, state = Count, queue = "co", version = 1, {
        Go => "go" |_ctx| { Ok(Step::done(json!("ran on v1"))) },
    });
}
mod v2 {
    use super::*;
    test_fsm!(Checkout, state = Count, queue = "co", version = 2, {
        Go => "go" |_ctx| { Ok(Step::done(json!("ran on v2"))) },
    });
}

fn q() -> QueueConfig {
    QueueConfig::new(2).with_poll_interval(Duration::from_millis(50))
}

#[tokio::test]
async fn old_rows_run_on_the_old_version_and_unknown_versions_are_left_alone() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let old = gd.insert::<v1::Checkout>(Count::default()).await.unwrap();
    let new = gd.insert::<v2::Checkout>(Count::default()).await.unwrap();

    // A node that only knows v2 runs the new row and never touches the old one.
    let mut only_v2 = Registry::new();
    only_v2.register::<v2::Checkout>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(only_v2)
        .queue_with("co", q())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), new, 10).await, "done");
    assert_eq!(
        column(db.pool(), new, "result").await.as_deref(),
        Some(r#""ran on v2""#)
    );
    let untouched: (String, i64, i32) =
        sqlx::query_as("SELECT status::text, lease_epoch, attempt FROM gd_instances WHERE id = $1")
            .bind(old)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(untouched, ("runnable".to_string(), 0, 0));
    engine.shutdown(Duration::from_secs(5)).await;

    // A node with both keeps the old row running on v1.
    let engine = Engine::builder(db.pool().clone())
        .with_registry(Registry::new())
        .register::<v1::Checkout>()
        .register::<v2::Checkout>()
        .queue_with("co", q())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), old, 10).await, "done");
    assert_eq!(
        column(db.pool(), old, "result").await.as_deref(),
        Some(r#""ran on v1""#)
    );
    let again = gd.insert::<v2::Checkout>(Count::default()).await.unwrap();
    assert_eq!(finished(db.pool(), again, 10).await, "done");
    assert_eq!(
        column(db.pool(), again, "result").await.as_deref(),
        Some(r#""ran on v2""#)
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn a_stored_state_that_no_longer_casts_fails_with_a_clear_error() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let id = gd.insert::<v2::Checkout>(Count::default()).await.unwrap();
    sqlx::query(r#"UPDATE gd_instances SET state = '{"n": "not a number"}' WHERE id = $1"#)
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(Registry::new())
        .register::<v2::Checkout>()
        .queue_with("co", q())
        .start()
        .await
        .unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "failed");
    let err = column(db.pool(), id, "last_error").await.unwrap();
    assert!(
        err.contains("no longer casts") && err.contains("state.n"),
        "{err}"
    );
    // The row is kept, with its state, for an operator to fix and retry.
    assert_eq!(
        column(db.pool(), id, "state->>'n'").await.as_deref(),
        Some("not a number")
    );
    eventually(1, "engine idle", || async {
        status(db.pool(), id).await == "failed"
    })
    .await;
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

mod rolling_v1 {
    use super::*;
    test_fsm!(Flow, state = Count, queue = "roll", version = 1, {
        A => "a" |ctx| { tokio::time::sleep(Duration::from_millis(5)).await; ctx.state.log.push("v1:a".into()); Ok(Step::next(Flow::B)) },
        B => "b" |ctx| { tokio::time::sleep(Duration::from_millis(5)).await; ctx.state.log.push("v1:b".into()); Ok(Step::next(Flow::C)) },
        C => "c" |ctx| { ctx.state.log.push("v1:c".into()); Ok(Step::done(json!(ctx.state.log.clone()))) },
    });
}
mod rolling_v2 {
    use super::*;
    test_fsm!(Flow, state = Count, queue = "roll", version = 2, {
        A => "a" |ctx| { tokio::time::sleep(Duration::from_millis(5)).await; ctx.state.log.push("v2:a".into()); Ok(Step::next(Flow::B)) },
        B => "b" |ctx| { tokio::time::sleep(Duration::from_millis(5)).await; ctx.state.log.push("v2:b".into()); Ok(Step::next(Flow::C)) },
        C => "c" |ctx| { ctx.state.log.push("v2:c".into()); Ok(Step::done(json!(ctx.state.log.clone()))) },
    });
}

/// A rolling deploy: two nodes run release 1 (v1 of the FSM); a third starts with
/// release 2 (v2, keeping v1's code for the instances in flight); the old nodes drain and
/// stop mid-way; new instances are v2. Nothing is lost, every step ran once, and every
/// instance ran only on the code of its own version.
#[tokio::test]
async fn a_rolling_deploy_loses_nothing_and_runs_each_instance_on_its_version() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let node = |name: &str, registry: Registry| {
        Engine::builder(db.pool().clone())
            .with_node_id(name)
            .with_registry(registry)
            .queue_with(
                "roll",
                QueueConfig::new(4).with_poll_interval(Duration::from_millis(20)),
            )
            .start()
    };
    let mut release_1 = Registry::new();
    release_1.register::<rolling_v1::Flow>();
    let mut release_2 = release_1.clone();
    release_2.register::<rolling_v2::Flow>();

    let mut ids = Vec::new();
    for _ in 0..60 {
        ids.push(
            gd.insert::<rolling_v1::Flow>(Count::default())
                .await
                .unwrap(),
        );
    }
    let old_a = node("old-a", release_1.clone()).await.unwrap();
    let old_b = node("old-b", release_1).await.unwrap();
    eventually(20, "release 1 at work", || async {
        common::count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            >= 5
    })
    .await;
    let ran_on_c = common::Events::default();
    let new_c = Engine::builder(db.pool().clone())
        .with_node_id("new-c")
        .with_registry(release_2)
        .queue_with(
            "roll",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(20)),
        )
        .on_event(ran_on_c.handler())
        .start()
        .await
        .unwrap();
    // The old nodes drain while their work is in flight; the new release takes it over.
    tokio::join!(
        old_a.shutdown(Duration::from_secs(10)),
        old_b.shutdown(Duration::from_secs(10))
    );
    for _ in 0..60 {
        ids.push(
            gd.insert::<rolling_v2::Flow>(Count::default())
                .await
                .unwrap(),
        );
    }
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 30).await, "done", "instance {id}");
    }
    let runs: Vec<(i32, serde_json::Value)> =
        sqlx::query_as("SELECT fsm_version, result FROM gd_instances ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(runs.len(), 120);
    for (version, log) in runs {
        let want = json!([
            format!("v{version}:a"),
            format!("v{version}:b"),
            format!("v{version}:c")
        ]);
        assert_eq!(log, want, "each step once, on the code of v{version}");
    }
    // The new node finished old instances, on v1's code (checked above).
    let v1_ids = &ids[..60];
    let old_run_on_c = ran_on_c
        .all()
        .iter()
        .filter(|e| matches!(e, gen_durable::Event::StepStop { id, .. } if v1_ids.contains(id)))
        .count();
    assert!(
        old_run_on_c > 0,
        "the new release ran steps of v1 instances"
    );
    new_c.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
