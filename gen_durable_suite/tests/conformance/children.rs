//! Fan-out and fan-in: the barrier waits for termination, not success.

use gen_durable::Status;
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn four_children_done_wake_the_parent<B: Backend>(b: &mut B) {
    let id = b.insert::<Parent>(S::n(4), Opts::default()).await.unwrap();
    assert_eq!(
        b.run().await.to_string(),
        "{schedule_children: 1, done: 5, steps: 6}"
    );
    let i = b.get(id).await;
    i.assert_done(json!({ "total": 4, "done": 4, "failed": 0 }));
    assert_eq!(i.children.len(), 4);
    assert_eq!(i.children_pending, 0);
    for (n, kid) in i.children.iter().enumerate() {
        let k = b.get(*kid).await;
        k.assert_done(json!({ "kid": n }));
        assert_eq!(k.parent_id, Some(id));
    }
}

pub async fn a_failing_child_is_counted_not_fatal<B: Backend>(b: &mut B) {
    let state = S {
        n: 4,
        log: vec!["fail:2".into()],
        ..S::default()
    };
    let id = b.insert::<Parent>(state, Opts::default()).await.unwrap();
    assert_eq!(
        b.run().await.to_string(),
        "{schedule_children: 1, done: 4, stop: 1, steps: 6}"
    );
    b.get(id)
        .await
        .assert_done(json!({ "total": 4, "done": 3, "failed": 1 }));
    let kid = b.get(id).await.children[2];
    b.get(kid).await.assert_failed("kid failed");
}

pub async fn the_parent_waits_for_every_child<B: Backend>(b: &mut B) {
    // Children that park hold their parent in awaiting_children.
    let id = b
        .insert::<Holder>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(
        b.run().await.to_string(),
        "{await: 2, schedule_children: 1, steps: 3}"
    );
    let i = b.get(id).await;
    i.assert_status(Status::AwaitingChildren).assert_step("sum");
    assert_eq!(i.children_pending, 2);
    b.signal(i.children[0], "go", json!({})).await.unwrap();
    b.run().await;
    let i = b.get(id).await;
    i.assert_status(Status::AwaitingChildren);
    assert_eq!(i.children_pending, 1);
    b.signal(i.children[1], "go", json!({})).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{done: 2, steps: 2}");
    b.get(id).await.assert_done(json!("children finished"));
}

pub async fn children_nest_two_levels<B: Backend>(b: &mut B) {
    let id = b
        .insert::<Grand>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(
        b.run().await.to_string(),
        "{schedule_children: 3, done: 7, steps: 10}"
    );
    let child = json!({ "total": 2, "done": 2, "failed": 0 });
    b.get(id)
        .await
        .assert_done(json!({ "children": [child.clone(), child] }));
}

pub async fn children_dropped_by_uniqueness_are_not_awaited<B: Backend>(b: &mut B) {
    let state = S {
        n: 3,
        log: vec!["same-key".into()],
        tag: b.tag().to_string(),
    };
    let id = b.insert::<Parent>(state, Opts::default()).await.unwrap();
    b.run().await;
    // Three children with one unique key: one is inserted, and only it is awaited.
    b.get(id)
        .await
        .assert_done(json!({ "total": 1, "done": 1, "failed": 0 }));
}
