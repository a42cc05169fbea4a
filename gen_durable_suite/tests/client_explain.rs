//! `Client::explain` on real Postgres, for the reasons only a database has: a node
//! executing the step (its lease and heartbeat), no live node for the queue or for the
//! FSM's version, and a paused queue. The reasons both engines know are conformance
//! scenarios (`tests/conformance/explain.rs`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::Count;
use gen_durable::{
    Client, Clock, Engine, Error, Heartbeat, Key, QueueConfig, Reason, Registry, Step,
};
use gen_durable_testkit::{epoch, TestDb};
use serde_json::json;
use tokio::sync::Notify;

/// Released by the test: the step of `Slow` holds its claim until then.
static RELEASE: Mutex<Option<Arc<Notify>>> = Mutex::new(None);

test_fsm!(Slow, state = Count, queue = "slow", version = 1, {
    Work => "work" |_ctx| {
        let gate = RELEASE.lock().unwrap().clone().expect("gate set");
        gate.notified().await;
        Ok(Step::done(json!("worked")))
    },
});

test_fsm!(Report, state = Count, queue = "reports", version = 2, {
    Build => "build" |_ctx| { Ok(Step::done(json!(null))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Slow>();
    r.register::<Report>();
    r
}

/// A client on a manual clock at the kit's epoch.
fn client(db: &TestDb) -> (Client, Clock) {
    let clock = Clock::manual(epoch());
    let gd = Client::new(db.pool().clone())
        .with_registry(registry())
        .with_clock(clock.clone());
    (gd, clock)
}

/// A node as an engine announces itself, seen at `at`.
async fn announce(db: &TestDb, node: &str, queues: &[&str], fsms: &[&str], at: DateTime<Utc>) {
    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms, started_at, last_seen_at)
         VALUES ($1, $2, $3, $4, $4)",
    )
    .bind(node)
    .bind(queues)
    .bind(fsms)
    .bind(at)
    .execute(db.pool())
    .await
    .unwrap();
}

#[tokio::test]
async fn executing_names_the_node_its_lease_and_a_fresh_heartbeat() {
    let db = TestDb::new().await;
    let gate = Arc::new(Notify::new());
    *RELEASE.lock().unwrap() = Some(gate.clone());
    let gd = Client::new(db.pool().clone()).with_registry(registry());
    let id = gd.insert::<Slow>(Count::default()).await.unwrap();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .with_node_id("node-a")
        .queue_with(
            "slow",
            QueueConfig::new(1).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let why = loop {
        let why = gd.explain(id).await.unwrap();
        // Claimed, and the node's first announce (its heartbeat's, racing the pick) is in.
        if matches!(
            why.reason,
            Reason::Executing {
                node_seen_at: Some(_),
                ..
            }
        ) {
            break why;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never executing: {why}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let Reason::Executing {
        node,
        since,
        lease_until,
        heartbeat,
        lease_expired,
        node_seen_at,
        ..
    } = &why.reason
    else {
        unreachable!()
    };
    assert_eq!(node, "node-a");
    assert_eq!(*heartbeat, Heartbeat::Fresh);
    assert!(!lease_expired);
    assert!(node_seen_at.is_some());
    // The default lease: 30 s after the claim.
    assert_eq!((*lease_until - *since).num_seconds(), 30, "{why}");
    let line = why.to_string();
    assert!(
        line.starts_with("executing step \"work\" on node \"node-a\" since "),
        "{line}"
    );
    assert!(line.contains("heartbeat fresh"), "{line}");

    gate.notify_one();
    engine.shutdown(Duration::from_secs(10)).await;
    db.close().await;
}

#[tokio::test]
async fn an_expired_lease_is_a_stale_heartbeat_the_reaper_takes_back() {
    let db = TestDb::new().await;
    let (gd, clock) = client(&db);
    let id = gd.insert::<Report>(Count::default()).await.unwrap();
    let t0 = epoch();
    // Claimed by node-b, which announced itself then died: its lease ends at t0 + 30 s.
    announce(&db, "node-b", &["reports"], &["Report@2"], t0).await;
    sqlx::query(
        "UPDATE gd_instances SET status = 'executing', locked_by = 'node-b',
                lease_epoch = 1, lease_expires_at = $2 + interval '30 s', updated_at = $2
          WHERE id = $1",
    )
    .bind(id)
    .bind(t0)
    .execute(db.pool())
    .await
    .unwrap();

    clock.advance(Duration::from_secs(10));
    let fresh = gd.explain(id).await.unwrap();
    assert!(
        matches!(
            fresh.reason,
            Reason::Executing {
                heartbeat: Heartbeat::Fresh,
                lease_expired: false,
                ..
            }
        ),
        "{fresh:?}"
    );

    clock.advance(Duration::from_secs(65));
    let why = gd.explain(id).await.unwrap();
    let Reason::Executing {
        heartbeat,
        lease_expired,
        node_seen_at,
        ..
    } = &why.reason
    else {
        panic!("{why:?}")
    };
    assert_eq!(
        (*heartbeat, *lease_expired, *node_seen_at),
        (Heartbeat::Stale, true, Some(t0))
    );
    assert_eq!(
        why.to_string(),
        "executing step \"build\" on node \"node-b\" since 2030-01-01 00:00:00 UTC (1 min ago), \
         lease expired at 2030-01-01 00:00:30 UTC (45 s ago), heartbeat stale: the reaper \
         will take it back"
    );
    db.close().await;
}

#[tokio::test]
async fn no_live_node_serves_the_queue() {
    let db = TestDb::new().await;
    let (gd, clock) = client(&db);
    let id = gd.insert::<Report>(Count::default()).await.unwrap();

    let why = gd.explain(id).await.unwrap();
    assert_eq!(why.reason, Reason::NoNodeForQueue { live_nodes: vec![] });
    assert_eq!(
        why.to_string(),
        "no live node serves queue \"reports\" (no node is live at all)"
    );

    // A live node on other queues; one that served "reports" but was last seen 61 s ago.
    announce(&db, "web-1", &["mail"], &["Report@2"], epoch()).await;
    announce(&db, "old", &["reports"], &["Report@2"], epoch()).await;
    sqlx::query("UPDATE gd_nodes SET last_seen_at = $1 - interval '61 s' WHERE node_id = 'old'")
        .bind(epoch())
        .execute(db.pool())
        .await
        .unwrap();
    let why = gd.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::NoNodeForQueue {
            live_nodes: vec!["web-1".into()]
        }
    );
    assert_eq!(
        why.to_string(),
        "no live node serves queue \"reports\" (live nodes: \"web-1\")"
    );

    // Past the window, web-1 is not live either.
    clock.advance(Duration::from_secs(61));
    let why = gd.explain(id).await.unwrap();
    assert_eq!(why.reason, Reason::NoNodeForQueue { live_nodes: vec![] });
    db.close().await;
}

#[tokio::test]
async fn no_live_node_has_the_fsm_version_unless_one_migrates_it() {
    let db = TestDb::new().await;
    let (gd, _clock) = client(&db);
    let id = gd.insert::<Report>(Count::default()).await.unwrap();
    // Nodes on the queue run v1 and v3 of Report, and another FSM at v2.
    announce(&db, "n1", &["reports"], &["Report@1", "Other@2"], epoch()).await;
    announce(&db, "n2", &["reports", "mail"], &["Report@3"], epoch()).await;
    let why = gd.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::NoNodeForVersion {
            nodes_on_queue: vec!["n1".into(), "n2".into()],
            versions_served: vec![1, 3],
        }
    );
    assert_eq!(
        why.to_string(),
        "no live node has FSM \"Report\" v2 registered (nodes on queue \"reports\": \"n1\", \
         \"n2\"; they run v1, v3)"
    );

    // A node that migrates v2 rows to v3 announces v2 among those it takes: it runs them.
    sqlx::query("UPDATE gd_nodes SET fsms = '{Report@2,Report@3}' WHERE node_id = 'n2'")
        .execute(db.pool())
        .await
        .unwrap();
    let why = gd.explain(id).await.unwrap();
    assert!(matches!(why.reason, Reason::Runnable { .. }), "{why:?}");
    db.close().await;
}

#[tokio::test]
async fn a_paused_queue_says_since_when_and_why() {
    let db = TestDb::new().await;
    let (gd, _clock) = client(&db);
    let id = gd.insert::<Report>(Count::default()).await.unwrap();
    announce(&db, "n1", &["reports"], &["Report@2"], epoch()).await;
    let paused_at = epoch() - chrono::Duration::minutes(5);
    sqlx::query("INSERT INTO gd_queue_pauses (queue, paused_at, reason) VALUES ('reports', $1, 'db maintenance')")
        .bind(paused_at)
        .execute(db.pool())
        .await
        .unwrap();
    let why = gd.explain(id).await.unwrap();
    assert_eq!(
        why.reason,
        Reason::QueuePaused {
            since: paused_at,
            why: Some("db maintenance".into())
        }
    );
    assert_eq!(
        why.to_string(),
        "queue \"reports\" is paused since 2029-12-31 23:55:00 UTC (5 min ago): db maintenance"
    );
    // Checked before the schedule: a row due later on a paused queue is paused too.
    let later = gd
        .insert::<Report>(Count::default())
        .schedule_in(Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(
        gd.explain(later).await.unwrap().reason,
        Reason::QueuePaused { .. }
    ));
    db.close().await;
}

#[tokio::test]
async fn an_unknown_id_or_key_is_not_found() {
    let db = TestDb::new().await;
    let (gd, _clock) = client(&db);
    assert!(matches!(
        gd.explain(424242).await,
        Err(Error::NotFound { id: 424242 })
    ));
    assert!(matches!(
        gd.explain(Key("nobody")).await,
        Err(Error::KeyNotFound { key }) if key == "nobody"
    ));
    db.close().await;
}
