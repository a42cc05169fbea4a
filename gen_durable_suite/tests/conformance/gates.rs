//! Concurrency gates on both engines: declaring them, inserting into them, and what a
//! gate key does (and does not) exclude.

use gen_durable::{Error, Gate, LimitKey, Reason, Status};

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn a_gate_of_two_runs_every_row_and_never_three_steps_of_one_key<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    assert!(b.set_gate("conf-api", Gate::new(2)).await.unwrap());
    let mut ids = Vec::new();
    for _ in 0..4 {
        let o = Opts::default().gate(("conf-api", tag.as_str()));
        ids.push(b.insert::<Parted>(S::tagged(&tag), o).await.unwrap());
    }
    let free = format!("{tag}:free");
    ids.push(
        b.insert::<Parted>(S::tagged(&free), Opts::default())
            .await
            .unwrap(),
    );
    assert_eq!(b.run().await.to_string(), "{next: 10, done: 5, steps: 15}");
    for id in ids {
        let i = b.get(id).await;
        i.assert_status(Status::Done);
        assert_eq!(
            i.attempt, 0,
            "a row a full gate turned back burns no attempt"
        );
    }
    assert!(
        most_at_once(&tag) <= 2,
        "{} steps of one gate key at once",
        most_at_once(&tag)
    );
}

pub async fn an_undeclared_gate_is_refused_and_nothing_is_written<B: Backend>(b: &mut B) {
    let o = Opts::default().gate(("nowhere", "k"));
    let e = b.insert::<Counter>(S::default(), o).await.unwrap_err();
    assert!(
        matches!(&e, Error::UnknownGate { name } if name == "nowhere"),
        "{e:?}"
    );
    assert!(b.set_gate("somewhere", Gate::new(1)).await.unwrap());
    let rows = vec![
        (S::default(), Opts::default().gate(("somewhere", "k"))),
        (
            S::default(),
            Opts::default().gate(LimitKey::global("nowhere")),
        ),
    ];
    let e = b.insert_all::<Counter>(rows).await.unwrap_err();
    assert!(matches!(e, Error::UnknownGate { .. }), "{e:?}");
    assert_eq!(
        b.run().await.to_string(),
        "{steps: 0}",
        "neither insert wrote a row"
    );
}

pub async fn declaring_a_gate_is_idempotent_and_a_new_limit_replaces_the_old<B: Backend>(
    b: &mut B,
) {
    assert!(b.set_gate("conf-smtp", Gate::new(2)).await.unwrap());
    assert!(
        !b.set_gate("conf-smtp", Gate::new(2)).await.unwrap(),
        "unchanged"
    );
    assert!(
        b.set_gate("conf-smtp", Gate::new(5)).await.unwrap(),
        "a new limit"
    );
    for (name, limit) in [
        ("conf-smtp", 0),
        ("conf-smtp", 40_000),
        ("", 1),
        ("nul\0", 1),
    ] {
        let e = b.set_gate(name, Gate::new(limit)).await.unwrap_err();
        assert!(
            matches!(e, Error::InvalidConfig(_) | Error::InvalidInput { .. }),
            "{name:?} {limit}: {e:?}"
        );
    }
    let o = Opts::default().gate(LimitKey::global("conf-smtp"));
    let id = b.insert::<Counter>(S::default(), o).await.unwrap();
    b.run().await;
    let i = b.get(id).await;
    i.assert_status(Status::Done);
    assert_eq!(
        (i.gate.as_deref(), i.partition_key.as_deref()),
        (Some("conf-smtp"), Some("")),
        "a global gate key is the empty key"
    );
}

/// A gate names its keys explicitly: a K = 1 `partition_key` spelled like a gate key is
/// another key, and neither excludes the other; the last concurrency option set wins.
pub async fn a_gate_key_and_a_partition_key_of_the_same_text_are_different_keys<B: Backend>(
    b: &mut B,
) {
    let tag = b.tag().to_string();
    let key = format!("{tag}:acct");
    assert!(b.set_gate("conf-one", Gate::new(1)).await.unwrap());
    let parted = b
        .insert::<Parted>(S::tagged(&tag), Opts::default().partition_key(&key))
        .await
        .unwrap();
    let gated = b
        .insert::<Parted>(
            S::tagged(&tag),
            Opts::default()
                .partition_key("replaced")
                .gate(("conf-one", key.as_str())),
        )
        .await
        .unwrap();
    let second = b
        .insert::<Parted>(S::tagged(&tag), Opts::default().partition_key(&key))
        .await
        .unwrap();
    b.claim(parted).await.unwrap();
    assert!(
        matches!(
            b.explain(gated).await.unwrap().reason,
            Reason::Runnable { .. }
        ),
        "the K = 1 key's holder does not hold the gate key"
    );
    assert!(matches!(
        b.explain(second).await.unwrap().reason,
        Reason::PartitionBlocked { holder, .. } if holder.id == parted
    ));
    let g = b.get(gated).await;
    assert_eq!(
        (g.gate.as_deref(), g.partition_key.as_deref()),
        (Some("conf-one"), Some(key.as_str()))
    );
    b.lose_lease(parted).await.unwrap();
    b.run().await;
    for id in [parted, gated, second] {
        b.get(id).await.assert_status(Status::Done);
    }
}

/// Each key of a gate has its own K slots: a full key holds back only its own rows.
pub async fn each_key_of_a_gate_has_its_own_slots<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    assert!(b.set_gate("conf-keys", Gate::new(1)).await.unwrap());
    let (ka, kb) = (format!("{tag}:a"), format!("{tag}:b"));
    let o = |k: &str| Opts::default().gate(("conf-keys", k));
    let a1 = b.insert::<Parted>(S::tagged(&tag), o(&ka)).await.unwrap();
    let a2 = b.insert::<Parted>(S::tagged(&tag), o(&ka)).await.unwrap();
    let b1 = b.insert::<Parted>(S::tagged(&tag), o(&kb)).await.unwrap();
    b.claim(a1).await.unwrap();
    assert!(matches!(
        b.explain(a2).await.unwrap().reason,
        Reason::GateFull {
            running: 1,
            limit: 1,
            ..
        }
    ));
    assert!(
        matches!(b.explain(b1).await.unwrap().reason, Reason::Runnable { .. }),
        "another key of the same gate is free"
    );
    b.lose_lease(a1).await.unwrap();
    b.run().await;
    for id in [a1, a2, b1] {
        b.get(id).await.assert_status(Status::Done);
    }
}

/// A new limit applies at the next pick: raising K frees the rows a full key held back.
pub async fn raising_a_gates_limit_admits_more_at_the_next_pick<B: Backend>(b: &mut B) {
    let tag = b.tag().to_string();
    let key = format!("{tag}:k");
    assert!(b.set_gate("conf-raise", Gate::new(1)).await.unwrap());
    let o = || Opts::default().gate(("conf-raise", key.as_str()));
    let first = b.insert::<Parted>(S::tagged(&tag), o()).await.unwrap();
    let second = b.insert::<Parted>(S::tagged(&tag), o()).await.unwrap();
    b.claim(first).await.unwrap();
    assert!(matches!(
        b.explain(second).await.unwrap().reason,
        Reason::GateFull { limit: 1, .. }
    ));
    assert!(b.set_gate("conf-raise", Gate::new(2)).await.unwrap());
    assert!(
        matches!(
            b.explain(second).await.unwrap().reason,
            Reason::Runnable { .. }
        ),
        "K = 2 now: one slot is free"
    );
    b.lose_lease(first).await.unwrap();
    b.run().await;
    b.get(second).await.assert_status(Status::Done);
}
