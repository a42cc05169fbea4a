//! Periodic schedules on PostgreSQL, declared: a redeclared schedule (a new release) fires
//! by its new pattern, zone and catch-up policy at once, and the stored row shows them; in
//! a rolling deploy the node that started last declares and every node follows (R4B-1). A
//! pattern with no fire time ahead is refused and writes nothing; a row an older version
//! left with no next fire time is revived by a valid declaration (R4B-2).

mod common;
mod schedule_support;

use std::time::Duration;

use common::{count, eventually, Count, Events};
use gen_durable::{fire_key, CatchUp, Clock, Engine, Entry, Error, Schedule, Tz};
use gen_durable_testkit::TestDb;
use schedule_support::{
    at, declared, declared_as, engine, fired, new_year, next_fire, registry, schedule, Report,
};

#[tokio::test]
async fn r4b_1_a_rare_pattern_changed_to_a_frequent_one_fires_by_it_at_once() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let v1 = schedule("c", "0 0 1 1 *", CatchUp::RunOnce);
    let e = engine(&db, &clock, "v1", vec![v1], &events).await;
    eventually(10, "v1's yearly pattern declared", || async {
        declared_as(&db, "c", "0 0 1 1 *", new_year()).await
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;

    // The next release fires every minute: from its first minute, not from next January.
    let v2 = schedule("c", "* * * * *", CatchUp::RunOnce);
    let e = engine(&db, &clock, "v2", vec![v2], &events).await;
    eventually(
        10,
        "v2's pattern stored, its next fire time 00:01",
        || async { declared_as(&db, "c", "* * * * *", at(0, 1, 0)).await },
    )
    .await;
    for m in 1..=3 {
        clock.advance(Duration::from_secs(60));
        eventually(10, &format!("fire time 00:0{m} inserted"), || async {
            next_fire(&db, "c").await == Some(at(0, m + 1, 0))
        })
        .await;
    }
    e.shutdown(Duration::from_secs(5)).await;
    let expected: Vec<String> = (1..=3).map(|m| fire_key("c", at(0, m, 0))).collect();
    assert_eq!(fired(&db, "c").await, expected);
    db.close().await;
}

#[tokio::test]
async fn r4b_1_a_frequent_pattern_changed_to_a_rare_one_fires_no_off_pattern_time() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let v1 = schedule("r", "*/10 * * * *", CatchUp::RunOnce);
    let e = engine(&db, &clock, "v1", vec![v1], &events).await;
    eventually(10, "v1 declared, next fire 00:10", || async {
        declared_as(&db, "r", "*/10 * * * *", at(0, 10, 0)).await
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;

    clock.set(at(0, 5, 0));
    // `w` fires every minute after `r` in each pass: its fires show that passes ran.
    let v2 = vec![
        schedule("r", "0 0 1 1 *", CatchUp::RunOnce),
        schedule("w", "* * * * *", CatchUp::RunOnce),
    ];
    let e = engine(&db, &clock, "v2", v2, &events).await;
    eventually(
        10,
        "v2's yearly pattern stored, next fire 2027-01-01",
        || async { declared_as(&db, "r", "0 0 1 1 *", new_year()).await },
    )
    .await;
    // 00:10, 00:20 and 00:30 were `*/10` times, never yearly ones. The pass that fires `w`
    // at 00:31 began after the clock reached 00:30.
    clock.set(at(0, 30, 0));
    eventually(10, "w fired 00:30", || async {
        next_fire(&db, "w").await == Some(at(0, 31, 0))
    })
    .await;
    clock.set(at(0, 31, 0));
    eventually(10, "w fired 00:31", || async {
        next_fire(&db, "w").await == Some(at(0, 32, 0))
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        fired(&db, "r").await,
        Vec::<String>::new(),
        "no off-pattern fire"
    );
    assert!(declared_as(&db, "r", "0 0 1 1 *", new_year()).await);
    db.close().await;
}

#[tokio::test]
async fn r4b_1_a_changed_time_zone_or_catch_up_is_stored_and_followed() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let noon = |tz: gen_durable::Tz, c: CatchUp| schedule("z", "0 12 * * *", c).with_timezone(tz);
    let e = engine(
        &db,
        &clock,
        "v1",
        vec![noon(Tz::UTC, CatchUp::RunOnce)],
        &events,
    )
    .await;
    eventually(10, "noon UTC declared", || async {
        declared_as(&db, "z", "0 12 * * *", at(12, 0, 0)).await
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;

    // Noon in Tokyo (UTC+9) is 03:00 UTC.
    let tokyo = noon(Tz::Asia__Tokyo, CatchUp::RunAll);
    let e = engine(&db, &clock, "v2", vec![tokyo], &events).await;
    let stored = || {
        Some((
            "0 12 * * *".to_string(),
            "Asia/Tokyo".to_string(),
            "run_all".to_string(),
            Some(at(3, 0, 0)),
        ))
    };
    eventually(
        10,
        "the zone and the policy stored, next fire 03:00 UTC",
        || async { declared(&db, "z").await == stored() },
    )
    .await;
    clock.set(at(3, 0, 1));
    eventually(10, "noon in Tokyo fired", || async {
        fired(&db, "z").await == vec![fire_key("z", at(3, 0, 0))]
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

#[tokio::test]
async fn r4b_1_during_a_rolling_deploy_the_last_started_node_declares_and_all_follow() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    let old = engine(
        &db,
        &clock,
        "old",
        vec![schedule("d", "*/10 * * * *", CatchUp::RunOnce)],
        &events,
    )
    .await;
    eventually(10, "the old release declared", || async {
        declared_as(&db, "d", "*/10 * * * *", at(0, 10, 0)).await
    })
    .await;
    // The new release starts next to the old one, which keeps running.
    let new = engine(
        &db,
        &clock,
        "new",
        vec![schedule("d", "*/3 * * * *", CatchUp::RunOnce)],
        &events,
    )
    .await;
    eventually(10, "the new release declared", || async {
        declared_as(&db, "d", "*/3 * * * *", at(0, 3, 0)).await
    })
    .await;
    for m in (3..=30).step_by(3) {
        clock.set(at(0, m, 0));
        eventually(10, &format!("fire time 00:{m:02} inserted"), || async {
            next_fire(&db, "d").await == Some(at(0, m + 3, 0))
        })
        .await;
    }
    old.shutdown(Duration::from_secs(5)).await;
    new.shutdown(Duration::from_secs(5)).await;
    let expected: Vec<String> = (1..=10).map(|i| fire_key("d", at(0, 3 * i, 0))).collect();
    assert_eq!(
        fired(&db, "d").await,
        expected,
        "the new pattern's times, each once"
    );
    assert!(
        declared_as(&db, "d", "*/3 * * * *", at(0, 33, 0)).await,
        "no flip back"
    );
    db.close().await;
}

#[tokio::test]
async fn r4b_2_a_pattern_with_no_fire_time_ahead_is_a_typed_error_and_writes_nothing() {
    // 30 February never comes.
    let never = Schedule::cron("never", "0 0 30 2 *", |_| {
        Entry::<Report>::new(Count::default())
    });
    assert!(
        matches!(&never, Err(Error::InvalidInput { what: "schedule pattern", reason }) if reason.contains("never")),
        "{never:?}"
    );
    // A year field whose years are past: refused when the engine declares it.
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let past = Schedule::cron("past", "0 0 0 1 1 * 2020", |_| {
        Entry::<Report>::new(Count::default())
    })
    .expect("it fired in 2020");
    let e = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .with_clock(clock.clone())
        .queue("reports", 1)
        .schedule(past)
        .start()
        .await;
    match e {
        Err(Error::InvalidInput { what, reason }) => {
            assert_eq!(what, "schedule pattern");
            assert!(reason.contains("\"past\""), "{reason}");
        }
        Err(other) => panic!("{other}"),
        Ok(e) => {
            e.shutdown(Duration::from_secs(5)).await;
            panic!("an engine started with a schedule that never fires again");
        }
    }
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_schedules").await,
        0
    );
    db.close().await;
}

#[tokio::test]
async fn r4b_2_a_row_with_no_next_fire_is_revived_by_a_valid_declaration() {
    let db = TestDb::new().await;
    let clock = Clock::manual(at(0, 0, 30));
    let events = Events::default();
    // As an older version left a never-firing pattern.
    sqlx::query(
        "INSERT INTO gd_schedules (name, pattern, timezone, catch_up, next_fire)
         VALUES ('n', '0 0 30 2 *', 'UTC', 'run_once', NULL)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let e = engine(
        &db,
        &clock,
        "n1",
        vec![schedule("n", "* * * * *", CatchUp::RunOnce)],
        &events,
    )
    .await;
    eventually(10, "the fixed pattern stored, next fire 00:01", || async {
        declared_as(&db, "n", "* * * * *", at(0, 1, 0)).await
    })
    .await;
    clock.advance(Duration::from_secs(60));
    eventually(10, "00:01 fired", || async {
        fired(&db, "n").await == vec![fire_key("n", at(0, 1, 0))]
    })
    .await;
    e.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
