//! Operator actions on both engines: pausing a queue, restarting an instance from a
//! named step, and cancelling or retrying every instance a filter matches.

use std::time::Duration;

use gen_durable::{BulkReport, Error, Filter, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn a_paused_queue_runs_nothing_until_resumed_and_other_queues_go_on<B: Backend>(
    b: &mut B,
) {
    assert!(b.pause_queue("conf", Some("deploy")).await.unwrap());
    let held = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    let free_tag = format!("{}:free", b.tag());
    let other = b
        .insert::<Parted>(S::tagged(&free_tag), Opts::default())
        .await
        .unwrap();
    assert_eq!(
        b.run().await.to_string(),
        "{next: 2, done: 1, steps: 3}",
        "only the queue that is not paused runs"
    );
    b.get(other).await.assert_done(json!(null));
    let i = b.get(held).await;
    i.assert_status(Status::Runnable).assert_step("a");
    assert_eq!(i.attempt, 0);
    assert!(b.kinds(held).is_empty(), "no step of a paused queue ran");

    assert!(b.resume_queue("conf").await.unwrap());
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(held).await.assert_done(json!({ "total": 111 }));
}

pub async fn pausing_is_idempotent_and_keeps_the_first_reason<B: Backend>(b: &mut B) {
    assert!(b.paused_queues().await.is_empty());
    assert!(b.pause_queue("conf", Some("deploy")).await.unwrap());
    assert!(
        !b.pause_queue("conf", Some("again")).await.unwrap(),
        "already paused"
    );
    assert!(b.pause_queue("par", None).await.unwrap());
    assert_eq!(
        b.paused_queues().await,
        [
            ("conf".to_string(), Some("deploy".to_string())),
            ("par".to_string(), None)
        ]
    );
    assert!(b.resume_queue("conf").await.unwrap());
    assert!(
        !b.resume_queue("conf").await.unwrap(),
        "not paused any more"
    );
    assert_eq!(b.paused_queues().await, [("par".to_string(), None)]);
    for bad in ["", "nul\0"] {
        let e = b.pause_queue(bad, None).await.unwrap_err();
        assert!(
            matches!(e, Error::InvalidInput { what: "queue", .. }),
            "{e}"
        );
    }
    let e = b.pause_queue("conf", Some("nul\0")).await.unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { what: "reason", .. }),
        "{e}"
    );
    assert_eq!(b.paused_queues().await, [("par".to_string(), None)]);
}

pub async fn a_parked_instance_of_a_paused_queue_is_woken_and_runs_after_the_resume<B: Backend>(
    b: &mut B,
) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.pause_queue("conf", None).await.unwrap();
    let d = b.signal(id, "go", json!({ "v": 3 })).await.unwrap();
    assert!(d.woke, "signals are delivered while a queue is paused");
    assert_eq!(b.run().await.steps, 0);
    b.get(id)
        .await
        .assert_status(Status::Runnable)
        .assert_inbox(["go"]);
    b.resume_queue("conf").await.unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "v": 3, "attempt": 0, "awaited": 1 }));
}

pub async fn restart_runs_a_done_instance_again_from_a_named_step<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.get(id).await.assert_done(json!({ "total": 111 }));
    b.restart(id, "b").await.unwrap();
    let i = b.get(id).await;
    i.assert_status(Status::Runnable).assert_step("b");
    assert_eq!((i.attempt, i.result.clone()), (0, None));
    assert_eq!(b.run().await.to_string(), "{next: 1, done: 1, steps: 2}");
    let i = b.get(id).await;
    i.assert_done(json!({ "total": 221 }));
    assert_eq!(
        i.state["log"],
        json!(["a@0", "b@0", "b@0"]),
        "from the last state"
    );
}

pub async fn restart_moves_a_parked_instance_to_a_step_keeping_its_inbox<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(id, "stray", json!(1)).await.unwrap();
    b.restart(id, "use").await.unwrap();
    let i = b.get(id).await;
    i.assert_status(Status::Runnable)
        .assert_step("use")
        .assert_inbox(["stray"]);
    assert!(i.awaits.is_empty() && i.await_deadline.is_none(), "{i:?}");
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "v": null, "attempt": 0, "awaited": 0 }));
}

pub async fn restart_refuses_an_unknown_step_or_instance_and_changes_nothing<B: Backend>(
    b: &mut B,
) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let e = b.restart(id, "nope").await.unwrap_err();
    match e {
        Error::UnknownStep { step, known, .. } => {
            assert_eq!(step, "nope");
            assert_eq!(known, ["park", "use"]);
        }
        other => panic!("expected UnknownStep, got {other:?}"),
    }
    let e = b.restart(id + 1000, "park").await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    b.get(id).await.assert_awaiting(["go"]).assert_step("use");
}

pub async fn restart_of_a_finished_child_rearms_a_waiting_parent_not_one_that_moved_on<
    B: Backend,
>(
    b: &mut B,
) {
    // Mixed: a parked Waiter child and a Kid that fails; the parent awaits the Waiter.
    let parent = b
        .insert::<Mixed>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let kids = b.get(parent).await.children;
    let kid = kids[1];
    b.get(kid).await.assert_failed("kid failed");
    assert_eq!(b.get(parent).await.children_pending, 1);
    b.restart(kid, "only").await.unwrap();
    b.get(kid).await.assert_status(Status::Runnable);
    assert_eq!(
        b.get(parent).await.children_pending,
        2,
        "it waits for it again"
    );
    b.run().await;
    b.get(kid).await.assert_failed("kid failed");
    let p = b.get(parent).await;
    p.assert_status(Status::AwaitingChildren);
    assert_eq!(p.children_pending, 1);

    // A parent that read its children's outcomes and went on.
    let done = b
        .insert::<Parent>(
            S {
                n: 1,
                log: vec!["fail:0".into()],
                ..S::default()
            },
            Opts::default(),
        )
        .await
        .unwrap();
    b.run().await;
    b.get(done)
        .await
        .assert_done(json!({ "total": 1, "done": 0, "failed": 1 }));
    let child = b.get(done).await.children[0];
    let e = b.restart(child, "only").await.unwrap_err();
    assert!(
        matches!(e, Error::ParentMovedOn { parent, .. } if parent == done),
        "{e}"
    );
    b.get(child).await.assert_failed("kid failed");
}

pub async fn restart_refuses_a_parent_with_live_children<B: Backend>(b: &mut B) {
    let parent = b
        .insert::<Holder>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let e = b.restart(parent, "spawn").await.unwrap_err();
    assert!(
        matches!(&e, Error::WrongStatus { status, .. } if *status == Status::AwaitingChildren),
        "{e}"
    );
    let p = b.get(parent).await;
    p.assert_status(Status::AwaitingChildren).assert_step("sum");
    assert_eq!(p.children_pending, 2);
}

pub async fn restart_of_a_finished_instance_whose_key_is_held_is_a_duplicate<B: Backend>(
    b: &mut B,
) {
    let key = format!("{}:restart", b.tag());
    let first = b
        .insert::<Counter>(S::default(), Opts::default().correlation_key(key.clone()))
        .await
        .unwrap();
    b.run().await;
    b.get(first).await.assert_done(json!({ "total": 111 }));
    b.pause_queue("conf", None).await.unwrap();
    let holder = b
        .insert::<Counter>(S::default(), Opts::default().correlation_key(key.clone()))
        .await
        .unwrap();
    let e = b.restart(first, "a").await.unwrap_err();
    assert!(matches!(e, Error::Duplicate { .. }), "{e}");
    b.get(first).await.assert_done(json!({ "total": 111 }));
    assert_eq!(b.get_by_key(&key).await.id, holder);
}

/// What a bulk action could change of each row.
async fn rows_of<B: Backend>(b: &mut B, ids: &[i64]) -> Vec<String> {
    let mut out = Vec::new();
    for &id in ids {
        let i = b.get(id).await;
        out.push(format!(
            "{} {:?} {} {} {:?} {} {:?}",
            i.id,
            i.status,
            i.step,
            i.attempt,
            i.last_error,
            i.eligible_at,
            i.inbox.len()
        ));
    }
    out
}

/// A bulk action's report, as (matched, changed, skipped, batches, dry_run).
fn counts(r: BulkReport) -> (u64, u64, u64, u64, bool) {
    assert_eq!(r.after_current_step, 0, "no step runs between calls: {r:?}");
    (r.matched, r.changed, r.skipped, r.batches, r.dry_run)
}

pub async fn a_bulk_dry_run_counts_and_changes_nothing<B: Backend>(b: &mut B) {
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(
            b.insert::<Waiter>(S::default(), Opts::default())
                .await
                .unwrap(),
        );
    }
    let failed = b
        .insert::<Plain>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let ids = [waiters.clone(), vec![failed]].concat();
    let unchanged = rows_of(b, &ids).await;

    let conf = Filter::new().with_queue("conf");
    let r = b.cancel_where(&conf, true).await.unwrap();
    assert_eq!(counts(r), (3, 0, 0, 0, true), "the live ones: {r:?}");
    let r = b
        .retry_where(&Filter::new().with_fsm("Plain"), true)
        .await
        .unwrap();
    assert_eq!(counts(r), (1, 0, 0, 0, true), "{r:?}");
    let r = b
        .cancel_where(&conf.clone().with_statuses([Status::Runnable]), true)
        .await
        .unwrap();
    assert_eq!(r.matched, 0);

    // A filter that names neither a queue nor an FSM, a status the action does not take,
    // a version without an FSM: refused, nothing read or written.
    let refused = [
        b.cancel_where(&Filter::new(), true).await,
        b.cancel_where(&Filter::new(), false).await,
        b.cancel_where(&conf.clone().with_statuses([Status::Done]), false)
            .await,
        b.retry_where(&conf.clone().with_statuses([Status::Runnable]), false)
            .await,
        b.retry_where(&conf.clone().with_version(1), false).await,
    ];
    for e in refused {
        assert!(
            matches!(e, Err(Error::InvalidInput { what: "filter", .. })),
            "{e:?}"
        );
    }
    assert_eq!(
        rows_of(b, &ids).await,
        unchanged,
        "a dry run or a refusal changed a row"
    );
}

pub async fn cancel_where_cancels_the_matches_with_their_live_children<B: Backend>(b: &mut B) {
    let w1 = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    let w2 = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    let holder = b
        .insert::<Holder>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let kids = b.get(holder).await.children;
    assert_eq!(kids.len(), 2);
    // A live row of another queue, kept runnable by a pause.
    b.pause_queue("par", None).await.unwrap();
    let tag = format!("{}:other", b.tag());
    let other = b
        .insert::<Parted>(S::tagged(&tag), Opts::default())
        .await
        .unwrap();

    // By FSM: the parent, and its live children with it.
    let r = b
        .cancel_where(&Filter::new().with_fsm("Holder"), false)
        .await
        .unwrap();
    assert_eq!(counts(r), (1, 3, 0, 1, false), "{r:?}");
    b.get(holder).await.assert_failed("cancelled");
    for k in &kids {
        b.get(*k).await.assert_failed("cancelled");
    }
    // By queue and status: nothing of "conf" is runnable.
    let r = b
        .cancel_where(
            &Filter::new()
                .with_queue("conf")
                .with_statuses([Status::Runnable]),
            false,
        )
        .await
        .unwrap();
    assert_eq!(counts(r), (0, 0, 0, 0, false));
    // By queue, FSM and version: the two waiters left, not the other queue's row.
    let r = b
        .cancel_where(
            &Filter::new()
                .with_queue("conf")
                .with_fsm("Waiter")
                .with_version(1)
                .with_statuses([Status::AwaitingSignal]),
            false,
        )
        .await
        .unwrap();
    assert_eq!(counts(r), (2, 2, 0, 1, false), "{r:?}");
    for id in [w1, w2] {
        b.get(id).await.assert_failed("cancelled");
    }
    b.get(other).await.assert_status(Status::Runnable);
    let r = b
        .cancel_where(&Filter::new().with_queue("conf"), false)
        .await
        .unwrap();
    assert_eq!(r.matched, 0, "nothing live is left in conf: {r:?}");
    b.resume_queue("par").await.unwrap();
    b.run().await;
    b.get(other).await.assert_status(Status::Done);
}

pub async fn retry_where_retries_the_failed_matches_and_skips_a_taken_key<B: Backend>(b: &mut B) {
    let old1 = b
        .insert::<Plain>(S::default(), Opts::default())
        .await
        .unwrap();
    let old2 = b
        .insert::<Plain>(S::default(), Opts::default())
        .await
        .unwrap();
    let cancelled = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.cancel(cancelled).await.unwrap();
    b.advance(Duration::from_secs(7200)).await;
    let key = format!("{}:keyed", b.tag());
    let recent = b
        .insert::<Plain>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    b.run().await;
    b.get(recent).await.assert_failed("bad input");

    // Failed over an hour ago, of FSM Plain: not the recent one, not the cancelled Waiter.
    let stale = Filter::new()
        .with_fsm("Plain")
        .with_older_than(Duration::from_secs(3600));
    let r = b.retry_where(&stale, true).await.unwrap();
    assert_eq!(counts(r), (2, 0, 0, 0, true));
    let r = b.retry_where(&stale, false).await.unwrap();
    assert_eq!(counts(r), (2, 2, 0, 1, false), "{r:?}");
    for id in [old1, old2] {
        let i = b.get(id).await;
        i.assert_status(Status::Runnable);
        assert_eq!(i.attempt, 0);
    }
    b.get(recent).await.assert_status(Status::Failed);
    b.get(cancelled).await.assert_failed("cancelled");
    // They fail again now: no longer over an hour old.
    b.run().await;
    b.get(old1).await.assert_failed("bad input");
    assert_eq!(b.retry_where(&stale, false).await.unwrap().matched, 0);

    // By key prefix: the recent one, whose key another instance now holds — skipped.
    let holder = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    let keyed = Filter::new().with_queue("conf").with_key_prefix(&key);
    let r = b.retry_where(&keyed, false).await.unwrap();
    assert_eq!(counts(r), (1, 0, 1, 1, false), "{r:?}");
    b.get(recent).await.assert_status(Status::Failed);
    // Once the holder is cancelled both are failed and match: the first (by id) takes the
    // key back, the second is skipped.
    b.cancel(holder).await.unwrap();
    let r = b.retry_where(&keyed, false).await.unwrap();
    assert_eq!(counts(r), (2, 1, 1, 1, false), "{r:?}");
    b.get(recent).await.assert_status(Status::Runnable);
    b.get(holder).await.assert_failed("cancelled");
    assert_eq!(b.get_by_key(&key).await.id, recent);
}

/// A bulk action takes the filters of the dashboard's list: an exact correlation key (not
/// the keys it prefixes), the insert time (since, inclusive; until, exclusive), a parent,
/// and a text in the last error, in any case. A key the database cannot hold is bad
/// input, refused before anything is read.
pub async fn bulk_filters_take_a_key_an_insert_time_a_parent_and_an_error_text<B: Backend>(
    b: &mut B,
) {
    let key = format!("{}:exact", b.tag());
    let keyed = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key(&key))
        .await
        .unwrap();
    let prefixed = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key(format!("{key}-2")))
        .await
        .unwrap();
    let failed = b
        .insert::<Plain>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.advance(Duration::from_secs(60)).await;
    let since = b.now();
    let holder = b
        .insert::<Holder>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let kids = b.get(holder).await.children;
    assert_eq!(kids.len(), 2);
    let conf = || Filter::new().with_queue("conf");

    // Dry runs: each filter matches what it names, and nothing is written.
    for (filter, matched) in [
        (conf().with_key(&key), 1),
        (conf().with_key_prefix(&key), 2),
        (conf().with_inserted_since(since), 3),
        (conf().with_inserted_until(since), 2),
        (conf().with_parent(holder), 2),
        (conf().with_parent(keyed), 0),
    ] {
        let r = b.cancel_where(&filter, true).await.unwrap();
        assert_eq!(r.matched, matched, "{filter:?}");
    }
    let by_error = conf().with_error_containing("BAD IN");
    assert_eq!(b.retry_where(&by_error, true).await.unwrap().matched, 1);
    assert_eq!(
        b.retry_where(&conf().with_error_containing("nope"), true)
            .await
            .unwrap()
            .matched,
        0
    );
    b.get(keyed).await.assert_status(Status::AwaitingSignal);

    // Done: the key's one instance, the parent's children, the failed one retried.
    let r = b.cancel_where(&conf().with_key(&key), false).await.unwrap();
    assert_eq!(counts(r), (1, 1, 0, 1, false), "{r:?}");
    b.get(keyed).await.assert_failed("cancelled");
    b.get(prefixed).await.assert_status(Status::AwaitingSignal);
    let r = b
        .cancel_where(&conf().with_parent(holder), false)
        .await
        .unwrap();
    assert_eq!(counts(r), (2, 2, 0, 1, false), "{r:?}");
    for k in &kids {
        b.get(*k).await.assert_failed("cancelled");
    }
    let r = b.retry_where(&by_error, false).await.unwrap();
    assert_eq!(counts(r), (1, 1, 0, 1, false), "{r:?}");
    b.get(failed).await.assert_status(Status::Runnable);

    // A key with a NUL: refused, nothing read or written.
    let err = b
        .cancel_where(&conf().with_key("a\0b"), false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, gen_durable::Error::InvalidInput { .. }),
        "{err:?}"
    );
    b.get(prefixed).await.assert_status(Status::AwaitingSignal);
}
