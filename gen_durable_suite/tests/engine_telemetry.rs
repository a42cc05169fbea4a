//! Every telemetry event is observed with its fields.

mod common;

use std::time::Duration;

use common::{eventually, finished, status, Count, Events};
use gen_durable::{Child, Client, Engine, Event, QueueConfig, Registry, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(AllKinds, state = Count, queue = "t", version = 1, {
    Start => "start" |ctx| {
        if ctx.attempt() == 0 { return Ok(Step::replay(Duration::from_millis(10))); }
        Ok(Step::next(AllKinds::Park))
    },
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], AllKinds::Fan)) },
    Fan => "fan" |_ctx| { Ok(Step::schedule_children(vec![Child::new::<Leaf>(Count::default())], AllKinds::End)) },
    End => "end" |_ctx| { Ok(Step::done(json!("end"))) },
});

test_fsm!(Leaf, state = Count, queue = "t", version = 1, {
    Run => "run" |_ctx| { Ok(Step::stop("leaf stops")) },
});

/// Holds `Slow`'s step until the test opens it, so the drain sees it running however slow
/// the machine is.
static SLOW_GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

test_fsm!(Slow, state = Count, queue = "slow", version = 1, {
    Run => "run" |_ctx| { drop(SLOW_GATE.acquire().await); Ok(Step::done(json!(null))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<AllKinds>();
    r.register::<Leaf>();
    r.register::<Slow>();
    r
}

#[tokio::test]
async fn step_pick_saturation_drain_and_reaper_events() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let events = Events::default();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with(
            "t",
            QueueConfig::new(3)
                .with_prefetch(2)
                .with_poll_interval(Duration::from_millis(20)),
        )
        .queue_with(
            "slow",
            QueueConfig::new(1)
                .with_prefetch(1)
                .with_poll_interval(Duration::from_millis(20)),
        )
        .with_reaper_interval(Duration::from_millis(50))
        .on_event(events.handler())
        .with_node_id("telemetry-node")
        .start()
        .await
        .unwrap();
    let id = gd.insert::<AllKinds>(Count::default()).await.unwrap();
    eventually(10, "parked", || async {
        status(db.pool(), id).await == "awaiting_signal"
    })
    .await;
    gd.signal(id, "go", json!({})).await.unwrap();
    assert_eq!(finished(db.pool(), id, 10).await, "done");

    let kinds: std::collections::BTreeSet<&str> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::StepStop {
                kind,
                fsm,
                duration,
                ..
            } => {
                assert!(*fsm == "AllKinds" || *fsm == "Leaf");
                assert!(*duration < Duration::from_secs(5));
                Some(kind.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "await",
            "done",
            "next",
            "replay",
            "schedule_children",
            "stop"
        ]
        .into_iter()
        .collect()
    );

    let picks: Vec<(usize, usize, String, String)> = events
        .all()
        .into_iter()
        .filter_map(|e| match e {
            Event::PickStop {
                count,
                demand,
                queue,
                worker,
            } => Some((count, demand, queue, worker)),
            _ => None,
        })
        .collect();
    assert!(picks
        .iter()
        .all(|(c, d, _, w)| c <= d && *d <= 5 && w == "telemetry-node"));
    assert!(picks.iter().any(|(c, _, q, _)| *c > 0 && q == "t"));
    assert!(events.all().iter().any(|e| matches!(e,
        Event::SchedulerSaturation { concurrency: 3, prefetch: 2, queue, in_flight, buffer } if queue == "t" && *in_flight <= 3 && *buffer <= 2)));

    // Drain: one running, one buffered on "slow".
    gd.insert::<Slow>(Count::default()).await.unwrap();
    gd.insert::<Slow>(Count::default()).await.unwrap();
    eventually(10, "both claimed", || async {
        common::count(
            db.pool(),
            "SELECT count(*) FROM gd_instances i WHERE gd_status_of(i) = 'executing'",
        )
        .await
            == 2
    })
    .await;
    let drain = tokio::spawn(engine.shutdown(Duration::from_secs(30)));
    eventually(10, "the buffered row released", || async {
        common::count(
            db.pool(),
            "SELECT count(*) FROM gd_instances i WHERE gd_status_of(i) = 'executing'",
        )
        .await
            == 1
    })
    .await;
    SLOW_GATE.add_permits(1);
    drain.await.unwrap();
    assert!(events.all().iter().any(|e| matches!(e,
        Event::SchedulerDrain { released: 1, in_flight: 1, queue } if queue == "slow")));

    // Reaper: a lease that expired is reaped and its id reported.
    let lost = gd.insert::<Slow>(Count::default()).await.unwrap();
    sqlx::query("UPDATE gd_instances SET status = 'executing', locked_by = 'gone', lease_expires_at = now() - interval '1 s' WHERE id = $1")
        .bind(lost)
        .execute(db.pool())
        .await
        .unwrap();
    let reaps = Events::default();
    let reaper = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue("t", 1)
        .with_reaper_interval(Duration::from_millis(20))
        .on_event(reaps.handler())
        .start()
        .await
        .unwrap();
    eventually(10, "reaped", || async {
        reaps
            .all()
            .iter()
            .any(|e| matches!(e, Event::ReaperReaped { count: 1, ids } if ids == &vec![lost]))
    })
    .await;
    reaper.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
