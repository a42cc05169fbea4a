//! The history: an entry per committed step, in order, at the FSM's level; lost leases
//! and releases as entries; the day partitions the collector keeps.

mod common;

use std::time::Duration;

use common::{finished, Count};
use gen_durable::prelude::*;
use gen_durable::{Child, Error, HistoryKind, HistoryLevel, Registry};
use gen_durable_testkit::TestDb;

/// Every kind of outcome a step commits: `next`, a retry with its error, `children`, an
/// `await` and the `next` that consumes its signal, `done`.
#[durable_fsm(state = Count, queue = "hist", history = "full")]
enum Order {
    #[initial]
    Reserve,
    Charge,
    Spawn,
    Wait,
    Ship,
    Finish,
}

#[durable_steps]
impl Order {
    async fn reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.n = 1;
        Ok(Step::next(Order::Charge))
    }
    async fn charge(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        if ctx.attempt() == 0 {
            return Ok(Step::replay(Duration::ZERO).with_error("card declined"));
        }
        ctx.state.n = 2;
        Ok(Step::next(Order::Spawn))
    }
    async fn spawn(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let kids = (0..2)
            .map(|_| Child::new::<Leaf>(Count::default()))
            .collect();
        Ok(Step::schedule_children(kids, Order::Wait))
    }
    async fn wait(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::await_signal(["paid"], Order::Ship))
    }
    async fn ship(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Order::Finish))
    }
    async fn finish(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!("shipped")))
    }
}

#[durable_fsm(state = Count, queue = "hist", history = "off")]
enum Leaf {
    #[initial]
    Only,
}

#[durable_steps]
impl Leaf {
    async fn only(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

/// The default level: steps, without their state.
#[durable_fsm(state = Count, queue = "hist")]
enum Plain {
    #[initial]
    One,
    Two,
}

#[durable_steps]
impl Plain {
    async fn one(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Plain::Two))
    }
    async fn two(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(2)))
    }
}

fn registry() -> Registry {
    let mut reg = Registry::new();
    reg.register::<Order>();
    reg.register::<Leaf>();
    reg.register::<Plain>();
    reg
}

#[tokio::test]
async fn every_committed_step_is_an_entry_in_order_at_its_fsms_level() {
    assert_eq!(<Order as Fsm>::HISTORY, HistoryLevel::Full);
    assert_eq!(<Plain as Fsm>::HISTORY, HistoryLevel::Steps);
    let db = TestDb::new().await;
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry())
        .queue("hist", 4)
        .start()
        .await
        .unwrap();
    let gd = Client::new(db.pool().clone());
    let order = gd.insert::<Order>(Count::default()).await.unwrap();
    let plain = gd.insert::<Plain>(Count::default()).await.unwrap();
    common::eventually(10, "the order to park on its signal", || async {
        common::status(db.pool(), order).await == "awaiting_signal"
    })
    .await;
    gd.signal(order, "paid", json!({})).await.unwrap();
    assert_eq!(finished(db.pool(), order, 10).await, "done");
    assert_eq!(finished(db.pool(), plain, 10).await, "done");
    engine.shutdown(Duration::from_secs(5)).await;

    let page = gd.history(order, None, 100).await.unwrap();
    assert_eq!(page.next, None);
    let got: Vec<(HistoryKind, &str, i32, Option<&str>)> = page
        .entries
        .iter()
        .map(|e| (e.kind, e.step.as_str(), e.attempt, e.next_step.as_deref()))
        .collect();
    use HistoryKind::*;
    assert_eq!(
        got,
        vec![
            (Next, "reserve", 1, Some("charge")),
            (Retry, "charge", 1, None),
            (Next, "charge", 2, Some("spawn")),
            (Children, "spawn", 1, Some("wait")),
            (Await, "wait", 1, Some("ship")),
            (Next, "ship", 1, Some("finish")),
            (Done, "finish", 1, None),
        ]
    );
    let e = &page.entries;
    assert_eq!(e[1].error.as_deref(), Some("card declined"));
    assert_eq!(e[3].children, Some(2));
    assert_eq!(e[5].signals.len(), 1, "ship consumed the signal");
    // Level full: the state each step began with.
    assert_eq!(e[0].state.as_ref().unwrap()["n"], 0);
    assert_eq!(e[1].state.as_ref().unwrap()["n"], 1);
    assert_eq!(e[3].state.as_ref().unwrap()["n"], 2);
    for x in e {
        assert!(x.node.is_some(), "{x:?}");
        let started = x.started_at.expect("a step's entry has its start");
        assert!(started <= x.at, "{x:?}");
    }
    assert!(e
        .windows(2)
        .all(|w| w[0].entry < w[1].entry && w[0].at <= w[1].at));

    // Level steps: the entries without state. Level off (the children): none.
    let plain = gd.history(plain, None, 100).await.unwrap().entries;
    assert_eq!(
        plain.iter().map(|e| e.kind).collect::<Vec<_>>(),
        vec![Next, Done]
    );
    assert!(plain.iter().all(|e| e.state.is_none()));
    let leaves: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gd_history h JOIN gd_instances i ON i.id = h.instance_id
          WHERE i.fsm = 'Leaf'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(leaves, 0);

    // Pages: three of 3, 3 and 1 entries.
    let first = gd.history(order, None, 3).await.unwrap();
    let second = gd.history(order, first.next, 3).await.unwrap();
    let third = gd.history(order, second.next, 3).await.unwrap();
    assert_eq!(
        (
            first.entries.len(),
            second.entries.len(),
            third.entries.len()
        ),
        (3, 3, 1)
    );
    assert_eq!(third.entries[0], page.entries[6]);
    assert_eq!(third.next, None);
    db.close().await;
}

#[tokio::test]
async fn a_history_read_refuses_bad_input_and_an_unknown_id() {
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    for limit in [0, gen_durable::HISTORY_PAGE_MAX + 1] {
        let e = gd.history(1, None, limit).await.unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    }
    let e = gd.history(424242, None, 10).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { id: 424242 }), "{e}");
    db.close().await;
}

/// An operator's cancel, retry and restart are entries, at every level, with who did them:
/// the client's actor, else the database role. A cancel of a running row records the
/// request; rows a cancel reaches through their parent are entries too.
#[tokio::test]
async fn operator_actions_are_entries_with_their_actor() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let gd = Client::new(pool.clone()).with_registry(registry());
    let alice = gd.clone().with_actor("alice");
    let role: String = sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(pool)
        .await
        .unwrap();
    let actions = |id: i64| {
        let gd = gd.clone();
        async move {
            gd.history(id, None, 100)
                .await
                .unwrap()
                .entries
                .into_iter()
                .map(|e| (e.kind, e.step, e.attempt, e.next_step, e.actor, e.error))
                .collect::<Vec<_>>()
        }
    };
    let s = |x: &str| Some(x.to_string());

    // A runnable row: cancelled by alice, retried by the role, restarted by alice.
    let plain = gd.insert::<Plain>(Count::default()).await.unwrap();
    alice.cancel(plain).await.unwrap();
    gd.retry(plain).await.unwrap();
    alice.restart(plain, "two").await.unwrap();
    assert_eq!(
        actions(plain).await,
        vec![
            (
                HistoryKind::Cancelled,
                "one".into(),
                1,
                None,
                s("alice"),
                s("cancelled")
            ),
            (
                HistoryKind::Retried,
                "one".into(),
                1,
                None,
                Some(role.clone()),
                None
            ),
            (
                HistoryKind::Restarted,
                "one".into(),
                1,
                s("two"),
                s("alice"),
                None
            ),
        ]
    );

    // A level that keeps no steps still keeps what operators do.
    let leaf = gd.insert::<Leaf>(Count::default()).await.unwrap();
    alice.cancel(leaf).await.unwrap();
    assert_eq!(actions(leaf).await.len(), 1);

    // A running row: the cancel is a request, recorded as such.
    let running = gd.insert::<Plain>(Count::default()).await.unwrap();
    sqlx::query(
        "UPDATE gd_instances SET status = 'executing', locked_by = 'elsewhere', \
         lease_expires_at = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(running)
    .execute(pool)
    .await
    .unwrap();
    alice.cancel(running).await.unwrap();
    assert_eq!(
        actions(running).await,
        vec![(
            HistoryKind::CancelRequested,
            "one".into(),
            1,
            None,
            s("alice"),
            None
        )]
    );

    // Refused actions write nothing: a retry of a live row, a restart of a running one.
    let before = actions(plain).await.len();
    alice.retry(plain).await.unwrap_err();
    alice.restart(running, "two").await.unwrap_err();
    assert_eq!(actions(plain).await.len(), before);
    assert_eq!(actions(running).await.len(), 1);
    db.close().await;
}

/// Time travel: a fork starts a new instance at a past step with the state that step
/// began with, and runs to the end; the original is untouched. A restart from an entry
/// puts the instance itself back there. Bad input writes nothing.
#[tokio::test]
async fn a_fork_from_a_past_step_completes_and_a_restart_from_an_entry_takes_its_state() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let engine = Engine::builder(pool.clone())
        .with_registry(registry())
        .queue("hist", 4)
        .start()
        .await
        .unwrap();
    let gd = Client::new(pool.clone()).with_registry(registry());
    let alice = gd.clone().with_actor("alice");
    let parked = |id: i64| async move {
        common::eventually(10, "the order to park on its signal", || async {
            common::status(pool, id).await == "awaiting_signal"
        })
        .await;
    };
    let order = gd.insert::<Order>(Count::default()).await.unwrap();
    parked(order).await;
    let entries = gd.history(order, None, 100).await.unwrap().entries;
    // The second attempt at `charge`, which began with n = 1.
    let charge = entries
        .iter()
        .find(|e| e.step == "charge" && e.kind == HistoryKind::Next)
        .unwrap();
    assert_eq!(charge.state.as_ref().unwrap()["n"], 1);
    let row = |id: i64| async move {
        sqlx::query_as::<_, (String, String, serde_json::Value, String)>(
            "SELECT step, status::text, state, updated_at::text FROM gd_instances WHERE id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let before = row(order).await;

    let fork = alice.fork(order, charge.entry).await.unwrap();
    assert_ne!(fork, order);
    assert_eq!(row(order).await, before, "the original is untouched");
    parked(fork).await;
    gd.signal(fork, "paid", json!({})).await.unwrap();
    assert_eq!(finished(pool, fork, 10).await, "done");
    let forked = gd.history(fork, None, 100).await.unwrap().entries;
    let first = &forked[0];
    assert_eq!(
        (first.kind, first.step.as_str(), first.actor.as_deref()),
        (HistoryKind::Forked, "charge", Some("alice"))
    );
    assert_eq!(
        first.detail.as_deref(),
        Some(&*format!("from instance {order} at entry {}", charge.entry))
    );
    // It ran from `charge` on, with the entry's state (n = 1 until charge set 2).
    assert_eq!(forked[1].step, "charge");
    assert_eq!(forked[1].state.as_ref().unwrap()["n"], 1);
    assert_eq!(forked.last().unwrap().kind, HistoryKind::Done);

    // The original, restarted from its first entry: back at `reserve` with n = 0.
    let reserve = &entries[0];
    assert_eq!(reserve.step, "reserve");
    alice.restart_from(order, reserve.entry).await.unwrap();
    parked(order).await;
    let again = gd.history(order, None, 100).await.unwrap().entries;
    let at = again
        .iter()
        .position(|e| e.kind == HistoryKind::Restarted)
        .unwrap();
    assert_eq!(
        (
            again[at].next_step.as_deref(),
            again[at].actor.as_deref(),
            again[at].detail.as_deref()
        ),
        (
            Some("reserve"),
            Some("alice"),
            Some(&*format!("with the state of entry {}", reserve.entry))
        )
    );
    assert_eq!(again[at + 1].step, "reserve");
    assert_eq!(
        again[at + 1].state,
        reserve.state,
        "it began with the entry's state"
    );

    // Bad input: typed, and nothing written.
    let count = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT (SELECT count(*) FROM gd_instances) + (SELECT count(*) FROM gd_history)",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let written = count().await;
    let e = gd.fork(order, 987_654).await.unwrap_err();
    assert!(
        matches!(e, Error::UnknownEntry { entry: 987_654, .. }),
        "{e}"
    );
    let e = gd.restart_from(order, 987_654).await.unwrap_err();
    assert!(matches!(e, Error::UnknownEntry { .. }), "{e}");
    let e = gd.fork(424_242, 1).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { id: 424_242 }), "{e}");
    // An operator's entry holds no state; nor does a step of a `steps` FSM.
    let e = gd.fork(order, again[at].entry).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::EntryWithoutState {
                kind: HistoryKind::Restarted,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        count().await,
        written,
        "a refused fork or restart writes nothing"
    );
    let plain = gd.insert::<Plain>(Count::default()).await.unwrap();
    assert_eq!(finished(pool, plain, 10).await, "done");
    let step = gd.history(plain, None, 10).await.unwrap().entries[0].entry;
    let written = count().await;
    let e = gd.fork(plain, step).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::EntryWithoutState {
                kind: HistoryKind::Next,
                ..
            }
        ),
        "{e}"
    );
    let e = gd.restart_from(plain, step).await.unwrap_err();
    assert!(matches!(e, Error::EntryWithoutState { .. }), "{e}");
    assert_eq!(
        count().await,
        written,
        "a refused fork or restart writes nothing"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}

/// Both reapers and the release leave an entry: the lease a worker lost (on which node,
/// which attempt, what the reaper says), and the rows a drain gave back.
#[tokio::test]
async fn lost_leases_and_releases_are_entries() {
    let db = TestDb::new().await;
    let p = db.pool();
    sqlx::raw_sql(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at, partition_key)
         VALUES ('Plain', 1, 'one', '{}', 'hist', 'executing', 'n1', 7,
                 now() - interval '1 second', 'k1'),
                ('Plain', 1, 'two', '{}', 'hist', 'executing', 'n2', 9,
                 now() + interval '1 minute', 'k2');
         INSERT INTO gd_lanes (queue, fsm, priority) VALUES ('hist', 'Plain', 0);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, status,
                                   ready_seq)
         VALUES ('Plain', 1, 'one', '{}', 'hist', 0, 'runnable', 5);
         INSERT INTO gd_ready (lane, seq, id) VALUES (1, 5, 3);
         INSERT INTO gd_batches (lane, batch, lo, hi, node, expires_at)
         VALUES (1, 1, 1, 10, 'n3', now() - interval '1 second');",
    )
    .execute(p)
    .await
    .unwrap();
    let reaped: Vec<i64> = sqlx::query_scalar("SELECT id FROM gd_reap(10, now(), NULL, 0)")
        .fetch_all(p)
        .await
        .unwrap();
    assert_eq!(reaped, vec![1]);
    let batches: Vec<i64> = sqlx::query_scalar("SELECT id FROM gd_reap_batches(10, now(), 0)")
        .fetch_all(p)
        .await
        .unwrap();
    assert_eq!(batches, vec![3]);
    let released: Vec<i64> = sqlx::query_scalar("SELECT gd_release('{2}', '{9}', 'n2', now())")
        .fetch_all(p)
        .await
        .unwrap();
    assert_eq!(released, vec![2]);

    let gd = Client::new(p.clone());
    let one = |id| {
        let gd = gd.clone();
        async move {
            let mut e = gd.history(id, None, 10).await.unwrap().entries;
            assert_eq!(e.len(), 1, "{e:?}");
            e.remove(0)
        }
    };
    let lost = one(1).await;
    assert_eq!(
        (
            lost.kind,
            lost.step.as_str(),
            lost.attempt,
            lost.node.as_deref()
        ),
        (HistoryKind::LeaseLost, "one", 1, Some("n1"))
    );
    assert!(lost.error.unwrap().contains("lease lost on n1"));
    let lost = one(3).await;
    assert_eq!(
        (lost.kind, lost.node.as_deref()),
        (HistoryKind::LeaseLost, Some("n3"))
    );
    let given = one(2).await;
    assert_eq!(
        (given.kind, given.step.as_str(), given.node.as_deref()),
        (HistoryKind::Released, "two", Some("n2"))
    );
    db.close().await;
}

/// The collector keeps a partition per day from today to two days ahead, and drops the
/// days older than the retention whole. A day whose entries went to the default
/// partition gets none (they stay there until they are old enough).
#[tokio::test]
async fn the_history_is_kept_in_day_partitions_and_dropped_a_day_at_a_time() {
    let db = TestDb::new().await;
    let p = db.pool();
    let parts = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT c.relname::text FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
              WHERE h.inhparent = 'gd_history'::regclass ORDER BY 1",
        )
        .fetch_all(p)
        .await
        .unwrap()
    };
    let keep = |now: &'static str| async move {
        sqlx::query_as::<_, (i32, i32)>(&format!(
            "SELECT created, dropped FROM gd_history_keep('{now}', interval '2 days')"
        ))
        .fetch_one(p)
        .await
        .unwrap()
    };
    // An entry of 2026-03-02 in the default partition: that day gets no partition.
    sqlx::query(
        "INSERT INTO gd_history (instance_id, at, kind, step, attempt)
         VALUES (1, '2026-03-02 12:00+00', 'next', 'a', 1)",
    )
    .execute(p)
    .await
    .unwrap();
    assert_eq!(keep("2026-03-01 23:00+00").await, (2, 0));
    assert_eq!(
        parts().await,
        vec![
            "gd_history_20260301",
            "gd_history_20260303",
            "gd_history_default"
        ]
    );
    assert_eq!(keep("2026-03-01 23:30+00").await, (0, 0), "nothing twice");
    // Five days on: the 1st and the 3rd are older than two days whole; the 2nd's entry
    // in the default partition is deleted.
    assert_eq!(keep("2026-03-06 01:00+00").await, (3, 2));
    assert_eq!(
        parts().await,
        vec![
            "gd_history_20260306",
            "gd_history_20260307",
            "gd_history_20260308",
            "gd_history_default"
        ]
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_history")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(left, 0);
    db.close().await;
}
