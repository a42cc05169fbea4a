//! The six outcomes and their attempt rules, `handle`, and stored states that no longer cast.

use std::time::Duration;

use gen_durable::Status;
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn next_runs_steps_in_order_and_resets_attempt<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    let i = b.get(id).await;
    i.assert_done(json!({ "total": 111 })).assert_step("c");
    assert_eq!(i.state["log"], json!(["a@0", "b@0"]));
    assert_eq!(i.attempt, 0);
    assert_eq!(b.kinds(id), ["next", "next", "done"]);
}

pub async fn replay_waits_for_the_clock_and_counts_attempts<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Replayer>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{replay: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_status(Status::Runnable).assert_step("go");
    assert_eq!(i.attempt, 1);
    assert_eq!(i.eligible_at, b.now() + chrono::Duration::seconds(10));

    assert_eq!(b.run().await.steps, 0, "not before the delay");
    b.advance(Duration::from_secs(9)).await;
    assert_eq!(b.run().await.steps, 0, "not before the delay");
    b.advance(Duration::from_secs(1)).await;
    assert_eq!(b.run().await.to_string(), "{replay: 1, steps: 1}");
    assert_eq!(b.get(id).await.attempt, 2);
    b.advance(Duration::from_secs(10)).await;
    assert_eq!(b.run().await.to_string(), "{next: 1, done: 1, steps: 2}");
    b.get(id).await.assert_done(json!({
        "attempt_at_fin": 0, "log": ["go@0", "go@1", "go@2"]
    }));
}

pub async fn await_parks_until_a_matching_signal<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{await: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_awaiting(["go"]).assert_step("use");
    assert_eq!(i.attempt, 0);
    assert_eq!(i.await_deadline, None);
    let d = b.signal(id, "go", json!({ "v": 7 })).await.unwrap();
    assert!(d.woke && d.signal_id.is_some(), "{d:?}");
    b.get(id).await.assert_status(Status::Runnable);
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "v": 7, "attempt": 0, "awaited": 1 }))
        .assert_inbox(Vec::<&str>::new());
}

pub async fn schedule_children_with_no_children_continues_at_once<B: Backend>(b: &mut B) {
    let id = b.insert::<Parent>(S::n(0), Opts::default()).await.unwrap();
    assert_eq!(
        b.run().await.to_string(),
        "{schedule_children: 1, done: 1, steps: 2}"
    );
    let i = b.get(id).await;
    i.assert_done(json!({ "total": 0, "done": 0, "failed": 0 }));
    assert_eq!(i.children_pending, 0);
}

pub async fn done_records_the_result_and_deletes_the_inbox<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(id, "stray", json!(1)).await.unwrap();
    b.signal(id, "go", json!({ "v": 1 })).await.unwrap();
    b.get(id).await.assert_inbox(["stray", "go"]);
    b.run().await;
    b.get(id)
        .await
        .assert_done(json!({ "v": 1, "attempt": 0, "awaited": 1 }))
        .assert_inbox(Vec::<&str>::new());
}

pub async fn stop_fails_keeping_attempt_and_deleting_the_inbox<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Stopper>(S::default(), Opts::default())
        .await
        .unwrap();
    b.signal(id, "whatever", json!(null)).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{replay: 1, stop: 1, steps: 2}");
    let i = b.get(id).await;
    i.assert_failed("gave up").assert_step("go");
    assert_eq!(i.last_error.as_deref(), Some("gave up"));
    assert_eq!(i.attempt, 1, "a terminal outcome keeps the attempt");
    assert!(i.inbox.is_empty());
    assert_eq!(b.kinds(id), ["replay", "stop"]);
}

pub async fn an_err_goes_to_handle<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Failing>(S::default(), Opts::default().step("fails"))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_done(json!({ "handled": "boom", "panic": false, "n": 0 }));
    assert_eq!(
        i.last_error.as_deref(),
        Some("boom"),
        "the failure is recorded"
    );
}

pub async fn a_panic_goes_to_handle<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Failing>(S::default(), Opts::default().step("panics"))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id).await.assert_done(json!({
        "handled": "step panicked: kaboom", "panic": true, "n": 0
    }));
}

pub async fn a_failing_handle_fails_the_instance<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Failing>(S::default(), Opts::default().step("handle_fails"))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{stop: 1, steps: 1}");
    b.get(id)
        .await
        .assert_failed("first; then handle failed: handle broke");
}

pub async fn the_default_handle_stops_with_the_error<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Plain>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{stop: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_failed("bad input");
    assert_eq!(i.last_error.as_deref(), Some("bad input"));
}

pub async fn handle_sees_the_last_committed_state<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Failing>(S::n(5), Opts::default().step("mutates"))
        .await
        .unwrap();
    b.run().await;
    let i = b.get(id).await;
    i.assert_done(json!({ "handled": "after mutating", "panic": false, "n": 5 }));
    assert_eq!(
        i.state["n"],
        json!(5),
        "the failed step's change is not committed"
    );
}

pub async fn an_uncastable_state_fails_without_handle<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Guarded>(S::default(), Opts::default())
        .await
        .unwrap();
    b.overwrite_state(id, json!({ "n": "not a number" })).await;
    assert_eq!(b.run().await.to_string(), "{stop: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_failed("stored state no longer casts into S");
    assert_eq!(i.state, json!({ "n": "not a number" }), "the state is kept");
}

pub async fn ctx_now_is_the_clock<B: Backend>(b: &mut B) {
    b.advance(Duration::from_secs(90)).await;
    let id = b
        .insert::<Clocked>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.get(id).await.assert_done(json!(b.now().to_rfc3339()));
}
