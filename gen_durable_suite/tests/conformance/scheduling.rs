//! Order, schedules, uniqueness, operator actions and partitions.

use std::time::Duration;

use gen_durable::{Error, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn priorities_order_the_runs<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    for (name, priority) in [("five", 5), ("zero-a", 0), ("minus", -1), ("zero-b", 0)] {
        let state = S {
            log: vec![name.into()],
            tag: tag.clone(),
            ..S::default()
        };
        b.insert::<Logger>(state, Opts::default().priority(priority))
            .await
            .unwrap();
    }
    b.run().await;
    assert_eq!(logged(&tag), ["minus", "zero-a", "zero-b", "five"]);
}

pub async fn schedule_in_is_never_early<B: Backend>(b: &mut B) {
    let later = b
        .insert::<Clocked>(
            S::default(),
            Opts::default().schedule_in(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let now = b
        .insert::<Clocked>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.steps, 1);
    b.get(now).await.assert_status(Status::Done);
    let i = b.get(later).await;
    i.assert_status(Status::Runnable);
    assert_eq!(i.eligible_at, b.now() + chrono::Duration::seconds(60));
    b.advance(Duration::from_millis(59_999)).await;
    assert_eq!(b.run().await.steps, 0, "not a millisecond early");
    b.advance(Duration::from_millis(1)).await;
    assert_eq!(b.run().await.steps, 1);
    b.get(later).await.assert_done(json!(b.now().to_rfc3339()));
}

pub async fn insert_at_a_named_step_and_reject_unknown_steps<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default().step("c"))
        .await
        .unwrap();
    b.run().await;
    b.get(id).await.assert_done(json!({ "total": 100 }));
    let e = b
        .insert::<Counter>(S::default(), Opts::default().step("nope"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::UnknownStep { step, .. } if step == "nope"),
        "{e}"
    );
}

pub async fn unique_key_default_scope_frees_at_terminal<B: Backend>(b: &mut B) {
    let key = format!("{}:report", b.tag());
    let first = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    let e = b
        .insert::<Counter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Duplicate { key: k } if *k == key),
        "{e}"
    );
    b.run().await; // parked: still occupied
    assert!(matches!(
        b.insert::<Counter>(S::default(), Opts::default().unique_key(&key))
            .await,
        Err(Error::Duplicate { .. })
    ));
    b.signal(first, "go", json!({})).await.unwrap();
    b.run().await;
    b.get(first).await.assert_status(Status::Done);
    let second = b
        .insert::<Counter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    assert!(second > first);
}

pub async fn a_unique_scope_a_row_could_re_enter_is_refused<B: Backend>(b: &mut B) {
    // Parked is outside a `[Runnable]` scope, and a signal would bring the row back into
    // it — while another row may hold the key by then. Such scopes are refused at insert,
    // and nothing is written (docs/design/reliability.md, E2).
    let key = format!("{}:runnable-only", b.tag());
    let r = b
        .insert::<Waiter>(
            S::default(),
            Opts::default()
                .unique_key(&key)
                .unique_scope([Status::Runnable]),
        )
        .await;
    assert!(
        matches!(
            &r,
            Err(Error::InvalidInput {
                what: "unique_scope",
                ..
            })
        ),
        "{r:?}"
    );
    // The default scope holds the key while the row is parked.
    let first = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    b.run().await;
    b.get(first).await.assert_awaiting(["go"]);
    assert!(matches!(
        b.insert::<Waiter>(S::default(), Opts::default().unique_key(&key))
            .await,
        Err(Error::Duplicate { .. })
    ));
}

pub async fn insert_all_drops_stored_and_batch_duplicates_not_null_keys<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let k = |s: &str| format!("{tag}:{s}");
    let stored = b
        .insert::<Counter>(S::default(), Opts::default().unique_key(k("one")))
        .await
        .unwrap();
    let rows = vec![
        (S::n(1), Opts::default().unique_key(k("one"))), // occupied by a stored row
        (S::n(2), Opts::default().unique_key(k("two"))),
        (S::n(3), Opts::default().unique_key(k("two"))), // a duplicate within the batch
        (S::n(4), Opts::default()),                      // no key: never a duplicate
        (S::n(5), Opts::default()),
    ];
    let ids = b.insert_all::<Counter>(rows).await.unwrap();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending: {ids:?}");
    assert!(ids[0] > stored);
    let mut ns = Vec::new();
    for id in &ids {
        ns.push(b.get(*id).await.state["n"].as_i64().unwrap());
    }
    ns.sort();
    assert_eq!(ns, [2, 4, 5]);
    assert_eq!(
        b.insert_all::<Counter>(Vec::new()).await.unwrap(),
        Vec::<i64>::new()
    );
}

pub async fn cancel_fails_a_parked_instance_and_its_children<B: Backend>(b: &mut B) {
    let parent = b
        .insert::<Holder>(S::default(), Opts::default())
        .await
        .unwrap();
    let waiter = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(waiter, "stray", json!(null)).await.unwrap();
    let kids = b.get(parent).await.children;
    let c = b.cancel(parent).await.unwrap();
    assert_eq!((c.failed, c.after_current_step), (3, 0));
    let p = b.get(parent).await;
    p.assert_failed("cancelled");
    assert_eq!(
        p.children_pending, 0,
        "a cancelled parent counts its cancelled children down: the count is its live children"
    );
    for k in kids {
        b.get(k).await.assert_failed("cancelled");
    }
    let c = b.cancel(waiter).await.unwrap();
    assert_eq!(c.failed, 1);
    let w = b.get(waiter).await;
    w.assert_failed("cancelled");
    assert!(w.inbox.is_empty(), "a cancelled instance's inbox goes");
    assert!(matches!(
        b.cancel(waiter).await,
        Err(Error::Finished { .. })
    ));
    assert!(matches!(
        b.cancel(waiter + 1000).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(b.run().await.steps, 0);
}

pub async fn cancelling_a_child_counts_its_parent_down<B: Backend>(b: &mut B) {
    let parent = b
        .insert::<Holder>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let kids = b.get(parent).await.children;
    assert_eq!(b.cancel(kids[0]).await.unwrap().failed, 1);
    let p = b.get(parent).await;
    p.assert_status(Status::AwaitingChildren);
    assert_eq!(p.children_pending, 1);
    b.cancel(kids[1]).await.unwrap();
    // The last one wakes the parent, which sees both children failed.
    b.get(parent).await.assert_status(Status::Runnable);
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(parent).await.assert_done(json!("children finished"));
}

pub async fn retry_runs_a_failed_instance_again<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let id = b
        .insert::<Flaky>(S::tagged(&tag), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.get(id).await.assert_failed("flaky dependency down");
    assert!(matches!(
        b.retry(id + 1000).await,
        Err(Error::NotFound { .. })
    ));
    log(&tag, "fixed");
    b.retry(id).await.unwrap();
    let i = b.get(id).await;
    i.assert_status(Status::Runnable).assert_step("go");
    assert_eq!(i.attempt, 0);
    b.run().await;
    b.get(id).await.assert_done(json!({ "attempt": 0 }));
    assert!(matches!(b.retry(id).await, Err(Error::WrongStatus { .. })));
}

/// A retry puts an instance back where its failed step began: cancelled while parked, it
/// awaits its signal again (the cancel deleted its inbox) instead of running the step the
/// signal was for with nothing awaited.
pub async fn a_retry_after_a_cancel_while_parked_awaits_again<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.get(id).await.assert_status(Status::AwaitingSignal);
    b.cancel(id).await.unwrap();
    b.get(id).await.assert_failed("cancelled");
    b.retry(id).await.unwrap();
    let i = b.get(id).await;
    i.assert_status(Status::AwaitingSignal).assert_step("use");
    assert_eq!(i.awaits, vec!["go".to_string()]);
    assert_eq!(b.run().await.steps, 0, "nothing runs before the signal");
    b.signal(id, "go", json!({ "v": 7 })).await.unwrap();
    b.run().await;
    b.get(id)
        .await
        .assert_done(json!({ "v": 7, "attempt": 0, "awaited": 1 }));
}

/// A step woken by a signal that fails: its retry awaits a signal again (the failure
/// deleted the inbox), and runs on the next one.
pub async fn a_retry_of_a_failed_step_woken_by_a_signal_awaits_again<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let id = b
        .insert::<FlakyAfterAwait>(S::tagged(&tag), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(id, "go", json!({ "v": 1 })).await.unwrap();
    b.run().await;
    b.get(id).await.assert_failed("payment service down");
    log(&tag, "fixed");
    b.retry(id).await.unwrap();
    b.get(id)
        .await
        .assert_status(Status::AwaitingSignal)
        .assert_step("use");
    assert_eq!(b.run().await.steps, 0, "nothing runs before the signal");
    b.signal(id, "go", json!({ "v": 2 })).await.unwrap();
    b.run().await;
    b.get(id).await.assert_done(json!({ "v": 2, "awaited": 1 }));
}

/// A step woken by its await's timeout that fails: its retry runs it again at once, as the
/// timeout did (nothing awaited).
pub async fn a_retry_of_a_failed_step_woken_by_its_timeout_runs_it_again<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let id = b
        .insert::<FlakyAfterAwait>(S::tagged(&tag), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.advance(Duration::from_secs(3601)).await;
    b.run().await;
    b.get(id).await.assert_failed("payment service down");
    log(&tag, "fixed");
    b.retry(id).await.unwrap();
    b.get(id)
        .await
        .assert_status(Status::Runnable)
        .assert_step("use");
    b.run().await;
    b.get(id)
        .await
        .assert_done(json!({ "v": null, "awaited": 0 }));
}

pub async fn retry_refuses_a_unique_key_taken_meanwhile<B: Backend>(b: &mut B) {
    let key = format!("{}:nightly", b.tag());
    let first = b
        .insert::<Plain>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    b.run().await;
    b.get(first).await.assert_failed("bad input");
    let second = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    assert!(matches!(b.retry(first).await, Err(Error::Duplicate { .. })));
    b.get(first).await.assert_status(Status::Failed);
    b.cancel(second).await.unwrap();
    b.retry(first).await.unwrap();
    b.get(first).await.assert_status(Status::Runnable);
}

pub async fn one_partition_never_runs_two_steps_at_once<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let key = format!("{tag}:account");
    let a = b
        .insert::<Parted>(S::tagged(&tag), Opts::default().partition_key(&key))
        .await
        .unwrap();
    let c = b
        .insert::<Parted>(S::tagged(&format!("{tag}:free")), Opts::default())
        .await
        .unwrap();
    let d = b
        .insert::<Parted>(S::tagged(&tag), Opts::default().partition_key(&key))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 6, done: 3, steps: 9}");
    for id in [a, c, d] {
        b.get(id).await.assert_status(Status::Done);
    }
    assert_eq!(
        most_at_once(&tag),
        1,
        "two steps of one partition overlapped"
    );
    // Within the partition, the pick's order: the lower id first, step after step.
    let order = logged(&tag);
    let want: Vec<String> = [
        (a, "one"),
        (a, "two"),
        (a, "three"),
        (d, "one"),
        (d, "two"),
        (d, "three"),
    ]
    .iter()
    .map(|(id, s)| format!("{id}:{s}"))
    .collect();
    assert_eq!(order, want);
}

/// A cron schedule fires on the clock: nothing before its first fire time, then one
/// instance per fire time keyed by `fire_key`; after a jump over three fire times, one for
/// the newest (the default catch-up, `RunOnce`), the other two reported skipped.
pub async fn a_cron_schedule_fires_on_the_clock<B: Backend>(b: &mut B) {
    use gen_durable::{fire_key, Entry, Event, Schedule};

    let tick = Schedule::cron("tick", "* * * * *", |_| Entry::<Counter>::new(S::default()))
        .expect("a valid pattern");
    b.schedule(tick).await;
    assert_eq!(b.run().await.steps, 0, "no fire time has come");
    assert!(b.events().is_empty());

    let minute = |m: i64| gen_durable_testkit::epoch() + chrono::Duration::minutes(m);
    b.advance(Duration::from_secs(60)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    let first = b.get_by_key(&fire_key("tick", minute(1))).await;
    first.assert_done(json!({ "total": 111 }));

    b.advance(Duration::from_secs(180)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    let newest = b.get_by_key(&fire_key("tick", minute(4))).await;
    newest.assert_done(json!({ "total": 111 }));
    assert_eq!(newest.id, first.id + 1, "00:02 and 00:03 inserted nothing");
    let fired = |m: i64, id: i64| Event::ScheduleFired {
        schedule: "tick".into(),
        fire_time: minute(m),
        id: Some(id),
    };
    assert_eq!(
        b.events(),
        [
            fired(1, first.id),
            fired(4, newest.id),
            Event::ScheduleSkipped {
                schedule: "tick".into(),
                count: 2,
                reason: "catch-up policy run_once".into(),
            },
        ]
    );
}

/// A schedule of `name` firing `pattern`; its entry panics for the fire time `bad`.
fn counter_schedule(
    name: &str,
    pattern: &str,
    bad: Option<chrono::DateTime<chrono::Utc>>,
) -> gen_durable::Schedule {
    gen_durable::Schedule::cron(name, pattern, move |fire| {
        if Some(fire) == bad {
            panic!("no entry for {fire}");
        }
        gen_durable::Entry::<Counter>::new(S::default())
    })
    .expect("a valid pattern")
}

pub async fn r4b_1_a_redeclared_schedule_fires_by_its_new_pattern_at_once<B: Backend>(b: &mut B) {
    use gen_durable::{fire_key, Event};

    let minute = |m: i64| gen_durable_testkit::epoch() + chrono::Duration::minutes(m);
    let fired = |m: i64, id: i64| Event::ScheduleFired {
        schedule: "tick".into(),
        fire_time: minute(m),
        id: Some(id),
    };
    b.schedule(counter_schedule("tick", "* * * * *", None))
        .await;
    assert_eq!(b.run().await.steps, 0, "declared, no fire time has come");
    // The next release fires at half past each hour: 00:01 is no longer a fire time.
    b.schedule(counter_schedule("tick", "30 * * * *", None))
        .await;
    assert_eq!(b.run().await.steps, 0, "redeclared");
    b.advance(Duration::from_secs(60)).await;
    assert_eq!(b.run().await.steps, 0, "nothing by the replaced pattern");
    b.advance(Duration::from_secs(29 * 60)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    let half_past = b.get_by_key(&fire_key("tick", minute(30))).await;
    half_past.assert_done(json!({ "total": 111 }));
    // And back to every minute: from the next minute, not from 01:30.
    b.schedule(counter_schedule("tick", "* * * * *", None))
        .await;
    assert_eq!(b.run().await.steps, 0, "redeclared");
    b.advance(Duration::from_secs(60)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    let next_minute = b.get_by_key(&fire_key("tick", minute(31))).await;
    assert_eq!(
        b.events(),
        [fired(30, half_past.id), fired(31, next_minute.id)]
    );
}

pub async fn r4b_3_a_panicking_schedule_entry_skips_its_fire_time_and_the_others_go_on<
    B: Backend,
>(
    b: &mut B,
) {
    use gen_durable::{fire_key, Event};

    let minute = |m: i64| gen_durable_testkit::epoch() + chrono::Duration::minutes(m);
    // Declared in this order, both backends report a pass's fires in the same order.
    b.schedule(counter_schedule("good", "* * * * *", None))
        .await;
    b.schedule(counter_schedule("bad", "* * * * *", Some(minute(1))))
        .await;
    assert_eq!(b.run().await.steps, 0, "declared");
    b.advance(Duration::from_secs(60)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.advance(Duration::from_secs(60)).await;
    assert_eq!(b.run().await.to_string(), "{next: 4, done: 2, steps: 6}");
    let good_1 = b.get_by_key(&fire_key("good", minute(1))).await.id;
    let good_2 = b.get_by_key(&fire_key("good", minute(2))).await.id;
    let bad_2 = b.get_by_key(&fire_key("bad", minute(2))).await.id;
    let fired = |name: &str, m: i64, id: i64| Event::ScheduleFired {
        schedule: name.into(),
        fire_time: minute(m),
        id: Some(id),
    };
    let panicked = format!(
        "fire time {t}: the entry closure panicked: no entry for {t}",
        t = minute(1)
    );
    assert_eq!(
        b.events(),
        [
            fired("good", 1, good_1),
            Event::ScheduleSkipped {
                schedule: "bad".into(),
                count: 1,
                reason: panicked,
            },
            fired("good", 2, good_2),
            fired("bad", 2, bad_2),
        ]
    );
}
