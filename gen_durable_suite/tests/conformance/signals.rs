//! Signals and await: errors, wake on a match only, no lost wake-up, consumption by id,
//! dedup, accumulation by re-awaiting, timeouts.

use std::time::Duration;

use gen_durable::{Error, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn signal_errors_store_nothing<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    let e = b.signal(id + 1000, "go", json!(1)).await.unwrap_err();
    assert!(
        matches!(e, Error::NotFound { id: x } if x == id + 1000),
        "{e}"
    );
    let e = b.signal(id, "", json!(1)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidSignalName { len: 0 }), "{e}");
    let e = b.signal(id, &"x".repeat(256), json!(1)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidSignalName { len: 256 }), "{e}");
    let big = json!("y".repeat(1 << 20));
    let e = b.signal(id, "go", big).await.unwrap_err();
    assert!(matches!(e, Error::PayloadTooLarge { .. }), "{e}");
    b.get(id).await.assert_inbox(Vec::<&str>::new());

    let done = b
        .insert::<Clocked>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let e = b.signal(done, "go", json!(1)).await.unwrap_err();
    assert!(
        matches!(&e, Error::Finished { id: x, status } if *x == done && *status == Status::Done),
        "{e}"
    );
    b.get(done).await.assert_inbox(Vec::<&str>::new());
}

pub async fn a_stray_signal_does_not_wake_and_stays<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Branch>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let d = b.signal(id, "stray", json!({})).await.unwrap();
    assert!(!d.woke && d.signal_id.is_some(), "{d:?}");
    assert_eq!(b.run().await.steps, 0);
    b.get(id)
        .await
        .assert_awaiting(["approve", "reject"])
        .assert_inbox(["stray"]);
    b.signal(id, "reject", json!({})).await.unwrap();
    b.run().await;
    b.get(id)
        .await
        .assert_done(json!("reject"))
        .assert_inbox(Vec::<&str>::new());
}

pub async fn a_signal_before_parking_wakes_at_commit<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    let d = b.signal(id, "go", json!({ "v": 3 })).await.unwrap();
    assert!(!d.woke, "not parked yet: stored, no wake");
    // The await commits as runnable at once, and the next step sees the signal.
    assert_eq!(b.run().await.to_string(), "{await: 1, done: 1, steps: 2}");
    b.get(id)
        .await
        .assert_done(json!({ "v": 3, "attempt": 0, "awaited": 1 }));
}

pub async fn an_any_of_await_takes_the_signal_sent<B: Backend>(b: &mut B) {
    let a = b
        .insert::<Branch>(S::default(), Opts::default())
        .await
        .unwrap();
    let r = b
        .insert::<Branch>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    assert!(b.signal(a, "approve", json!({})).await.unwrap().woke);
    assert!(b.signal(r, "reject", json!({})).await.unwrap().woke);
    b.run().await;
    b.get(a).await.assert_done(json!("approve"));
    b.get(r).await.assert_done(json!("reject"));
}

pub async fn re_awaiting_accumulates_without_a_busy_loop<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Acc>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    for (name, x) in [("b", 2), ("a", 1)] {
        b.signal(id, name, json!({ "x": x })).await.unwrap();
        // One wake per new signal, then parked again: re-awaiting consumes nothing
        // and does not count the signals it already saw as news.
        assert_eq!(b.run().await.to_string(), "{await: 1, steps: 1}");
        b.get(id).await.assert_awaiting(["a", "b", "c"]);
    }
    assert_eq!(b.get(id).await.inbox.len(), 2);
    b.signal(id, "c", json!({ "x": 4 })).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    let i = b.get(id).await;
    i.assert_done(json!({ "sum": 7, "count": 3 }));
    assert_eq!(
        i.state["log"],
        json!(["woke with 1", "woke with 2", "woke with 3"])
    );
}

pub async fn dedup_key_stores_once_while_stored<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Twice>(S::default(), Opts::default())
        .await
        .unwrap();
    let first = b.signal_dedup(id, "note", json!(1), "k").await.unwrap();
    let again = b.signal_dedup(id, "note", json!(2), "k").await.unwrap();
    assert!(first.signal_id.is_some());
    assert_eq!(again.signal_id, None, "a redelivery stores nothing");
    assert!(!again.woke);
    let other = b.signal_dedup(id, "note", json!(3), "k2").await.unwrap();
    assert!(other.signal_id.is_some());
    let i = b.get(id).await;
    i.assert_inbox(["note", "note"]);
    assert_eq!(i.inbox[0].payload, json!(1));
    assert_eq!(i.inbox[0].dedup_key.as_deref(), Some("k"));

    b.signal_dedup(id, "go", json!({ "v": 1 }), "g")
        .await
        .unwrap();
    let dup = b
        .signal_dedup(id, "go", json!({ "v": 9 }), "g")
        .await
        .unwrap();
    assert_eq!(dup.signal_id, None);
    assert_eq!(b.run().await.to_string(), "{next: 1, await: 2, steps: 3}");
    // `use` consumed "g": the same key may be delivered again, and is news.
    b.get(id)
        .await
        .assert_awaiting(["go"])
        .assert_inbox(["note", "note"]);
    let d = b
        .signal_dedup(id, "go", json!({ "v": 2 }), "g")
        .await
        .unwrap();
    assert!(d.signal_id.is_some() && d.woke, "{d:?}");
    b.run().await;
    b.get(id)
        .await
        .assert_done(json!({ "first": 1, "second": 2 }));
}

pub async fn replay_re_sees_the_awaited_signal<B: Backend>(b: &mut B) {
    let id = b
        .insert::<ReplayAwait>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(id, "go", json!({})).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{replay: 1, steps: 1}");
    let i = b.get(id).await;
    assert_eq!(i.awaits, ["go"], "replay keeps awaits");
    i.assert_inbox(["go"]);
    b.advance(Duration::from_secs(5)).await;
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "awaited": 1, "attempt": 1 }));
}

pub async fn a_same_name_signal_during_a_step_survives_consumption<B: Backend>(b: &mut B) {
    let id = b
        .insert::<MidStep>(S::tagged(b.tag()), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(id, "go", json!({ "n": 1 })).await.unwrap();
    // `use` consumes the signal it saw (n = 1) by id; the one sent while it ran (n = 2)
    // survives and wakes the next await at once.
    assert_eq!(
        b.run().await.to_string(),
        "{next: 1, await: 1, done: 1, steps: 3}"
    );
    b.get(id)
        .await
        .assert_done(json!({ "first": ["use saw [1]"], "then": [2] }));
}

pub async fn await_timeout_fires_only_when_the_clock_passes_it<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Timed>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let i = b.get(id).await;
    i.assert_awaiting(["late"]);
    assert_eq!(
        i.await_deadline,
        Some(b.now() + chrono::Duration::seconds(3600))
    );
    b.signal(id, "unrelated", json!(null)).await.unwrap();
    b.advance(Duration::from_secs(3599)).await;
    assert_eq!(b.run().await.steps, 0);
    b.get(id).await.assert_awaiting(["late"]);
    b.advance(Duration::from_secs(1)).await;
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    // Nothing awaited, attempt 0; the unrelated signal was still in the inbox.
    b.get(id)
        .await
        .assert_done(json!({ "awaited": 0, "attempt": 0, "inbox": 1 }));
}

pub async fn a_signal_beats_the_timeout<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Timed>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.advance(Duration::from_secs(60)).await;
    assert!(b.signal(id, "late", json!({})).await.unwrap().woke);
    let i = b.get(id).await;
    i.assert_status(Status::Runnable);
    assert_eq!(i.await_deadline, None, "the wake clears the deadline");
    b.advance(Duration::from_secs(7200)).await;
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(id)
        .await
        .assert_done(json!({ "awaited": 1, "attempt": 0, "inbox": 1 }));
}
