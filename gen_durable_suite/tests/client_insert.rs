//! `Client::insert` and `insert_all` on real Postgres.

mod common;

use std::time::Duration;

use chrono::{TimeZone, Utc};
use common::{column, count, Checkout, Order};
use gen_durable::{Client, Entry, Error, Status};
use gen_durable_testkit::TestDb;

fn order(n: u64) -> Order {
    Order {
        order: n,
        paid: None,
    }
}

#[tokio::test]
async fn each_option_lands_in_its_column() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let at = Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 5).unwrap();
    let id = gd
        .insert::<Checkout>(order(42))
        .step("ship")
        .queue("other")
        .priority(5)
        .partition_key("order:42")
        .unique_key("k1")
        .unique_scope([
            Status::Runnable,
            Status::Executing,
            Status::AwaitingSignal,
            Status::AwaitingChildren,
            Status::Done,
        ])
        .eligible_at(at)
        .await
        .unwrap();
    let p = db.pool();
    assert_eq!(column(p, id, "fsm").await.as_deref(), Some("Checkout"));
    assert_eq!(column(p, id, "fsm_version").await.as_deref(), Some("2"));
    assert_eq!(column(p, id, "step").await.as_deref(), Some("ship"));
    assert_eq!(column(p, id, "status").await.as_deref(), Some("runnable"));
    assert_eq!(column(p, id, "queue").await.as_deref(), Some("other"));
    assert_eq!(column(p, id, "priority").await.as_deref(), Some("5"));
    assert_eq!(
        column(p, id, "partition_key").await.as_deref(),
        Some("order:42")
    );
    assert_eq!(column(p, id, "unique_key").await.as_deref(), Some("k1"));
    assert_eq!(
        column(p, id, "unique_scope").await.as_deref(),
        Some("{runnable,executing,awaiting_signal,awaiting_children,done}")
    );
    assert_eq!(
        column(p, id, "state->>'order'").await.as_deref(),
        Some("42")
    );
    assert_eq!(column(p, id, "max_reaps").await.as_deref(), Some("10"));
    let stored: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT eligible_at FROM gd_instances WHERE id = $1")
            .bind(id)
            .fetch_one(p)
            .await
            .unwrap();
    assert_eq!(stored, at);

    // Defaults: initial step, the FSM's queue, priority 0, no key, no scope.
    let id = gd.insert::<Checkout>(order(1)).await.unwrap();
    assert_eq!(column(p, id, "step").await.as_deref(), Some("reserve"));
    assert_eq!(column(p, id, "queue").await.as_deref(), Some("checkout"));
    assert_eq!(column(p, id, "priority").await.as_deref(), Some("0"));
    assert_eq!(column(p, id, "unique_scope").await, None);
    db.close().await;
}

#[tokio::test]
async fn scheduling_precedence_and_the_database_clock() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let p = db.pool();
    let early = Utc.with_ymd_and_hms(2031, 1, 1, 0, 0, 0).unwrap();
    let late = Utc.with_ymd_and_hms(2032, 1, 1, 0, 0, 0).unwrap();
    let eligible = |id: i64| async move {
        sqlx::query_scalar::<_, chrono::DateTime<Utc>>(
            "SELECT eligible_at FROM gd_instances WHERE id = $1",
        )
        .bind(id)
        .fetch_one(p)
        .await
        .unwrap()
    };
    // eligible_at beats schedule_at beats schedule_in.
    let a = gd
        .insert::<Checkout>(order(1))
        .schedule_in(Duration::from_secs(5))
        .schedule_at(late)
        .eligible_at(early)
        .await
        .unwrap();
    assert_eq!(eligible(a).await, early);
    let b = gd
        .insert::<Checkout>(order(2))
        .schedule_in(Duration::from_secs(5))
        .schedule_at(late)
        .await
        .unwrap();
    assert_eq!(eligible(b).await, late);

    // schedule_in is measured from the database's clock: the stored eligible_at is
    // now() + 1 h as the database sees it, whatever the caller's clock says.
    let c = gd
        .insert::<Checkout>(order(3))
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    let offset: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM eligible_at - inserted_at)::float8 FROM gd_instances WHERE id = $1",
    )
    .bind(c)
    .fetch_one(p)
    .await
    .unwrap();
    assert!((offset - 3600.0).abs() < 0.001, "offset {offset}");
    let db_now: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(p)
        .await
        .unwrap();
    let skew = (eligible(c).await - db_now).num_seconds();
    assert!(
        (3590..=3600).contains(&skew),
        "eligible_at - db now() = {skew}s"
    );

    // A manual clock is what every statement receives as $now.
    let clock = gen_durable::Clock::manual(early);
    let gd2 = gd.clone().with_clock(clock);
    let d = gd2
        .insert::<Checkout>(order(4))
        .schedule_in(Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(eligible(d).await, early + chrono::Duration::seconds(60));
    db.close().await;
}

#[tokio::test]
async fn fifty_concurrent_inserts_of_one_key_give_one_ok() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let gd = gd.clone();
            tokio::spawn(
                async move { gd.insert::<Checkout>(order(i)).unique_key("only-one").await },
            )
        })
        .collect();
    let mut ok = 0;
    let mut dup = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(Error::Duplicate { key }) => {
                assert_eq!(key, "only-one");
                dup += 1
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!((ok, dup), (1, 49));
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        1
    );
    db.close().await;
}

/// Group insert: awaited inserts running at the same moment share statements (one
/// statement's rows share its transaction time), and each call gets the id of its own row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_inserts_share_statements_and_each_gets_its_own_row() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let n = 400u64;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let gd = gd.clone();
            tokio::spawn(async move { (i, gd.insert::<Checkout>(order(i)).await.unwrap()) })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    for (i, id) in &ids {
        let stored: i64 =
            sqlx::query_scalar("SELECT (state->>'order')::int8 FROM gd_instances WHERE id = $1")
                .bind(id)
                .fetch_one(db.pool())
                .await
                .unwrap();
        assert_eq!(
            stored, *i as i64,
            "instance {id} holds the state of call {i}"
        );
    }
    let distinct: std::collections::HashSet<i64> = ids.iter().map(|(_, id)| *id).collect();
    assert_eq!(distinct.len() as u64, n, "one row per call");
    let statements = count(
        db.pool(),
        "SELECT count(DISTINCT inserted_at) FROM gd_instances",
    )
    .await;
    assert!(
        statements < n as i64,
        "{n} concurrent inserts ran in {statements} statements"
    );
    db.close().await;
}

#[tokio::test]
async fn unique_scopes() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let p = db.pool();

    // Default scope: every non-terminal status. Leaving it frees the key.
    let id = gd
        .insert::<Checkout>(order(1))
        .unique_key("a")
        .await
        .unwrap();
    assert!(matches!(
        gd.insert::<Checkout>(order(2)).unique_key("a").await,
        Err(Error::Duplicate { .. })
    ));
    sqlx::query("UPDATE gd_instances SET status = 'done' WHERE id = $1")
        .bind(id)
        .execute(p)
        .await
        .unwrap();
    gd.insert::<Checkout>(order(3))
        .unique_key("a")
        .await
        .expect("key freed by leaving the scope");

    // A scope that includes `done` keeps the key after the instance finishes.
    let mut live_and_done = Status::NON_TERMINAL.to_vec();
    live_and_done.push(Status::Done);
    let id = gd
        .insert::<Checkout>(order(4))
        .unique_key("b")
        .unique_scope(live_and_done)
        .await
        .unwrap();
    sqlx::query("UPDATE gd_instances SET status = 'done' WHERE id = $1")
        .bind(id)
        .execute(p)
        .await
        .unwrap();
    assert!(matches!(
        gd.insert::<Checkout>(order(5)).unique_key("b").await,
        Err(Error::Duplicate { .. })
    ));
    // …and a `failed` one (outside that scope) frees it.
    sqlx::query("UPDATE gd_instances SET status = 'failed' WHERE id = $1")
        .bind(id)
        .execute(p)
        .await
        .unwrap();
    gd.insert::<Checkout>(order(6))
        .unique_key("b")
        .await
        .expect("failed is outside the scope");

    // A scope that leaves out a live status is refused: a row could leave it and come
    // back while another row holds the key (docs/design/reliability.md, E2). Nothing is written.
    let before = count(p, "SELECT count(*) FROM gd_instances").await;
    for scope in [
        vec![Status::Runnable],
        vec![Status::Executing],
        vec![Status::Runnable, Status::Executing, Status::Done],
    ] {
        let r = gd
            .insert::<Checkout>(order(7))
            .unique_key("c")
            .unique_scope(scope.clone())
            .await;
        assert!(
            matches!(
                &r,
                Err(Error::InvalidInput {
                    what: "unique_scope",
                    ..
                })
            ),
            "{scope:?}: {r:?}"
        );
    }
    assert_eq!(count(p, "SELECT count(*) FROM gd_instances").await, before);
    // Every status, and no status, are accepted.
    let all = [
        Status::NON_TERMINAL.to_vec(),
        vec![Status::Done, Status::Failed],
    ]
    .concat();
    gd.insert::<Checkout>(order(8))
        .unique_key("d")
        .unique_scope(all)
        .await
        .unwrap();
    gd.insert::<Checkout>(order(9))
        .unique_key("e")
        .unique_scope([])
        .await
        .unwrap();

    // A NULL key never conflicts.
    for i in 0..3 {
        gd.insert::<Checkout>(order(i)).await.unwrap();
    }

    // A batch with internal duplicates inserts each key once, and skips stored keys.
    let ids = gd
        .insert_all::<Checkout>(vec![
            Entry::new(order(10)).unique_key("x"),
            Entry::new(order(11)).unique_key("y"),
            Entry::new(order(12)).unique_key("x"),
            Entry::new(order(13)).unique_key("a"),
            Entry::new(order(14)),
        ])
        .await
        .unwrap();
    assert_eq!(ids.len(), 3, "x, y and the keyless entry");
    let stored = count(
        p,
        "SELECT count(*) FROM gd_instances WHERE unique_key IN ('x', 'y')",
    )
    .await;
    assert_eq!(stored, 2);
    db.close().await;
}

#[tokio::test]
async fn insert_all_twenty_thousand_in_one_call() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let entries = (0..20_000).map(|i| Entry::new(order(i)).priority((i % 7) as i16));
    let ids = gd.insert_all::<Checkout>(entries).await.unwrap();
    assert_eq!(ids.len(), 20_000);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascend");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        20_000
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(DISTINCT state->>'order') FROM gd_instances"
        )
        .await,
        20_000
    );
    db.close().await;
}

/// A batch sends an optional column only when some row sets it (an all-NULL column is an
/// empty array, which `unnest` pads): a value set on one row of many lands on that row
/// alone, whichever row it is.
#[tokio::test]
async fn insert_all_puts_an_option_of_one_row_on_that_row_alone() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let at = Utc.with_ymd_and_hms(2030, 1, 2, 3, 4, 5).unwrap();
    let entries = vec![
        Entry::<Checkout>::new(order(0)),
        Entry::new(order(1)).partition_key("p:1"),
        Entry::new(order(2)).eligible_at(at),
        Entry::new(order(3)),
        Entry::new(order(4)).schedule_in(Duration::from_secs(3600)),
    ];
    let ids = gd.insert_all::<Checkout>(entries).await.unwrap();
    assert_eq!(ids.len(), 5);
    let p = db.pool();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            column(p, *id, "state->>'order'").await.as_deref(),
            Some(i.to_string().as_str()),
            "rows keep the entries' order"
        );
        let key = column(p, *id, "partition_key").await;
        assert_eq!(key.as_deref(), (i == 1).then_some("p:1"), "row {i}'s key");
        let later = count(
            p,
            &format!("SELECT count(*) FROM gd_instances WHERE id = {id} AND eligible_at > now() + interval '30 minutes'"),
        )
        .await;
        assert_eq!(later == 1, i == 2 || i == 4, "row {i}'s eligible_at");
    }
    // With unique keys (the sorted statement) the rows keep their own options too.
    let keyed = vec![
        Entry::<Checkout>::new(order(5)).unique_key("u:5"),
        Entry::new(order(6)).partition_key("p:6"),
    ];
    let ids = gd.insert_all::<Checkout>(keyed).await.unwrap();
    assert_eq!(
        column(p, ids[0], "unique_key").await.as_deref(),
        Some("u:5")
    );
    assert_eq!(column(p, ids[0], "partition_key").await, None);
    assert_eq!(column(p, ids[1], "unique_key").await, None);
    assert_eq!(
        column(p, ids[1], "partition_key").await.as_deref(),
        Some("p:6")
    );
    db.close().await;
}

#[tokio::test]
async fn inserts_join_a_callers_transaction() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let mut tx = db.pool().begin().await.unwrap();
    gd.insert::<Checkout>(order(1))
        .execute(&mut *tx)
        .await
        .unwrap();
    let ids = gd
        .insert_all::<Checkout>((0..100).map(|i| Entry::new(order(i))))
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(ids.len(), 100);
    tx.rollback().await.unwrap();
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        0
    );

    let mut tx = db.pool().begin().await.unwrap();
    gd.insert::<Checkout>(order(1))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_instances").await,
        1
    );
    db.close().await;
}

#[tokio::test]
async fn an_insert_notifies_the_queue_once_per_statement() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener.listen("gd_wake").await.unwrap();
    gd.insert_all::<Checkout>((0..50).map(|i| Entry::new(order(i))))
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.payload(), "checkout");
    // Exactly one notification for the 50 rows: the next recv times out.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), listener.recv())
            .await
            .is_err()
    );
    db.close().await;
}

#[tokio::test]
async fn a_burst_of_inserts_coalesces_its_wake_ups() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone()).with_notify_window(Duration::from_millis(500));
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener.listen("gd_wake").await.unwrap();
    let started = std::time::Instant::now();
    for i in 0..20 {
        gd.insert::<Checkout>(order(i)).await.unwrap();
    }
    let burst = started.elapsed();
    // The first insert notifies at once; the rest of its window is one trailing wake-up.
    let first = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.payload(), "checkout");
    let trailing = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(trailing.payload(), "checkout");
    let mut more = 0;
    while tokio::time::timeout(Duration::from_millis(700), listener.recv())
        .await
        .is_ok()
    {
        more += 1;
    }
    // One more per window the burst itself spanned, at most (20 without coalescing).
    let windows = (burst.as_millis() / 500) as usize;
    assert!(
        more <= windows,
        "{} wake-ups for 20 inserts in {burst:?}",
        2 + more
    );
    db.close().await;
}
