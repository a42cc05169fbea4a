//! Operator actions on both engines: pausing a queue, and restarting an instance from a
//! named step.

use gen_durable::{Error, Status};
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
        matches!(&e, Error::WrongStatus { status, .. } if status == "awaiting_children"),
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
