//! `explain`: one scenario per reason both engines know, each asserting the typed reason
//! and the English line, which must be the same on both (the clock is the same manual
//! one). The reasons only a database has — a paused queue, no live node — are tested in
//! `tests/client_explain.rs`.

use std::time::Duration;

use chrono::Duration as Span;
use gen_durable::{ChildState, Count, Error, Heartbeat, Holder, Key, Reason, Status};
use gen_durable_testkit::{epoch, KIT_LEASE, KIT_NODE};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn explain_done_shows_the_result<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let why = b.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::Done {
            result: json!({ "total": 111 })
        }
    );
    assert_eq!(
        (why.id, why.fsm.as_str(), why.version, why.queue.as_str()),
        (id, "Counter", 1, "conf")
    );
    assert_eq!((why.status, why.step.as_str()), (Status::Done, "c"));
    assert_eq!(why.to_string(), r#"done: {"total":111}"#);
}

pub async fn explain_failed_shows_the_last_error<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Plain>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let why = b.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::Failed {
            last_error: Some("bad input".into())
        }
    );
    assert_eq!(
        why.to_string(),
        r#"failed at step "only" (attempt 1): bad input"#
    );
}

pub async fn explain_executing_names_the_node_and_its_lease<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    let claimed = b.now();
    b.claim(id).await.unwrap();
    b.advance(Duration::from_secs(10)).await;
    let why = b.explain(id).await.unwrap();
    let lease_until = claimed + Span::from_std(KIT_LEASE).unwrap();
    assert_eq!(
        why.reason,
        Reason::Executing {
            node: KIT_NODE.into(),
            since: claimed,
            lease_until,
            node_seen_at: Some(b.now()),
            heartbeat: Heartbeat::Fresh,
            lease_expired: false,
            cancel_requested: false,
        }
    );
    assert_eq!(
        why.to_string(),
        "executing step \"a\" on node \"testkit\" since 2030-01-01 00:00:00 UTC (10 s ago), \
         lease until 2030-01-01 00:00:30 UTC (in 20 s), heartbeat fresh"
    );
    // Given back, it runs to the end.
    b.lose_lease(id).await.unwrap();
    b.run().await;
    b.get(id).await.assert_status(Status::Done);
}

pub async fn explain_awaiting_a_signal_names_it_the_deadline_and_the_unrelated_inbox<B: Backend>(
    b: &mut B,
) {
    let id = b
        .insert::<Timed>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(id, "shipped", json!({})).await.unwrap();
    b.signal(id, "note", json!(1)).await.unwrap();
    b.signal(id, "note", json!(2)).await.unwrap();
    b.advance(Duration::from_secs(3420)).await;
    let why = b.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::AwaitingSignals {
            names: vec!["late".into()],
            deadline: Some(epoch() + Span::hours(1)),
            unrelated: Count {
                n: 3,
                capped: false
            },
            unrelated_names: vec!["note".into(), "shipped".into()],
        }
    );
    assert_eq!(
        why.to_string(),
        "awaiting signal \"late\" until 2030-01-01 01:00:00 UTC (in 3 min); 3 unrelated \
         signals in the inbox: \"note\", \"shipped\""
    );
}

pub async fn explain_awaiting_children_lists_the_unfinished_ones<B: Backend>(b: &mut B) {
    // One child parks on a signal, the other fails: one of two still awaited.
    let id = b
        .insert::<Mixed>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let parent = b.get(id).await;
    let (waiter, kid) = (parent.children[0], parent.children[1]);
    b.get(kid).await.assert_status(Status::Failed);
    let why = b.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::AwaitingChildren {
            pending: 1,
            total: Count {
                n: 2,
                capped: false
            },
            waiting_on: vec![ChildState {
                id: waiter,
                fsm: "Waiter".into(),
                step: "use".into(),
                status: Status::AwaitingSignal,
            }],
        }
    );
    assert_eq!(
        why.to_string(),
        format!("awaiting 1 of 2 children before step \"sum\": {waiter} awaiting_signal")
    );
}

pub async fn explain_paused_names_since_when_and_why<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    let queue = b.explain(id).await.unwrap().queue;
    assert!(b
        .pause_queue(&queue, Some("smtp maintenance"))
        .await
        .unwrap());
    b.advance(Duration::from_secs(120)).await;
    let why = b.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::QueuePaused {
            since: b.now() - Span::minutes(2),
            why: Some("smtp maintenance".into()),
        }
    );
    assert_eq!(
        why.to_string(),
        format!(
            "queue {queue:?} is paused since 2030-01-01 00:00:00 UTC (2 min ago): smtp maintenance"
        )
    );
    // Resumed, it is runnable again.
    assert!(b.resume_queue(&queue).await.unwrap());
    let why = b.explain(id).await.unwrap();
    assert!(matches!(why.reason, Reason::Runnable { .. }), "{why}");
}

pub async fn explain_scheduled_names_the_time<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(
            S::default(),
            Opts::default().schedule_in(Duration::from_secs(180)),
        )
        .await
        .unwrap();
    let why = b.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::Scheduled {
            at: b.now() + Span::minutes(3)
        }
    );
    assert_eq!(
        why.to_string(),
        "scheduled for 2030-01-01 00:03:00 UTC (in 3 min)"
    );
    // Once due (and a node runs it), it is runnable.
    b.advance(Duration::from_secs(180)).await;
    let why = b.explain(id).await.unwrap();
    assert!(matches!(why.reason, Reason::Runnable { .. }), "{why}");
}

pub async fn explain_backoff_names_the_attempt_and_the_time<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Replayer>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let why = b.explain(id).await.unwrap();
    assert_eq!(why.attempt, 1);
    assert_eq!(
        why.reason,
        Reason::Backoff {
            until: b.now() + Span::seconds(10),
            last_error: None,
        }
    );
    assert_eq!(
        why.to_string(),
        "in backoff after attempt 1 until 2030-01-01 00:00:10 UTC (in 10 s); failed once at \"go\""
    );
    let t = why.trouble.expect("the history cites the failed attempt");
    assert_eq!((t.failures, t.leases_lost), (1, 0));
}

pub async fn explain_partition_blocked_names_the_holder<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let key = format!("{tag}:account");
    let first = b
        .insert::<Parted>(S::tagged(&tag), Opts::default().partition_key(&key))
        .await
        .unwrap();
    let second = b
        .insert::<Parted>(S::tagged(&tag), Opts::default().partition_key(&key))
        .await
        .unwrap();
    b.claim(first).await.unwrap();
    let why = b.explain(second).await.unwrap();
    let lease_until = b.now() + Span::from_std(KIT_LEASE).unwrap();
    assert_eq!(
        why.reason,
        Reason::PartitionBlocked {
            key: key.clone(),
            holder: Holder {
                id: first,
                step: "one".into(),
                node: Some(KIT_NODE.into()),
                lease_until: Some(lease_until),
            },
        }
    );
    assert_eq!(
        why.to_string(),
        format!(
            "blocked by partition key {key:?} held by instance {first} (its step \"one\" on \
             node \"testkit\", lease until 2030-01-01 00:00:30 UTC (in 30 s))"
        )
    );
    // The holder itself is executing, not blocked.
    assert!(matches!(
        b.explain(first).await.unwrap().reason,
        Reason::Executing { .. }
    ));
    b.lose_lease(first).await.unwrap();
    assert!(matches!(
        b.explain(second).await.unwrap().reason,
        Reason::Runnable { .. }
    ));
    b.run().await;
    b.get(second).await.assert_status(Status::Done);
}

pub async fn explain_runnable_counts_the_rows_ahead_in_pick_order<B: Backend>(b: &mut B) {
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            b.insert::<Counter>(S::default(), Opts::default())
                .await
                .unwrap(),
        );
    }
    // Due later: not ahead of anyone yet.
    b.insert::<Counter>(
        S::default(),
        Opts::default()
            .priority(-5)
            .schedule_in(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let ahead = |why: gen_durable::Explanation| match why.reason {
        Reason::Runnable { rows_ahead } => rows_ahead.n,
        other => panic!("not runnable: {other:?}"),
    };
    let third = b.explain(ids[2]).await.unwrap();
    assert_eq!(
        third.to_string(),
        "runnable now at step \"a\", ~2 rows ahead of it in queue \"conf\""
    );
    assert_eq!(ahead(third), 2);
    let first = b.explain(ids[0]).await.unwrap();
    assert_eq!(
        first.to_string(),
        "runnable now at step \"a\", first in line in queue \"conf\""
    );
    // A lower priority runs first: it goes ahead of all three.
    let urgent = b
        .insert::<Counter>(S::default(), Opts::default().priority(-1))
        .await
        .unwrap();
    assert_eq!(ahead(b.explain(urgent).await.unwrap()), 0);
    assert_eq!(ahead(b.explain(ids[0]).await.unwrap()), 1);
    assert_eq!(ahead(b.explain(ids[2]).await.unwrap()), 3);
}

pub async fn explain_by_key_and_of_nothing<B: Backend>(b: &mut B) {
    let key = format!("{}:order", b.tag());
    let id = b
        .insert::<Timed>(S::default(), Opts::default().correlation_key(&key))
        .await
        .unwrap();
    b.run().await;
    let why = b.explain(Key(key.as_str())).await.unwrap();
    assert_eq!((why.id, why.status), (id, Status::AwaitingSignal));
    // Finished, the key is free: the newest instance inserted with it is explained.
    b.signal(Key(key.as_str()), "late", json!(null))
        .await
        .unwrap();
    b.run().await;
    let why = b.explain(Key(key.as_str())).await.unwrap();
    assert_eq!((why.id, why.status), (id, Status::Done));
    assert!(matches!(
        b.explain(Key("no such key")).await,
        Err(Error::KeyNotFound { key }) if key == "no such key"
    ));
    assert!(matches!(
        b.explain(9_999).await,
        Err(Error::NotFound { id: 9_999 })
    ));
}

pub async fn explain_gate_full_names_the_gate_and_its_use<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let key = format!("{tag}:tenant");
    b.set_gate("conf-g", gen_durable::Gate::new(2))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let o = Opts::default().gate(("conf-g", key.as_str()));
        ids.push(b.insert::<Parted>(S::tagged(&tag), o).await.unwrap());
    }
    b.claim(ids[0]).await.unwrap();
    assert!(
        matches!(
            b.explain(ids[2]).await.unwrap().reason,
            Reason::Runnable { .. }
        ),
        "one of two slots taken: it can run"
    );
    b.claim(ids[1]).await.unwrap();
    let why = b.explain(ids[2]).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::GateFull {
            gate: "conf-g".into(),
            key: key.clone(),
            limit: 2,
            running: 2,
        }
    );
    assert_eq!(
        why.to_string(),
        format!("gate \"conf-g\" is full for key {key:?} (2/2 running)")
    );
    b.lose_lease(ids[0]).await.unwrap();
    b.lose_lease(ids[1]).await.unwrap();
    b.run().await;
    for id in ids {
        b.get(id).await.assert_status(Status::Done);
    }
}

pub async fn explain_rate_limited_says_when_its_tokens_are_due<B: Backend>(b: &mut B) {
    let limit = gen_durable::RateLimit::per(1, Duration::from_secs(4));
    b.set_rate_limit("conf-rl2", limit).await.unwrap();
    let o = || Opts::default().rate_limit(("conf-rl2", "k"));
    let first = b.insert::<Counter>(S::default(), o()).await.unwrap();
    let second = b.insert::<Counter>(S::default(), o()).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(first).await.assert_status(Status::Done);
    let why = b.explain(second).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::RateLimited {
            limit: "conf-rl2".into(),
            key: "k".into(),
            due: epoch() + Span::seconds(4),
        }
    );
    assert_eq!(
        why.to_string(),
        "waiting for its rate limit \"conf-rl2\" (key \"k\"): its tokens are due at \
         2030-01-01 00:00:04 UTC (in 4 s)"
    );
    b.advance(Duration::from_secs(4)).await;
    b.run().await;
    b.get(second).await.assert_done(json!({ "total": 111 }));
}
