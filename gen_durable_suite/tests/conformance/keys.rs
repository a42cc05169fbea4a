//! Correlation keys: a key is both the instance's uniqueness and its address. A key
//! resolves to the one row holding it (live, or terminal when its scope says so); no
//! holder is `KeyNotFound`, a finished holder `Finished`, and nothing is stored either way.

use gen_durable::{Error, Key, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn a_signal_by_key_reaches_its_holder<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("order:42"))
        .await
        .unwrap();
    b.run().await;
    let d = b
        .signal(Key("order:42"), "go", json!({ "v": 7 }))
        .await
        .unwrap();
    assert_eq!((d.id, d.woke), (id, true), "{d:?}");
    b.run().await;
    b.get(id)
        .await
        .assert_done(json!({ "v": 7, "attempt": 0, "awaited": 1 }));
}

pub async fn a_key_no_instance_holds_is_key_not_found<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("order:1"))
        .await
        .unwrap();
    b.run().await;
    let e = b.signal(Key("order:2"), "go", json!({})).await.unwrap_err();
    assert!(
        matches!(&e, Error::KeyNotFound { key } if key == "order:2"),
        "{e}"
    );
    b.get(id)
        .await
        .assert_awaiting(["go"])
        .assert_inbox(Vec::<&str>::new());
}

pub async fn a_finished_holder_frees_its_key_for_a_new_run<B: Backend>(b: &mut B) {
    let first = b
        .insert::<Clocked>(S::default(), Opts::default().correlation_key("run"))
        .await
        .unwrap();
    b.run().await;
    b.get(first).await.assert_status(Status::Done);
    let e = b.signal(Key("run"), "go", json!({})).await.unwrap_err();
    assert!(matches!(&e, Error::KeyNotFound { .. }), "{e}");

    // The default scope frees the key: a new run takes it, and a late signal to the
    // key reaches the new run.
    let second = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("run"))
        .await
        .unwrap();
    b.run().await;
    let d = b.signal(Key("run"), "go", json!({})).await.unwrap();
    assert_eq!(d.id, second);
    b.get(first).await.assert_inbox(Vec::<&str>::new());
}

pub async fn a_finished_holder_in_scope_keeps_its_key_and_is_finished<B: Backend>(b: &mut B) {
    let scope = Status::ALL;
    let id = b
        .insert::<Clocked>(
            S::default(),
            Opts::default()
                .correlation_key("once")
                .correlation_scope(scope),
        )
        .await
        .unwrap();
    b.run().await;
    let e = b.signal(Key("once"), "go", json!({})).await.unwrap_err();
    assert!(
        matches!(&e, Error::Finished { id: x, status } if *x == id && *status == Status::Done),
        "{e}"
    );
    let again = b
        .insert::<Clocked>(S::default(), Opts::default().correlation_key("once"))
        .await;
    assert!(
        matches!(&again, Err(Error::Duplicate { key }) if key == "once"),
        "{again:?}"
    );
    b.get(id).await.assert_inbox(Vec::<&str>::new());
}

pub async fn an_empty_scope_makes_a_key_neither_unique_nor_an_address<B: Backend>(b: &mut B) {
    let opts = || {
        Opts::default()
            .correlation_key("free")
            .correlation_scope([])
    };
    let one = b.insert::<Waiter>(S::default(), opts()).await.unwrap();
    let two = b.insert::<Waiter>(S::default(), opts()).await.unwrap();
    assert_ne!(one, two);
    b.run().await;
    let e = b.signal(Key("free"), "go", json!({})).await.unwrap_err();
    assert!(matches!(&e, Error::KeyNotFound { .. }), "{e}");
}

pub async fn a_child_holds_its_key<B: Backend>(b: &mut B) {
    let state = S {
        tag: "p1".into(),
        ..S::default()
    };
    let parent = b
        .insert::<KeyedParent>(state, Opts::default())
        .await
        .unwrap();
    b.run().await;
    let d = b
        .signal(Key("child:p1"), "go", json!({ "v": "from the key" }))
        .await
        .unwrap();
    assert_ne!(d.id, parent);
    assert!(d.woke);
    b.run().await;
    b.get(parent)
        .await
        .assert_done(json!({ "v": "from the key", "attempt": 0, "awaited": 1 }));
}

pub async fn dedup_by_key_is_per_holder<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Branch>(S::default(), Opts::default().correlation_key("k"))
        .await
        .unwrap();
    b.run().await;
    let first = b
        .signal_dedup(Key("k"), "stray", json!(1), "evt-1")
        .await
        .unwrap();
    let again = b
        .signal_dedup(Key("k"), "stray", json!(2), "evt-1")
        .await
        .unwrap();
    assert!(first.signal_id.is_some() && again.signal_id.is_none());
    assert_eq!((first.id, again.id), (id, id));
    b.get(id).await.assert_inbox(["stray"]);
}

pub async fn bad_keys_are_typed_errors_that_write_nothing<B: Backend>(b: &mut B) {
    for bad in ["", "nul\0key"] {
        let e = b
            .insert::<Waiter>(S::default(), Opts::default().correlation_key(bad))
            .await
            .unwrap_err();
        assert!(
            matches!(
                &e,
                Error::InvalidInput {
                    what: "correlation_key",
                    ..
                }
            ),
            "{bad:?}: {e}"
        );
        let e = b.signal(Key(bad), "go", json!({})).await.unwrap_err();
        assert!(
            matches!(
                &e,
                Error::InvalidInput {
                    what: "correlation_key",
                    ..
                }
            ),
            "{bad:?}: {e}"
        );
    }
    let long = "k".repeat(gen_durable::MAX_KEY_BYTES + 1);
    let e = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key(long.clone()))
        .await
        .unwrap_err();
    assert!(matches!(&e, Error::InvalidInput { .. }), "{e}");
    let e = b.signal(Key(long), "go", json!({})).await.unwrap_err();
    assert!(matches!(&e, Error::InvalidInput { .. }), "{e}");
    assert_eq!(b.run().await.steps, 0, "nothing was inserted");
}

pub async fn unique_key_is_the_correlation_key<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default().unique_key("alias"))
        .await
        .unwrap();
    b.run().await;
    let dup = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("alias"))
        .await;
    assert!(matches!(dup, Err(Error::Duplicate { .. })), "{dup:?}");
    let d = b.signal(Key("alias"), "go", json!({})).await.unwrap();
    assert_eq!(d.id, id);
}

pub async fn a_cancel_frees_the_key_and_a_retry_takes_it_back<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("held"))
        .await
        .unwrap();
    b.run().await;
    b.cancel(id).await.unwrap();
    let e = b.signal(Key("held"), "go", json!({})).await.unwrap_err();
    assert!(matches!(&e, Error::KeyNotFound { .. }), "{e}");
    // Retried, it holds its key again and is its address.
    b.retry(id).await.unwrap();
    let d = b
        .signal(Key("held"), "go", json!({ "v": 1 }))
        .await
        .unwrap();
    assert_eq!(d.id, id);
}

pub async fn a_retry_whose_key_was_taken_meanwhile_is_a_duplicate<B: Backend>(b: &mut B) {
    let first = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("taken"))
        .await
        .unwrap();
    b.run().await;
    b.cancel(first).await.unwrap();
    let second = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("taken"))
        .await
        .unwrap();
    let e = b.retry(first).await.unwrap_err();
    assert!(matches!(&e, Error::Duplicate { .. }), "{e}");
    b.get(first).await.assert_status(Status::Failed);
    b.run().await;
    let d = b.signal(Key("taken"), "go", json!({})).await.unwrap();
    assert_eq!(d.id, second);
}

pub async fn insert_all_rows_are_addressed_by_their_keys<B: Backend>(b: &mut B) {
    let rows = (0..3)
        .map(|i| {
            (
                S::default(),
                Opts::default().correlation_key(format!("batch:{i}")),
            )
        })
        .collect();
    let ids = b.insert_all::<Waiter>(rows).await.unwrap();
    b.run().await;
    let d = b
        .signal(Key("batch:1"), "go", json!({ "v": 1 }))
        .await
        .unwrap();
    assert_eq!((d.id, d.woke), (ids[1], true), "{d:?}");
    b.run().await;
    b.get(ids[1])
        .await
        .assert_done(json!({ "v": 1, "attempt": 0, "awaited": 1 }));
    for at in [ids[0], ids[2]] {
        b.get(at).await.assert_awaiting(["go"]);
    }
}

/// Lookup by key: the holder while one holds it, then the newest row inserted with the
/// key (so a finished instance is still found and asserted on by its key), then a new
/// holder.
pub async fn an_instance_is_looked_up_and_asserted_by_its_key<B: Backend>(b: &mut B) {
    let first = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("lookup"))
        .await
        .unwrap();
    b.run().await;
    let held = b.get_by_key("lookup").await;
    assert_eq!(held.id, first);
    held.assert_awaiting(["go"]);
    b.signal(Key("lookup"), "go", json!({ "v": 3 }))
        .await
        .unwrap();
    b.run().await;
    let finished = b.get_by_key("lookup").await;
    assert_eq!(finished.id, first, "no holder: the newest row with the key");
    finished.assert_done(json!({ "v": 3, "attempt": 0, "awaited": 1 }));
    let second = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("lookup"))
        .await
        .unwrap();
    assert_eq!(b.get_by_key("lookup").await.id, second);
}

/// With `failed` in its scope, a failed holder keeps its key: a signal to it is
/// `Finished` (nothing stored) and a new insert with the key a `Duplicate`.
pub async fn a_failed_holder_with_failed_in_scope_is_finished<B: Backend>(b: &mut B) {
    let scope = [
        Status::Runnable,
        Status::Executing,
        Status::AwaitingSignal,
        Status::AwaitingChildren,
        Status::Failed,
    ];
    let id = b
        .insert::<Plain>(
            S::default(),
            Opts::default()
                .correlation_key("strict")
                .correlation_scope(scope),
        )
        .await
        .unwrap();
    b.run().await;
    b.get(id).await.assert_failed("bad input");
    let e = b.signal(Key("strict"), "go", json!({})).await.unwrap_err();
    assert!(
        matches!(&e, Error::Finished { id: x, status } if *x == id && *status == Status::Failed),
        "{e}"
    );
    let again = b
        .insert::<Plain>(S::default(), Opts::default().correlation_key("strict"))
        .await;
    assert!(
        matches!(&again, Err(Error::Duplicate { key }) if key == "strict"),
        "{again:?}"
    );
    b.get(id).await.assert_inbox(Vec::<&str>::new());
}
