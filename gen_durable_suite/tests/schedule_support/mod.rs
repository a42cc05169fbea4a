//! What the schedule tests share: an FSM that a fire time inserts, an engine on a manual
//! clock that polls its schedules every 20 ms, and reads of `gd_schedules` and of the
//! instances a schedule inserted.
#![allow(dead_code)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use gen_durable::{CatchUp, Clock, Engine, Entry, Registry, Schedule, Step};
use gen_durable_testkit::TestDb;
use serde_json::json;

use crate::common::{Count, Events};
use crate::test_fsm;

test_fsm!(Report, state = Count, queue = "reports", version = 1, {
    Build => "build" |_ctx| { Ok(Step::done(json!(null))) },
});

pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Report>();
    r
}

pub fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, h, m, s).unwrap()
}

pub fn schedule(name: &str, pattern: &str, c: CatchUp) -> Schedule {
    Schedule::cron(name, pattern, |fire| {
        Entry::<Report>::new(Count {
            n: fire.timestamp(),
            log: vec![],
        })
    })
    .unwrap()
    .with_catch_up(c)
}

pub async fn engine(
    db: &TestDb,
    clock: &Clock,
    node: &str,
    schedules: Vec<Schedule>,
    events: &Events,
) -> Engine {
    let mut b = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .with_clock(clock.clone())
        .with_node_id(node)
        .queue("reports", 4)
        .with_schedule_wait(Duration::from_millis(20))
        .on_event(events.handler());
    for s in schedules {
        b = b.schedule(s);
    }
    b.start().await.unwrap()
}

/// Rows inserted by schedule `name`, by their key.
pub async fn fired(db: &TestDb, name: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT unique_key FROM gd_instances WHERE unique_key LIKE $1 ORDER BY unique_key",
    )
    .bind(format!("gd:schedule:{name}:%"))
    .fetch_all(db.pool())
    .await
    .unwrap()
}

/// The stored declaration of schedule `name`: pattern, zone, catch-up, next fire time.
pub async fn declared(
    db: &TestDb,
    name: &str,
) -> Option<(String, String, String, Option<DateTime<Utc>>)> {
    sqlx::query_as(
        "SELECT pattern, timezone, catch_up, next_fire FROM gd_schedules WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(db.pool())
    .await
    .unwrap()
}

/// The stored declaration is `pattern` (UTC, run_once) with the next fire time `next`.
pub async fn declared_as(db: &TestDb, name: &str, pattern: &str, next: DateTime<Utc>) -> bool {
    declared(db, name).await == Some((pattern.into(), "UTC".into(), "run_once".into(), Some(next)))
}

pub async fn next_fire(db: &TestDb, name: &str) -> Option<DateTime<Utc>> {
    sqlx::query_scalar("SELECT next_fire FROM gd_schedules WHERE name = $1")
        .bind(name)
        .fetch_optional(db.pool())
        .await
        .unwrap()
        .flatten()
}

/// 2027-01-01 00:00 UTC: the next fire time of the yearly `0 0 1 1 *` from 2026.
pub fn new_year() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap()
}
