//! Operator actions against real PostgreSQL with running engines: a pause honored by a
//! node's picker and a resume that wakes it, restart's refusals and its step check against
//! what live nodes announce, and bulk cancel / retry by filter (with dry runs).

mod common;

use std::time::Duration;

use common::{count, eventually, status, Count, Events};
use gen_durable::{
    Child, Client, Clock, Engine, Entry, Error, Event, Filter, QueueConfig, Registry, Status, Step,
};
use gen_durable_testkit::{epoch, TestDb};
use serde_json::json;

test_fsm!(Quick, state = Count, queue = "c", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!("ran"))) },
});

/// Released by the test: a step that is running while its queue is paused.
static RELEASE: std::sync::LazyLock<tokio::sync::Semaphore> =
    std::sync::LazyLock::new(|| tokio::sync::Semaphore::new(0));

test_fsm!(Held, state = Count, queue = "c", version = 1, {
    Run => "run" |_ctx| {
        RELEASE.acquire().await.expect("semaphore open").forget();
        Ok(Step::next(Held::Then))
    },
    Then => "then" |_ctx| { Ok(Step::done(json!("then"))) },
});

test_fsm!(Other, state = Count, queue = "d", version = 1, {
    Run => "run" |_ctx| { Ok(Step::done(json!("other ran"))) },
});

test_fsm!(Parked, state = Count, queue = "c", version = 1, {
    Wait => "wait" |_ctx| { Ok(Step::await_signal(["never"], Parked::After)) },
    After => "after" |_ctx| { Ok(Step::done(json!("after"))) },
});

test_fsm!(Fans, state = Count, queue = "c", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Parked>(Count::default()), Child::new::<Parked>(Count::default())], Fans::After))
    },
    After => "after" |_ctx| { Ok(Step::done(json!(null))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Quick>();
    r.register::<Other>();
    r.register::<Parked>();
    r.register::<Fans>();
    r.register::<Held>();
    r
}

/// An engine on queues "c" and "d" that polls only every 30 s: anything it does sooner
/// was woken by a NOTIFY.
async fn engine(db: &TestDb, events: &Events) -> Engine {
    let slow = QueueConfig::new(4)
        .with_poll_interval(Duration::from_secs(30))
        .with_max_poll_interval(Duration::from_secs(30));
    Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue_with("c", slow.clone())
        .queue_with("d", slow)
        .on_event(events.handler())
        .start()
        .await
        .expect("engine starts")
}

fn empty_picks_of(events: &Events, queue: &str) -> usize {
    events
        .all()
        .iter()
        .filter(|e| matches!(e, Event::PickStop { queue: q, count: 0, .. } if q == queue))
        .count()
}

async fn statuses(pool: &sqlx::PgPool, ids: &[i64]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        out.push(status(pool, *id).await);
    }
    out
}

#[tokio::test]
async fn a_paused_queue_is_skipped_by_a_running_engine_and_resume_wakes_it_at_once() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let events = Events::default();
    let engine = engine(&db, &events).await;

    assert!(gd.pause_queue("c", Some("maintenance")).await.unwrap());
    let picks_before = empty_picks_of(&events, "c");
    let held: Vec<i64> = gd
        .insert_all((0..5).map(|_| Entry::<Quick>::new(Count::default())))
        .await
        .unwrap();
    let other = gd.insert::<Other>(Count::default()).await.unwrap();
    // The insert's wake-up made the picker of "c" pick: it claimed nothing.
    eventually(10, "a pick of the paused queue", || async {
        empty_picks_of(&events, "c") > picks_before
    })
    .await;
    eventually(10, "the other queue's row to run", || async {
        status(db.pool(), other).await == "done"
    })
    .await;
    assert_eq!(statuses(db.pool(), &held).await, ["runnable"; 5]);
    let paused = gd.paused_queues().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (paused[0].queue.as_str(), paused[0].reason.as_deref()),
        ("c", Some("maintenance"))
    );

    // Polling every 30 s: done within 10 s only because the resume woke the picker.
    assert!(gd.resume_queue("c").await.unwrap());
    eventually(10, "the paused rows to run after the resume", || async {
        statuses(db.pool(), &held).await == ["done"; 5]
    })
    .await;
    assert!(gd.paused_queues().await.unwrap().is_empty());
    engine.shutdown(Duration::from_secs(10)).await;
    db.close().await;
}

#[tokio::test]
async fn a_step_running_when_its_queue_is_paused_commits_and_its_next_step_waits() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let id = gd.insert::<Held>(Count::default()).await.unwrap();
    eventually(10, "the step to be running", || async {
        status(db.pool(), id).await == "executing"
    })
    .await;
    gd.pause_queue("c", None).await.unwrap();
    RELEASE.add_permits(1);
    // Its outcome commits (runnable at `then`), and no node claims `then`.
    eventually(10, "the running step's outcome", || async {
        common::column(db.pool(), id, "step").await.as_deref() == Some("then")
            && status(db.pool(), id).await == "runnable"
    })
    .await;
    let picks = empty_picks_of(&events, "c");
    let other = gd.insert::<Other>(Count::default()).await.unwrap();
    let nudge = gd.insert::<Quick>(Count::default()).await.unwrap();
    eventually(
        10,
        "a pick of the paused queue and the other queue's row",
        || async {
            empty_picks_of(&events, "c") > picks && status(db.pool(), other).await == "done"
        },
    )
    .await;
    assert_eq!(statuses(db.pool(), &[id, nudge]).await, ["runnable"; 2]);
    gd.resume_queue("c").await.unwrap();
    eventually(10, "the rest to run after the resume", || async {
        statuses(db.pool(), &[id, nudge]).await == ["done"; 2]
    })
    .await;
    engine.shutdown(Duration::from_secs(10)).await;
    db.close().await;
}

#[tokio::test]
async fn restart_refuses_an_executing_instance_and_changes_nothing() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Quick>(Count::default()).await.unwrap();
    sqlx::query(
        "UPDATE gd_instances SET status = 'executing', locked_by = 'n1', lease_epoch = 7,
                lease_expires_at = now() + interval '1 minute' WHERE id = $1",
    )
    .bind(id)
    .execute(db.pool())
    .await
    .unwrap();
    let e = gd.restart(id, "run").await.unwrap_err();
    assert!(
        matches!(&e, Error::WrongStatus { status, .. } if *status == Status::Executing),
        "{e}"
    );
    let (st, epoch, locked): (String, i64, Option<String>) = sqlx::query_as(
        "SELECT status::text, lease_epoch, locked_by FROM gd_instances WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (st.as_str(), epoch, locked.as_deref()),
        ("executing", 7, Some("n1"))
    );
    db.close().await;
}

#[tokio::test]
async fn restart_checks_the_step_against_what_live_nodes_announce() {
    let db = TestDb::new().await;
    let inserter = Client::new(db.pool().clone()).with_registry(registry());
    // An operator's client that links no FSM, as the stock CLI.
    let operator = Client::new(db.pool().clone()).with_registry(Registry::new());
    let id = inserter.insert::<Parked>(Count::default()).await.unwrap();

    let e = operator.restart(id, "after").await.unwrap_err();
    assert!(
        matches!(&e, Error::UnknownSteps { fsm, version: 1 } if fsm == "Parked"),
        "{e}"
    );
    assert_eq!(status(db.pool(), id).await, "runnable");

    let events = Events::default();
    let engine = engine(&db, &events).await;
    eventually(10, "the node to park the row", || async {
        status(db.pool(), id).await == "awaiting_signal"
    })
    .await;
    let announced: serde_json::Value =
        sqlx::query_scalar("SELECT steps -> 'Parked@1' FROM gd_nodes")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(announced, json!(["wait", "after"]));

    match operator.restart(id, "nope").await {
        Err(Error::UnknownStep { step, known, .. }) => {
            assert_eq!(step, "nope");
            assert_eq!(known, ["wait", "after"]);
        }
        other => panic!("expected UnknownStep, got {other:?}"),
    }
    assert_eq!(status(db.pool(), id).await, "awaiting_signal");

    operator.restart(id, "after").await.unwrap();
    eventually(10, "the restarted row to run its step", || async {
        status(db.pool(), id).await == "done"
    })
    .await;
    engine.shutdown(Duration::from_secs(10)).await;
    db.close().await;
}

#[tokio::test]
async fn cancel_where_cancels_every_match_in_batches_and_a_dry_run_changes_nothing() {
    let db = TestDb::new().await;
    let p = db.pool();
    let clock = Clock::manual(epoch());
    let gd = Client::new(p.clone())
        .with_registry(registry())
        .with_clock(clock.clone());
    let old: Vec<i64> = gd
        .insert_all((0..1_100).map(|_| Entry::<Parked>::new(Count::default())))
        .await
        .unwrap();
    let bystander = gd.insert::<Quick>(Count::default()).await.unwrap();
    clock.advance(Duration::from_secs(2 * 3600));
    let young = gd.insert::<Parked>(Count::default()).await.unwrap();
    let keyed = gd
        .insert::<Parked>(Count::default())
        .correlation_key("tenant-7:order-1")
        .await
        .unwrap();

    let stuck = Filter::new()
        .with_queue("c")
        .with_fsm("Parked")
        .with_older_than(Duration::from_secs(3600));
    let dry = gd.cancel_where(&stuck, true).await.unwrap();
    assert_eq!(
        (dry.matched, dry.changed, dry.batches, dry.dry_run),
        (1_100, 0, 0, true)
    );
    let runnable = "SELECT count(*) FROM gd_instances WHERE status = 'runnable'";
    assert_eq!(count(p, runnable).await, 1_103, "a dry run changes nothing");

    let none = gd
        .cancel_where(&Filter::new().with_queue("no-such-queue"), false)
        .await
        .unwrap();
    assert_eq!((none.matched, none.changed, none.batches), (0, 0, 0));
    assert_eq!(count(p, runnable).await, 1_103);

    let r = gd.cancel_where(&stuck, false).await.unwrap();
    assert_eq!(
        (
            r.matched,
            r.changed,
            r.after_current_step,
            r.skipped,
            r.batches
        ),
        (1_100, 1_100, 0, 0, 3)
    );
    let cancelled = statuses(p, &old[..3]).await;
    assert_eq!(cancelled, ["failed"; 3]);
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM gd_instances WHERE last_error = 'cancelled'"
        )
        .await,
        1_100
    );
    assert_eq!(
        statuses(p, &[bystander, young, keyed]).await,
        ["runnable"; 3]
    );

    // By key prefix: only the keyed row.
    let r = gd
        .cancel_where(
            &Filter::new()
                .with_fsm("Parked")
                .with_key_prefix("tenant-7:"),
            false,
        )
        .await
        .unwrap();
    assert_eq!((r.matched, r.changed), (1, 1));
    assert_eq!(statuses(p, &[young, keyed]).await, ["runnable", "failed"]);
    db.close().await;
}

#[tokio::test]
async fn cancel_where_takes_live_children_and_flags_executing_rows() {
    let db = TestDb::new().await;
    let p = db.pool();
    let gd = Client::new(p.clone()).with_registry(registry());
    let events = Events::default();
    let engine = engine(&db, &events).await;
    let parent = gd.insert::<Fans>(Count::default()).await.unwrap();
    eventually(
        10,
        "the parent to await its two parked children",
        || async {
            count(
                p,
                "SELECT count(*) FROM gd_instances WHERE status = 'awaiting_signal'",
            )
            .await
                == 2
                && status(p, parent).await == "awaiting_children"
        },
    )
    .await;
    engine.shutdown(Duration::from_secs(10)).await;
    let running = gd.insert::<Quick>(Count::default()).await.unwrap();
    sqlx::query("UPDATE gd_instances SET status = 'executing', locked_by = 'n1' WHERE id = $1")
        .bind(running)
        .execute(p)
        .await
        .unwrap();

    let r = gd
        .cancel_where(&Filter::new().with_fsm("Fans"), false)
        .await
        .unwrap();
    assert_eq!(
        (r.matched, r.changed),
        (1, 3),
        "the parent and its two children"
    );
    assert_eq!(
        count(
            p,
            "SELECT count(*) FROM gd_instances WHERE status = 'failed'"
        )
        .await,
        3
    );
    let r = gd
        .cancel_where(&Filter::new().with_fsm("Quick"), false)
        .await
        .unwrap();
    assert_eq!((r.matched, r.changed, r.after_current_step), (1, 0, 1));
    assert_eq!(status(p, running).await, "executing");
    let flagged: bool =
        sqlx::query_scalar("SELECT cancel_requested FROM gd_instances WHERE id = $1")
            .bind(running)
            .fetch_one(p)
            .await
            .unwrap();
    assert!(flagged, "its node fails it after its step");
    db.close().await;
}

#[tokio::test]
async fn retry_where_retries_failed_matches_and_skips_a_key_taken_meanwhile() {
    let db = TestDb::new().await;
    let p = db.pool();
    let gd = Client::new(p.clone()).with_registry(registry());
    let failed: Vec<i64> = gd
        .insert_all((0..3).map(|_| Entry::<Quick>::new(Count::default())))
        .await
        .unwrap();
    let keyed = gd
        .insert::<Quick>(Count::default())
        .correlation_key("k1")
        .await
        .unwrap();
    let live = gd.insert::<Parked>(Count::default()).await.unwrap();
    sqlx::query(
        "UPDATE gd_instances SET status = 'failed', last_error = 'boom' WHERE fsm = 'Quick'",
    )
    .execute(p)
    .await
    .unwrap();
    // The failed row freed its key; another row took it.
    let holder = gd
        .insert::<Parked>(Count::default())
        .correlation_key("k1")
        .await
        .unwrap();

    let quick = Filter::new().with_fsm("Quick");
    let dry = gd.retry_where(&quick, true).await.unwrap();
    assert_eq!((dry.matched, dry.dry_run), (4, true));
    let failed_rows = "SELECT count(*) FROM gd_instances WHERE status = 'failed'";
    assert_eq!(count(p, failed_rows).await, 4, "a dry run changes nothing");

    let none = gd
        .retry_where(&Filter::new().with_fsm("Parked"), false)
        .await
        .unwrap();
    assert_eq!((none.matched, none.changed), (0, 0), "no failed Parked row");

    let r = gd.retry_where(&quick, false).await.unwrap();
    assert_eq!((r.matched, r.changed, r.skipped, r.batches), (4, 3, 1, 1));
    assert_eq!(statuses(p, &failed).await, ["runnable"; 3]);
    assert_eq!(
        status(p, keyed).await,
        "failed",
        "its key is held by {holder}"
    );
    assert_eq!(statuses(p, &[live, holder]).await, ["runnable"; 2]);
    db.close().await;
}

#[tokio::test]
async fn a_bad_filter_is_refused_before_anything_is_read_or_written() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Quick>(Count::default()).await.unwrap();
    let cases = [
        (Filter::new(), "names neither a queue nor an FSM"),
        (
            Filter::new().with_queue("c").with_version(1),
            "version without an FSM",
        ),
        (
            Filter::new()
                .with_fsm("Quick")
                .with_statuses([Status::Done]),
            "status done is not one a cancel takes",
        ),
    ];
    for (f, why) in cases {
        let e = gd.cancel_where(&f, false).await.unwrap_err();
        assert!(
            matches!(&e, Error::InvalidInput { what: "filter", reason } if reason.contains(why)),
            "{e}"
        );
    }
    let e = gd
        .retry_where(
            &Filter::new()
                .with_fsm("Quick")
                .with_statuses([Status::Runnable]),
            false,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    assert_eq!(status(db.pool(), id).await, "runnable");
    db.close().await;
}
