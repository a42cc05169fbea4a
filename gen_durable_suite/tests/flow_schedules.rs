//! Periodic schedules on PostgreSQL, firing: three nodes declaring one schedule insert
//! each fire time once; each catch-up policy after a downtime; an entry that cannot be
//! built, or whose closure panics, is skipped and said while the other schedules go on
//! (docs/design/reliability.md, R4B-3); a schedule declared twice is refused.

mod common;
mod schedule_support;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{count, eventually, Count, Events};
use gen_durable::{fire_key, CatchUp, Clock, Engine, Entry, Error, Event, Schedule};
use gen_durable_testkit::TestDb;
use schedule_support::{at, engine, fired, next_fire, registry, schedule, Report};

#[tokio::test]
async fn three_nodes_insert_each_fire_time_once() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let mut nodes = Vec::new();
    for node in ["n1", "n2", "n3"] {
        let s = schedule("tick", "* * * * *", CatchUp::RunOnce);
        nodes.push(engine(&db, &clock, node, vec![s], &events).await);
    }
    eventually(10, "the schedule is declared", || async {
        next_fire(&db, "tick").await == Some(at(0, 1, 0))
    })
    .await;
    for i in 1..=50u32 {
        clock.advance(Duration::from_secs(60));
        eventually(10, &format!("fire time {i} inserted"), || async {
            next_fire(&db, "tick").await == Some(at(0, i + 1, 0))
        })
        .await;
    }
    let keys = fired(&db, "tick").await;
    let expected: Vec<String> = (1..=50).map(|m| fire_key("tick", at(0, m, 0))).collect();
    assert_eq!(keys, expected, "each fire time once, none missing");
    let by_node = count(
        db.pool(),
        "SELECT count(*) FROM gd_instances WHERE unique_key LIKE 'gd:schedule:tick:%'",
    )
    .await;
    assert_eq!(by_node, 50);
    let fires: Vec<_> = events
        .all()
        .into_iter()
        .filter(|e| matches!(e, Event::ScheduleFired { .. }))
        .collect();
    assert_eq!(
        fires.len(),
        50,
        "one schedule.fired per fire time: {fires:?}"
    );
    for n in nodes {
        n.shutdown(Duration::from_secs(5)).await;
    }
    db.close().await;
}

#[tokio::test]
async fn after_a_downtime_each_catch_up_policy_does_what_it_says() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let declared = || {
        vec![
            schedule("skip", "*/5 * * * *", CatchUp::Skip),
            schedule("once", "*/5 * * * *", CatchUp::RunOnce),
            schedule("all", "*/5 * * * *", CatchUp::RunAll),
        ]
    };
    let first = engine(&db, &clock, "before", declared(), &events).await;
    eventually(10, "the schedules are declared", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_schedules WHERE next_fire = '2026-01-01T00:05:00Z'",
        )
        .await
            == 3
    })
    .await;
    first.shutdown(Duration::from_secs(5)).await;

    // Down from 00:00:30 to 00:33:30: 00:05, 00:10, …, 00:30 were missed.
    clock.set(at(0, 33, 30));
    let second = engine(&db, &clock, "after", declared(), &events).await;
    eventually(10, "every schedule caught up", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_schedules WHERE next_fire = '2026-01-01T00:35:00Z'",
        )
        .await
            == 3
    })
    .await;
    second.shutdown(Duration::from_secs(5)).await;

    assert_eq!(fired(&db, "skip").await, Vec::<String>::new());
    assert_eq!(
        fired(&db, "once").await,
        vec![fire_key("once", at(0, 30, 0))]
    );
    let all: Vec<String> = (1..=6).map(|i| fire_key("all", at(0, 5 * i, 0))).collect();
    assert_eq!(fired(&db, "all").await, all);
    let skipped: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, skipped FROM gd_schedules ORDER BY name")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        skipped,
        vec![("all".into(), 0), ("once".into(), 5), ("skip".into(), 6)]
    );
    db.close().await;
}

#[tokio::test]
async fn an_entry_that_cannot_be_built_is_skipped_and_said() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let bad = Schedule::cron("bad", "* * * * *", |_| {
        Entry::<Report>::new(Count::default()).correlation_key("nul\0key")
    })
    .unwrap();
    let e = engine(&db, &clock, "n1", vec![bad], &events).await;
    eventually(10, "declared", || async {
        next_fire(&db, "bad").await.is_some()
    })
    .await;
    clock.advance(Duration::from_secs(60));
    eventually(10, "the fire time handled", || async {
        next_fire(&db, "bad").await == Some(at(0, 2, 0))
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;
    let (skipped, last_error): (i64, Option<String>) =
        sqlx::query_as("SELECT skipped, last_error FROM gd_schedules WHERE name = 'bad'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(skipped, 1);
    let last_error = last_error.expect("the reason is stored");
    assert!(last_error.contains("NUL"), "{last_error}");
    assert!(events.all().iter().any(|e| matches!(
        e,
        Event::ScheduleSkipped { schedule, count: 1, .. } if schedule == "bad"
    )));
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );
    db.close().await;
}

#[tokio::test]
async fn a_schedule_declared_twice_is_refused_at_start() {
    let db = TestDb::new().await;
    let e = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue("reports", 1)
        .schedule(schedule("twice", "* * * * *", CatchUp::RunOnce))
        .schedule(schedule("twice", "0 * * * *", CatchUp::RunOnce))
        .start()
        .await
        .expect_err("refused");
    assert!(
        matches!(&e, Error::InvalidConfig(m) if m.contains("\"twice\"")),
        "{e}"
    );
    db.close().await;
}

/// A schedule whose entry closure panics for the fire time `bad`.
fn panicking(name: &str, bad: DateTime<Utc>, c: CatchUp) -> Schedule {
    Schedule::cron(name, "* * * * *", move |fire| {
        if fire == bad {
            panic!("no report for {fire}");
        }
        Entry::<Report>::new(Count::default())
    })
    .unwrap()
    .with_catch_up(c)
}

/// Skipped count and last error of schedule `name`.
async fn skipped(db: &TestDb, name: &str) -> (i64, Option<String>) {
    sqlx::query_as("SELECT skipped, last_error FROM gd_schedules WHERE name = $1")
        .bind(name)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn r4b_3_a_panicking_entry_fails_its_fire_and_the_other_schedules_go_on() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let ss = vec![
        panicking("a-bad", at(0, 3, 0), CatchUp::RunOnce),
        schedule("b-good", "* * * * *", CatchUp::RunOnce),
    ];
    let e = engine(&db, &clock, "n1", ss, &events).await;
    eventually(10, "declared", || async {
        next_fire(&db, "b-good").await == Some(at(0, 1, 0))
    })
    .await;
    for m in 1..=6 {
        clock.advance(Duration::from_secs(60));
        eventually(10, &format!("00:0{m} handled by both"), || async {
            next_fire(&db, "a-bad").await == Some(at(0, m + 1, 0))
                && next_fire(&db, "b-good").await == Some(at(0, m + 1, 0))
        })
        .await;
    }
    e.shutdown(Duration::from_secs(5)).await;
    let good: Vec<String> = (1..=6).map(|m| fire_key("b-good", at(0, m, 0))).collect();
    assert_eq!(fired(&db, "b-good").await, good);
    let bad: Vec<String> = [1, 2, 4, 5, 6]
        .map(|m| fire_key("a-bad", at(0, m, 0)))
        .to_vec();
    assert_eq!(fired(&db, "a-bad").await, bad, "00:03 alone is missing");
    let (n, last_error) = skipped(&db, "a-bad").await;
    assert_eq!(n, 1);
    let last_error = last_error.expect("the panic is stored");
    assert!(
        last_error.contains("panicked: no report for 2026-01-01 00:03:00 UTC"),
        "{last_error}"
    );
    let said: Vec<Event> = events
        .all()
        .into_iter()
        .filter(|e| matches!(e, Event::ScheduleSkipped { .. }))
        .collect();
    assert!(
        matches!(&said[..], [Event::ScheduleSkipped { schedule, count: 1, reason }]
            if schedule == "a-bad" && *reason == last_error),
        "{said:?}"
    );
    db.close().await;
}

#[tokio::test]
async fn r4b_3_under_run_all_a_panicking_fire_time_is_skipped_once_not_replayed() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let declared = || {
        vec![
            panicking("all", at(0, 3, 0), CatchUp::RunAll),
            schedule("other", "* * * * *", CatchUp::RunOnce),
        ]
    };
    let e = engine(&db, &clock, "before", declared(), &events).await;
    eventually(10, "declared", || async {
        next_fire(&db, "other").await == Some(at(0, 1, 0))
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;

    // Down from 00:00:30 to 00:05:30: the catch-up of 00:01..00:05 meets the panic at 00:03.
    clock.set(at(0, 5, 30));
    let e = engine(&db, &clock, "after", declared(), &events).await;
    eventually(10, "both caught up", || async {
        next_fire(&db, "all").await == Some(at(0, 6, 0))
            && next_fire(&db, "other").await == Some(at(0, 6, 0))
    })
    .await;
    clock.advance(Duration::from_secs(60));
    eventually(10, "00:06 fired by both", || async {
        next_fire(&db, "all").await == Some(at(0, 7, 0))
            && next_fire(&db, "other").await == Some(at(0, 7, 0))
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;
    let all: Vec<String> = [1, 2, 4, 5, 6]
        .map(|m| fire_key("all", at(0, m, 0)))
        .to_vec();
    assert_eq!(fired(&db, "all").await, all);
    assert_eq!(
        fired(&db, "other").await,
        [5, 6].map(|m| fire_key("other", at(0, m, 0))).to_vec(),
        "the catch-up of 00:05 (run_once), then 00:06"
    );
    assert_eq!(skipped(&db, "all").await.0, 1, "skipped once, not replayed");
    db.close().await;
}
