//! The history on both engines: the same entries for the same steps, a lost lease (which
//! explain cites), the operator's actions with their actor, and a fork from a past step
//! that runs to the end.

use gen_durable::{Error, HistoryEntry, HistoryKind, Status};
use serde_json::json;

use crate::backend::{Backend, Opts, ACTOR};
use crate::fsms::*;

use HistoryKind::*;

/// What both engines record alike: kind, step, attempt, next step, error, how many
/// signals, children, whether a state, actor. (Entry ids, times and node names differ.)
type Seen = (
    HistoryKind,
    String,
    i32,
    Option<String>,
    Option<String>,
    usize,
    Option<i32>,
    bool,
    Option<String>,
);

fn seen(entries: &[HistoryEntry]) -> Vec<Seen> {
    entries
        .iter()
        .map(|e| {
            (
                e.kind,
                e.step.clone(),
                e.attempt,
                e.next_step.clone(),
                // A lost lease's account names the engine's node and batch, if it has them.
                e.error.as_deref().map(|x| {
                    if x.starts_with("lease lost") {
                        "lease lost".to_string()
                    } else {
                        x.to_string()
                    }
                }),
                e.signals.len(),
                e.children,
                e.state.is_some(),
                e.actor.clone(),
            )
        })
        .collect()
}

fn s(x: &str) -> Option<String> {
    Some(x.to_string())
}

pub async fn every_committed_step_is_the_same_entry_on_both_engines<B: Backend>(b: &mut B) {
    let full = b
        .insert::<Journey>(S::default(), Opts::default())
        .await
        .unwrap();
    let steps = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    b.signal(full, "go", json!({})).await.unwrap();
    b.run().await;
    b.get(full).await.assert_done(json!({ "total": 111 }));
    let got = b.history(full).await;
    assert_eq!(
        seen(&got),
        vec![
            (Next, "a".into(), 1, s("b"), None, 0, None, true, None),
            (Retry, "b".into(), 1, None, s("flaky"), 0, None, true, None),
            (Next, "b".into(), 2, s("c"), None, 0, None, true, None),
            (Await, "c".into(), 1, s("d"), None, 0, None, true, None),
            (Next, "d".into(), 1, s("e"), None, 1, None, true, None),
            (Done, "e".into(), 1, None, None, 0, None, true, None),
        ]
    );
    // Level full: the state each step began with.
    assert_eq!(got[0].state.as_ref().unwrap()["n"], 0);
    assert_eq!(got[2].state.as_ref().unwrap()["n"], 1);
    assert_eq!(got[4].state.as_ref().unwrap()["n"], 11);
    assert!(got
        .windows(2)
        .all(|w| w[0].entry < w[1].entry && w[0].at <= w[1].at));
    // Level steps (the default): the same entries without the state.
    assert_eq!(
        seen(&b.history(steps).await),
        vec![
            (Next, "a".into(), 1, s("b"), None, 0, None, false, None),
            (Next, "b".into(), 1, s("c"), None, 0, None, false, None),
            (Done, "c".into(), 1, None, None, 0, None, false, None),
        ]
    );
}

pub async fn a_lost_lease_shows_in_the_history<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.claim(id).await.unwrap();
    b.lose_lease(id).await.unwrap();
    // Explain cites it.
    let why = b.explain(id).await.unwrap();
    let t = why.trouble.clone().expect("the lost lease is cited");
    assert_eq!((t.step.as_str(), t.failures, t.leases_lost), ("a", 0, 1));
    assert!(
        why.to_string().ends_with("; lost its lease once there"),
        "{why}"
    );
    b.run().await;
    b.get(id).await.assert_done(json!({ "total": 111 }));
    let got = b.history(id).await;
    assert_eq!(
        seen(&got)[0],
        (
            LeaseLost,
            "a".into(),
            1,
            None,
            s("lease lost"),
            0,
            None,
            false,
            None
        )
    );
    assert!(got[0].node.is_some(), "the node that lost it");
    assert_eq!(
        got[1..]
            .iter()
            .map(|e| (e.kind, e.attempt))
            .collect::<Vec<_>>(),
        vec![(Next, 2), (Next, 1), (Done, 1)],
        "the step ran again as attempt 2"
    );
}

pub async fn operator_actions_are_entries_with_their_actor<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.cancel(id).await.unwrap();
    b.retry(id).await.unwrap();
    b.restart(id, "b").await.unwrap();
    b.run().await;
    b.get(id).await.assert_done(json!({ "total": 110 }));
    assert_eq!(
        seen(&b.history(id).await),
        vec![
            (
                Cancelled,
                "a".into(),
                1,
                None,
                s("cancelled"),
                0,
                None,
                false,
                s(ACTOR)
            ),
            (Retried, "a".into(), 1, None, None, 0, None, false, s(ACTOR)),
            (
                Restarted,
                "a".into(),
                1,
                s("b"),
                None,
                0,
                None,
                false,
                s(ACTOR)
            ),
            (Next, "b".into(), 1, s("c"), None, 0, None, false, None),
            (Done, "c".into(), 1, None, None, 0, None, false, None),
        ]
    );
}

pub async fn a_fork_from_a_past_step_runs_to_the_end_and_the_original_is_untouched<B: Backend>(
    b: &mut B,
) {
    let id = b
        .insert::<Journey>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let original = b.get(id).await;
    original.assert_status(Status::AwaitingSignal);
    let history = b.history(id).await;
    // The second attempt at `b`, which began with n = 1.
    let at_b = history
        .iter()
        .find(|e| e.kind == Next && e.step == "b")
        .unwrap()
        .entry;
    let fork = b.fork(id, at_b).await.unwrap();
    b.run().await;
    b.signal(fork, "go", json!({})).await.unwrap();
    b.run().await;
    b.get(fork).await.assert_done(json!({ "total": 111 }));
    let forked = b.history(fork).await;
    assert_eq!(
        (
            forked[0].kind,
            forked[0].step.as_str(),
            forked[0].actor.as_deref()
        ),
        (Forked, "b", Some(ACTOR))
    );
    assert_eq!(
        forked[0].detail.as_deref(),
        Some(&*format!("from instance {id} at entry {at_b}"))
    );
    // It began `b` with the entry's state, as a first attempt (which retries).
    assert_eq!(
        seen(&forked[1..])
            .into_iter()
            .map(|x| (x.0, x.1, x.2))
            .collect::<Vec<_>>(),
        vec![
            (Retry, "b".into(), 1),
            (Next, "b".into(), 2),
            (Await, "c".into(), 1),
            (Next, "d".into(), 1),
            (Done, "e".into(), 1),
        ]
    );
    assert_eq!(forked[1].state.as_ref().unwrap()["n"], 1);
    let now = b.get(id).await;
    assert_eq!(
        (now.status, now.step.clone(), now.state.clone()),
        (
            original.status,
            original.step.clone(),
            original.state.clone()
        ),
        "the original is untouched"
    );
    assert_eq!(b.history(id).await.len(), history.len());

    // The original restarted from its first entry: back at `a`, in its state then.
    b.restart_from(id, history[0].entry).await.unwrap();
    let restarted = b.history(id).await;
    let last = restarted.last().unwrap();
    assert_eq!(
        (last.kind, last.next_step.as_deref(), last.detail.clone()),
        (
            Restarted,
            Some("a"),
            Some(format!("with the state of entry {}", history[0].entry))
        )
    );
    b.run().await;
    assert_eq!(
        b.get(id).await.state["n"],
        11,
        "it ran a and b again from n = 0"
    );
}

pub async fn a_fork_or_restart_from_a_bad_entry_is_refused_and_writes_nothing<B: Backend>(
    b: &mut B,
) {
    let full = b
        .insert::<Journey>(S::default(), Opts::default())
        .await
        .unwrap();
    let steps = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let before = (b.history(full).await.len(), b.history(steps).await.len());
    let e = b.fork(full, 987_654).await.unwrap_err();
    assert!(
        matches!(e, Error::UnknownEntry { entry: 987_654, .. }),
        "{e}"
    );
    let e = b.restart_from(full, 987_654).await.unwrap_err();
    assert!(matches!(e, Error::UnknownEntry { .. }), "{e}");
    let e = b.fork(424_242, 1).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { id: 424_242 }), "{e}");
    let first = b.history(steps).await[0].entry;
    let e = b.fork(steps, first).await.unwrap_err();
    assert!(
        matches!(e, Error::EntryWithoutState { kind: Next, .. }),
        "a level-steps entry holds no state: {e}"
    );
    let e = b.restart_from(steps, first).await.unwrap_err();
    assert!(matches!(e, Error::EntryWithoutState { .. }), "{e}");
    assert_eq!(
        (b.history(full).await.len(), b.history(steps).await.len()),
        before
    );
    b.get(full).await.assert_status(Status::AwaitingSignal);
}
