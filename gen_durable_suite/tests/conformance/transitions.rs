//! Per-transition flow control on both engines: a transition takes a K = 1 key or a gate
//! key and a later one releases it; a transition's rate limit applies to the step it
//! leads to and no other; a step's declared limit applies on every transition into it
//! and at insert; what the database refuses of a transition stops the instance.

use std::time::Duration;

use chrono::Duration as Span;
use gen_durable::{Gate, RateLimit, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn a_transition_takes_a_partition_key_and_a_later_one_releases_it<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            b.insert::<Switch>(S::tagged(&tag), Opts::default())
                .await
                .unwrap(),
        );
    }
    assert_eq!(b.run().await.to_string(), "{next: 3, await: 3, steps: 6}");
    assert_eq!(most_at_once(&tag), 1, "one `work` of the key at a time");
    for &id in &ids {
        let i = b.get(id).await;
        i.assert_awaiting(["go"]).assert_step("leave");
        assert_eq!(
            (i.partition_key.as_deref(), i.gate.as_deref()),
            (Some(tag.as_str()), None)
        );
        b.signal(id, "go", json!({})).await.unwrap();
    }
    assert_eq!(b.run().await.to_string(), "{next: 3, await: 3, steps: 6}");
    for &id in &ids {
        let i = b.get(id).await;
        i.assert_awaiting(["go"]).assert_step("fin");
        assert_eq!(
            (i.partition_key.as_deref(), i.gate.as_deref()),
            (None, None)
        );
    }
}

pub async fn a_transition_into_a_gate_runs_at_most_k_steps_of_the_key<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    b.set_gate("conf-tg", Gate::new(2)).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let s = S {
            n: 2,
            ..S::tagged(&tag)
        };
        ids.push(b.insert::<Switch>(s, Opts::default()).await.unwrap());
    }
    assert_eq!(b.run().await.to_string(), "{next: 5, await: 5, steps: 10}");
    assert!(most_at_once(&tag) <= 2, "{}", most_at_once(&tag));
    for id in ids {
        let i = b.get(id).await;
        i.assert_awaiting(["go"]);
        assert_eq!(i.attempt, 0);
        assert_eq!(
            (i.partition_key.as_deref(), i.gate.as_deref()),
            (Some(tag.as_str()), Some("conf-tg"))
        );
    }
}

pub async fn what_the_database_refuses_of_a_transition_stops_the_instance_with_the_refusal<
    B: Backend,
>(
    b: &mut B,
) {
    // A gate nobody declared.
    let s = S {
        n: 3,
        ..S::tagged(b.tag())
    };
    let gated = b.insert::<Switch>(s, Opts::default()).await.unwrap();
    // A child under a gate nobody declared.
    let parent = b
        .insert::<GatedParent>(S::default(), Opts::default())
        .await
        .unwrap();
    // A rate limit nobody declared yet, then a weight above the burst.
    let unknown = b
        .insert::<Hop>(S::tagged(&format!("{}-u", b.tag())), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.set_rate_limit("conf-tr", RateLimit::per(1, Duration::from_secs(1)))
        .await
        .unwrap();
    let s = S {
        n: 5,
        ..S::tagged(&format!("{}-h", b.tag()))
    };
    let heavy = b.insert::<Hop>(s, Opts::default()).await.unwrap();
    b.run().await;
    let i = b.get(gated).await;
    i.assert_failed("refused by the database")
        .assert_failed("unknown gate \"conf-undeclared\"")
        .assert_step("enter");
    assert_eq!(i.state["n"], 3, "the stored state is kept");
    b.get(parent)
        .await
        .assert_failed("unknown gate \"conf-nogate\"")
        .assert_step("spawn");
    assert!(
        b.get(parent).await.children.is_empty(),
        "no child was written"
    );
    b.get(unknown)
        .await
        .assert_failed("unknown rate limit \"conf-tr\"")
        .assert_step("a");
    b.get(heavy)
        .await
        .assert_failed("exceeds its rate limit's burst")
        .assert_step("a");
}

pub async fn a_transitions_rate_limit_applies_to_the_step_it_leads_to_and_no_other<B: Backend>(
    b: &mut B,
) {
    let (t0, tag) = (b.now(), b.tag().to_string());
    // One token every 32 s, burst 1.
    let limit = RateLimit::per(1, Duration::from_secs(32));
    b.set_rate_limit("conf-tr", limit).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            b.insert::<Hop>(S::tagged(&tag), Opts::default())
                .await
                .unwrap(),
        );
    }
    // Both `a` (not limited); one `b` takes the token, then its `c`, `b` again (entered
    // without a limit: free) and `c` finish; the other `b` waits for its token.
    assert_eq!(b.run().await.to_string(), "{next: 5, done: 1, steps: 6}");
    let mut waiting = Vec::new();
    for &id in &ids {
        let i = b.get(id).await;
        if i.status == Status::Done {
            continue;
        }
        i.assert_status(Status::Runnable).assert_step("b");
        assert_eq!((i.attempt, i.eligible_at), (0, t0 + Span::seconds(32)));
        waiting.push(id);
    }
    assert_eq!(waiting.len(), 1, "one row waits for the token");
    b.advance(Duration::from_secs(32)).await;
    assert_eq!(b.run().await.to_string(), "{next: 3, done: 1, steps: 4}");
    b.get(waiting[0]).await.assert_status(Status::Done);
    let steps = logged(&tag);
    assert_eq!(steps.len(), 10, "{steps:?}");
}

pub async fn a_steps_declared_rate_limit_applies_on_every_transition_into_it_and_at_insert<
    B: Backend,
>(
    b: &mut B,
) {
    let (t0, tag) = (b.now(), b.tag().to_string());
    // One token every 32 s, burst 2.
    let limit = RateLimit::per(1, Duration::from_secs(32)).burst(2);
    b.set_rate_limit("conf-decl", limit).await.unwrap();
    let first = b
        .insert::<Declared>(S::tagged(&tag), Opts::default())
        .await
        .unwrap();
    // `start` → `pay` (1 token of 2) → `pay` with weight 2: 1 there, the other due in 32 s.
    assert_eq!(b.run().await.to_string(), "{next: 2, steps: 2}");
    let i = b.get(first).await;
    i.assert_status(Status::Runnable).assert_step("pay");
    assert_eq!(i.eligible_at, t0 + Span::seconds(32));
    // Inserted at `pay`: the step's limit applies to it too (the bucket is at -1).
    let second = b
        .insert::<Declared>(S::tagged(&tag), Opts::default().step("pay"))
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{steps: 0}");
    assert_eq!(b.get(second).await.eligible_at, t0 + Span::seconds(64));
    b.advance(Duration::from_secs(32)).await;
    assert_eq!(b.run().await.to_string(), "{done: 1, steps: 1}");
    b.get(first).await.assert_done(json!(2));
    b.advance(Duration::from_secs(32)).await;
    // The second's `pay` runs, and its weight-2 `pay` waits 64 s for an empty bucket.
    assert_eq!(b.run().await.to_string(), "{next: 1, steps: 1}");
    assert_eq!(b.get(second).await.eligible_at, t0 + Span::seconds(128));
    // A different key of the limit has its own bucket.
    let other = b
        .insert::<Declared>(S::tagged(&format!("{tag}-b")), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, steps: 2}");
    assert_eq!(b.get(other).await.eligible_at, t0 + Span::seconds(64 + 32));
}
