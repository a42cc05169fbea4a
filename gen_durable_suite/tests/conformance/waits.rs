//! `wait`: the answer is read from the row — done with its result, failed with its last
//! error, parked on signals or children, busy while it works, gone when there is no row.

use gen_durable::{Awaiting, Error, Key, Settled, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn wait_answers_done_with_the_result_by_id_and_by_key<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Counter>(S::default(), Opts::default().correlation_key("w:1"))
        .await
        .unwrap();
    let before = b.wait(id, false).await.unwrap();
    assert!(
        matches!(
            &before,
            Settled::Busy {
                status: Status::Runnable,
                attempt: 0,
                ..
            }
        ),
        "{before:?}"
    );
    b.run().await;
    let want = Settled::Done(json!({ "total": 111 }));
    assert_eq!(b.wait(id, false).await.unwrap(), want);
    // The key is freed at the end; a wait by key still finds the newest row that had it.
    assert_eq!(b.wait(Key("w:1"), true).await.unwrap(), want);
}

pub async fn wait_answers_failed_with_the_last_error<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Stopper>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    let got = b.wait(id, true).await.unwrap();
    let Settled::Failed(error) = got else {
        panic!("{got:?}")
    };
    assert_eq!(Some(error), b.get(id).await.last_error);
}

pub async fn wait_answers_parked_unless_until_terminal<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Waiter>(S::default(), Opts::default())
        .await
        .unwrap();
    b.run().await;
    assert_eq!(
        b.wait(id, false).await.unwrap(),
        Settled::Parked {
            step: "use".into(),
            awaiting: Awaiting::Signals(vec!["go".into()]),
        }
    );
    let busy = b.wait(id, true).await.unwrap();
    assert!(
        matches!(
            &busy,
            Settled::Busy {
                status: Status::AwaitingSignal,
                ..
            }
        ),
        "{busy:?}"
    );

    let state = S {
        tag: "w".into(),
        ..S::default()
    };
    let parent = b
        .insert::<KeyedParent>(state, Opts::default())
        .await
        .unwrap();
    b.run().await;
    assert_eq!(
        b.wait(parent, false).await.unwrap(),
        Settled::Parked {
            step: "sum".into(),
            awaiting: Awaiting::Children(1),
        }
    );
}

pub async fn wait_on_nothing_is_gone_or_key_not_found<B: Backend>(b: &mut B) {
    assert_eq!(b.wait(424_242, false).await.unwrap(), Settled::Gone);
    let e = b.wait(Key("never"), false).await.unwrap_err();
    assert!(
        matches!(&e, Error::KeyNotFound { key } if key == "never"),
        "{e}"
    );
    let e = b.wait(Key(""), false).await.unwrap_err();
    assert!(matches!(&e, Error::InvalidInput { .. }), "{e}");
}

pub async fn a_wait_by_key_follows_the_current_holder<B: Backend>(b: &mut B) {
    let old = b
        .insert::<Clocked>(S::default(), Opts::default().correlation_key("w:cur"))
        .await
        .unwrap();
    b.run().await;
    b.get(old).await.assert_status(Status::Done);
    let new = b
        .insert::<Waiter>(S::default(), Opts::default().correlation_key("w:cur"))
        .await
        .unwrap();
    b.run().await;
    // The live holder, not the newest finished row.
    assert_eq!(
        b.wait(Key("w:cur"), false).await.unwrap(),
        Settled::Parked {
            step: "use".into(),
            awaiting: Awaiting::Signals(vec!["go".into()]),
        }
    );
    b.signal(new, "go", json!({ "v": 3 })).await.unwrap();
    b.run().await;
    assert_eq!(
        b.wait(Key("w:cur"), true).await.unwrap(),
        Settled::Done(json!({ "v": 3, "attempt": 0, "awaited": 1 }))
    );
}
