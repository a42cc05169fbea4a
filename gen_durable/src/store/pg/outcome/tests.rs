//! The group commit against PostgreSQL: which outcomes of a batch commit, what they write,
//! and the hand-off of gate slots in the same statement.

use super::*;
use crate::model::transition::Transition;

#[test]
fn a_stale_outcome_never_shares_a_call_with_the_newer_claims() {
    let out = StepOutput::stopped("x".into());
    let c = |id, epoch| Commit {
        id,
        epoch,
        output: &out,
        run_ahead: false,
        keep_state: false,
        history: HistoryLevel::Steps,
    };
    // Either order: the newest epoch of row 1 is kept, once.
    for batch in [[c(1, 1), c(2, 5), c(1, 2)], [c(1, 2), c(2, 5), c(1, 1)]] {
        let kept: Vec<(i64, i64)> = one_per_row(&batch)
            .iter()
            .map(|c| (c.id, c.epoch))
            .collect();
        assert_eq!(kept, vec![(1, 2), (2, 5)]);
    }
}

/// A commit reads only its batch, whatever statistics the table has. A drain's backlog
/// (no row with a parent), analyzed, leaves `parent_id` counted as always NULL, and
/// emptying the table does not reset that; with a fan-out's children in place, the
/// commit's lookup of its rows' parents then walked the whole parent index (every
/// child of every parent) on each commit: the harness's fan-out took 1.1 s after a
/// drain in the same run, against 0.7 s alone.
#[tokio::test]
async fn a_commit_reads_only_its_batch_when_the_statistics_saw_no_children() {
    let db = gen_durable_testkit::TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE gd_instances SET (autovacuum_enabled = false);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status)
         SELECT 'F', 1, 's', '{}', 'q', 'done' FROM generate_series(1, 5000);
         ANALYZE gd_instances;
         TRUNCATE gd_instances, gd_signals RESTART IDENTITY CASCADE;
         ANALYZE gd_instances;
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status,
                                   children_pending)
         VALUES ('F', 1, 's', '{}', 'q', 'awaiting_children', 20000);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, parent_id,
                                   locked_by, lease_epoch, lease_expires_at)
         SELECT 'F', 1, 's', '{}', 'q', 'executing', 1, 'n1', 1, now() + interval '1 hour'
           FROM generate_series(1, 20000);",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let done = output(
        Outcome::Done {
            result: serde_json::json!(1),
        },
        serde_json::json!({}),
    );
    let reads = "SELECT pg_stat_get_xact_tuples_returned('gd_instances_parent'::regclass)
                      + pg_stat_get_xact_tuples_fetched('gd_instances_parent'::regclass)";
    // Several commits: the function's first calls plan for their values, later ones
    // may keep a generic plan.
    for round in 0..8_i64 {
        let batch: Vec<Commit> = (0..16)
            .map(|k| Commit {
                id: 2 + round * 16 + k,
                epoch: 1,
                output: &done,
                run_ahead: false,
                keep_state: false,
                history: HistoryLevel::Steps,
            })
            .collect();
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let before: i64 = sqlx::query_scalar(reads).fetch_one(&mut *tx).await.unwrap();
        let got = commit(crate::Pooler::None.on(&mut *tx), "n1", &batch, &[], None)
            .await
            .unwrap();
        assert_eq!(got.fenced.len(), 16, "round {round}");
        let after: i64 = sqlx::query_scalar(reads).fetch_one(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        assert!(
            after - before <= 64,
            "round {round}: {} parent-index entries read to commit 16 children",
            after - before
        );
    }
    drop(conn);
    db.close().await;
}

/// E12 on real PostgreSQL: a stale run's outcome (epoch 1, a `next` consuming the
/// awaited signal) and the live claim's (epoch 2, an `await` that saw it) reach one
/// commit call, in either order. Only the live outcome commits, and the signal the
/// stale run consumed stays in the inbox for the instance's next wake.
#[tokio::test]
async fn a_stale_and_a_live_outcome_of_one_row_in_one_batch_commit_only_the_live_one() {
    let db = gen_durable_testkit::TestDb::new().await;
    let p = db.pool();
    for stale_first in [true, false] {
        sqlx::query("TRUNCATE gd_instances, gd_signals RESTART IDENTITY CASCADE")
            .execute(p)
            .await
            .unwrap();
        // The row as the live claim left it: executing, node n1, epoch 2.
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status,
                                       locked_by, lease_epoch, lease_expires_at)
             VALUES ('Checkout', 1, 'ship', '{}', 'q', 'executing', 'n1', 2,
                     now() + interval '30 seconds')",
        )
        .execute(p)
        .await
        .unwrap();
        let signal: i64 = sqlx::query_scalar(
            "INSERT INTO gd_signals (target_id, name, payload)
             VALUES (1, 'paid', '{\"amount\": 1}') RETURNING id",
        )
        .fetch_one(p)
        .await
        .unwrap();

        let of_run = |outcome, by: &str| StepOutput {
            awaited: vec![signal],
            ..output(outcome, serde_json::json!({ "by": by }))
        };
        let stale = of_run(Outcome::Next { step: "ship" }, "stale");
        let live = of_run(
            Outcome::Await {
                names: vec!["paid".into()],
                step: "ship",
                timeout: None,
            },
            "live",
        );
        let c = |epoch, output| Commit {
            id: 1,
            epoch,
            output,
            run_ahead: false,
            keep_state: false,
            history: HistoryLevel::Steps,
        };
        let batch = if stale_first {
            [c(1, &stale), c(2, &live)]
        } else {
            [c(2, &live), c(1, &stale)]
        };

        let mut conn = p.acquire().await.unwrap();
        let done = commit(crate::Pooler::None.on(&mut *conn), "n1", &batch, &[], None)
            .await
            .unwrap();
        drop(conn);
        assert_eq!(
            done.fenced,
            HashSet::from([1]),
            "stale first: {stale_first}"
        );

        let (status, by): (String, String) =
            sqlx::query_as("SELECT status::text, state->>'by' FROM gd_instances WHERE id = 1")
                .fetch_one(p)
                .await
                .unwrap();
        assert_eq!((status.as_str(), by.as_str()), ("awaiting_signal", "live"));
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_signals")
            .fetch_one(p)
            .await
            .unwrap();
        assert_eq!(left, 1, "the signal only the stale run consumed stays");
        let told: Vec<String> =
            sqlx::query_scalar("SELECT kind FROM gd_history WHERE instance_id = 1")
                .fetch_all(p)
                .await
                .unwrap();
        assert_eq!(told, vec!["await"], "the stale outcome has no entry");
        sqlx::query("DELETE FROM gd_history")
            .execute(p)
            .await
            .unwrap();
    }
    db.close().await;
}

/// A claim commits without waiting for its WAL flush, so a server crash may forget
/// it while its worker runs the step. The crash is played here by putting the row back
/// as it was before the claim. The same node then claims the row again and gets a new
/// epoch (before migration 0022 it got the forgotten claim's, `old + 1`), so the
/// forgotten worker's outcome is refused by the fence and the live claim's commits.
/// No claim function is left that bumps the epoch by one.
#[tokio::test]
async fn a_claim_the_server_forgot_never_gives_its_epoch_again() {
    let db = gen_durable_testkit::TestDb::new().await;
    let p = db.pool();
    let names = ["F".to_string()];
    for flow in [false, true] {
        let params = crate::store::pg::claim::ClaimParams {
            queue: "q",
            names: &names,
            versions: &[1],
            demand: 1,
            node: "n1",
            lease_ttl_ms: 30_000,
            now: None,
            flow,
        };
        let claim = || async { crate::store::pg::claim::claim(p, &params).await.unwrap() };
        sqlx::query("TRUNCATE gd_instances RESTART IDENTITY CASCADE")
            .execute(p)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
             VALUES ('F', 1, 'a', '{}', 'q', 'u1')",
        )
        .execute(p)
        .await
        .unwrap();
        let forgotten = claim().await.rows.remove(0).lease_epoch;
        sqlx::query(
            "UPDATE gd_instances SET status = 'runnable', locked_by = NULL, lease_epoch = 0,
                    lease_expires_at = NULL WHERE id = 1",
        )
        .execute(p)
        .await
        .unwrap();
        let live = claim().await.rows.remove(0).lease_epoch;
        assert_ne!(live, forgotten, "flow {flow}: the epoch was given twice");

        let out = |by: &str| output(Outcome::Next { step: "b" }, serde_json::json!({ "by": by }));
        let (old, new) = (out("forgotten"), out("live"));
        for (epoch, output) in [(forgotten, &old), (live, &new)] {
            let batch = [Commit {
                id: 1,
                epoch,
                output,
                run_ahead: false,
                keep_state: false,
                history: HistoryLevel::Steps,
            }];
            let mut conn = p.acquire().await.unwrap();
            commit(crate::Pooler::None.on(&mut *conn), "n1", &batch, &[], None)
                .await
                .unwrap();
        }
        let by: String = sqlx::query_scalar("SELECT state->>'by' FROM gd_instances")
            .fetch_one(p)
            .await
            .unwrap();
        assert_eq!(
            by, "live",
            "flow {flow}: only the live claim's outcome commits"
        );
    }
    let bumped_by_one: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc WHERE prosrc LIKE '%lease_epoch = i.lease_epoch + 1%'",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(bumped_by_one, 0);
    db.close().await;
}

/// The group commit of gated rows in one statement (`gd_commit_handoff`): the apply,
/// then a slot handed on for each gated row it ended, and only those. Gate `g` (K = 4),
/// key `k`: rows 1–4 were claimed (slots 0–3, node `n1`, epoch 1), rows 5–9 wait. Row
/// 2's lease was then reaped: runnable again, its old slot number left on it. In the
/// batch: 1 ends (`done`); 2's outcome is stale (not written: its slot is not this
/// commit's to hand on, though the row no longer runs); 3 goes on to its next step as
/// run-ahead (still claimed, its slot kept); 4 is not in the batch.
#[tokio::test]
async fn a_gated_commit_hands_on_the_slots_of_the_rows_it_ended_and_no_other() {
    let db = gen_durable_testkit::TestDb::new().await;
    let p = db.pool();
    sqlx::raw_sql(
        "INSERT INTO gd_gates (name, size) VALUES ('g', 4);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                                   status, locked_by, lease_epoch, gate_slot,
                                   lease_expires_at)
         SELECT 'F', 1, 's', '{}', 'q', 'g', 'k', 'executing', 'n1', 1, s - 1,
                now() + interval '1 minute'
           FROM generate_series(1, 4) s;
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'g', 'k' FROM generate_series(1, 5);
         UPDATE gd_instances SET status = 'runnable', locked_by = NULL,
                                 lease_expires_at = NULL
          WHERE id = 2;",
    )
    .execute(p)
    .await
    .unwrap();
    let done = output(
        Outcome::Done {
            result: serde_json::json!(1),
        },
        serde_json::json!({}),
    );
    let next = output(Outcome::Next { step: "s" }, serde_json::json!({}));
    let c = |id, epoch, output, run_ahead| Commit {
        id,
        epoch,
        output,
        run_ahead,
        keep_state: false,
        history: HistoryLevel::Steps,
    };
    let batch = [
        c(1, 1, &done, false),
        c(2, 1, &done, false),
        c(3, 1, &next, true),
    ];
    let gated: Vec<Freed> = (1..=3)
        .map(|id| Freed {
            id,
            queue: "q".into(),
            gate: "g".into(),
            key: "k".into(),
            slot: None,
        })
        .collect();
    let names = ["F".to_string()];
    let params = HandoffParams {
        names: &names,
        versions: &[1],
        node: "n1",
        lease_ttl_ms: 60_000,
        now: None,
    };
    let mut conn = p.acquire().await.unwrap();
    let (got, handed) = commit_and_hand_off(
        crate::Pooler::None.on(&mut *conn),
        "n1",
        &batch,
        &[],
        &params,
        &gated,
    )
    .await
    .unwrap();
    drop(conn);
    assert_eq!(got.fenced, HashSet::from([1, 3]));
    assert_eq!(got.continued, HashSet::from([3]));
    assert!(handed.iter().all(|(_, r)| r.lease_epoch > 1), "a new epoch");
    let handed: Vec<(String, i64)> = handed.into_iter().map(|(q, r)| (q, r.id)).collect();
    // Row 1's slot, to the key's first row in pick order: row 2, claimed again.
    assert_eq!(handed, vec![("q".to_string(), 2)]);
    let rows: Vec<(i64, String, Option<i16>)> = sqlx::query_as(
        "SELECT id, status::text, gate_slot FROM gd_instances
          WHERE status = 'executing' ORDER BY id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [(2, 0), (3, 2), (4, 3)]
            .map(|(id, slot)| (id, "executing".to_string(), Some(slot)))
            .to_vec()
    );
    db.close().await;
}

/// A run-ahead `next` that moves no key and takes no limit is written by the apply's
/// short path (migration 0024), which sets only what such an outcome changes; any other
/// outcome by the general one. Rows 1–4 start alike, claimed by `n1` at epoch 1, with
/// everything a step may leave on a row set (attempts, reaps, an error, awaits, its
/// step's rate limit, paid). In one batch, each gets a run-ahead `next` to step `b`:
/// 1 moving no key (the short path); 2 releasing its key, which it does not hold (the
/// general path, for the same result); 3 the same as 1, but its cancel was requested
/// (it must end as cancelled, not run ahead); 4 the same as 1 at a stale epoch (not
/// written).
#[tokio::test]
async fn a_run_ahead_next_writes_what_the_general_apply_writes() {
    let db = gen_durable_testkit::TestDb::new().await;
    let p = db.pool();
    sqlx::raw_sql(
        "INSERT INTO gd_rate_limits (name, per_second, burst) VALUES ('r', 10, 10);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at, eligible_at, attempt,
                                   reaps, last_error, awaits, rate_limit, rate_key,
                                   rate_weight, rate_step, rate_paid, cancel_requested)
         SELECT 'F', 1, 'a', '{\"n\": 0}', 'q', 'executing', 'n1', 1,
                now() + interval '1 minute', now() - interval '1 hour', 2, 1, 'boom',
                '{x}', 'r', 'k', 1, 'a', true, s = 3
           FROM generate_series(1, 4) s;",
    )
    .execute(p)
    .await
    .unwrap();
    let row: (Vec<i64>, Vec<i64>) = sqlx::query_as(
        "SELECT committed, array(SELECT unnest(continued) ORDER BY 1)
           FROM gd_commit_outcomes(
             'n1', '{1,2,3,4}', '{1,1,1,0}', '{next,next,next,next}', '{b,b,b,b}',
             array_fill('{\"n\": 1}'::jsonb, '{4}'), '{NULL,NULL,NULL,NULL}',
             '{NULL,NULL,NULL,NULL}', '{NULL,NULL,NULL,NULL}', '{NULL,NULL,NULL,NULL}',
             '{0,0,0,0}', '{t,t,t,t}', '{}', '{}', '{}', now(),
             '{f,t,f,f}', '{NULL,NULL,NULL,NULL}', '{NULL,NULL,NULL,NULL}',
             '{NULL,NULL,NULL,NULL}', '{NULL,NULL,NULL,NULL}', '{NULL,NULL,NULL,NULL}')",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(row, (vec![1, 2, 3], vec![1, 2]));
    let rows: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT to_jsonb(i) - 'id' FROM gd_instances i ORDER BY id")
            .fetch_all(p)
            .await
            .unwrap();
    assert_eq!(rows[0], rows[1], "the short path and the general one");
    assert_eq!(rows[0]["step"], "b");
    assert_eq!(rows[0]["state"], serde_json::json!({ "n": 1 }));
    assert_eq!(rows[0]["status"], "executing");
    assert_eq!(rows[0]["rate_limit"], serde_json::Value::Null);
    assert_eq!(
        (&rows[2]["status"], &rows[2]["last_error"]),
        (
            &serde_json::json!("failed"),
            &serde_json::json!("cancelled")
        )
    );
    assert_eq!(
        (&rows[3]["step"], &rows[3]["attempt"]),
        (&serde_json::json!("a"), &serde_json::json!(2)),
        "a stale outcome writes nothing"
    );
    db.close().await;
}

/// A batch of plain rows' `done` takes the lean commit (`gd_commit_done`), which writes
/// what the general commit writes: rows 1-3 by the lean one, rows 4-6 (the same rows) by
/// the general one, each with a signal in its inbox (deleted with it). The lean commit is
/// all or nothing: with a cancelled row (7) or a row someone holds (9) in the batch, it
/// writes nothing and the general commit takes the batch, which stops 7 "cancelled",
/// commits 8 and 10, and defers 9.
#[tokio::test]
async fn a_batch_of_plain_dones_takes_the_lean_commit_which_writes_what_the_general_one_writes() {
    let db = gen_durable_testkit::TestDb::new().await;
    let p = db.pool();
    sqlx::raw_sql(
        "INSERT INTO gd_lanes (queue, fsm, priority) VALUES ('q', 'F', 0);
         INSERT INTO gd_batches (lane, batch, lo, hi, node, expires_at)
         VALUES (1, 1, 1, 100, 'n1', now() + interval '1 minute');
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, status,
                                   ready_seq, last_error, cancel_requested)
         SELECT 'F', 1, 'a', '{\"n\": 0}', 'q', 0, 'runnable', 10 + s, 'boom', s = 7
           FROM generate_series(1, 10) s;
         INSERT INTO gd_signals (target_id, name, payload)
         SELECT s, 'x', '{}' FROM generate_series(1, 6) s;",
    )
    .execute(p)
    .await
    .unwrap();
    let history =
        |n: usize| format!(", array_fill(2::int2, '{{{n}}}'), array_fill(1000::int8, '{{{n}}}')");
    // The arguments both take (the general one also takes the kinds, after the epochs).
    let args = |ids: &str, epochs: &str, general: bool| {
        let n = ids.split(',').count();
        let kinds = if general {
            format!("array_fill('done'::text, '{{{n}}}'), ")
        } else {
            String::new()
        };
        format!(
            "'n1', '{{{ids}}}'::int8[], '{{{epochs}}}'::int8[], {kinds}
             array_fill(NULL::text, '{{{n}}}'), array_fill('{{\"n\": 1}}'::jsonb, '{{{n}}}'),
             array_fill('{{\"ok\": true}}'::jsonb, '{{{n}}}'), array_fill(NULL::text, '{{{n}}}')"
        )
    };
    // The general one's other arguments; then both take the history's (level full, a
    // step of 1 ms).
    let general_tail = |n: usize| {
        format!(
            ", array_fill(NULL::int8, '{{{n}}}'), array_fill(NULL::text, '{{{n}}}'),
             array_fill(0, '{{{n}}}'), array_fill(false, '{{{n}}}'), '{{}}', '{{}}', '{{}}', now(),
             NULL, NULL, NULL, NULL, NULL, NULL{}",
            history(n)
        )
    };
    let lean: Option<Vec<i64>> = sqlx::query_scalar(&format!(
        "SELECT gd_commit_done({}, now(){})",
        args("1,2,3", "11,12,13", false),
        history(3)
    ))
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(lean, Some(vec![1, 2, 3]));
    let general: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT committed FROM gd_commit_general({}{})",
        args("4,5,6", "14,15,16", true),
        general_tail(3)
    ))
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(general, vec![4, 5, 6]);
    let rows: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT to_jsonb(i) - 'id' - 'updated_at' - 'finished_at' - 'created_at'
           FROM gd_instances i WHERE id <= 6 ORDER BY id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    for n in 0..3 {
        assert_eq!(rows[n], rows[n + 3], "the lean commit and the general one");
    }
    assert_eq!(
        (
            &rows[0]["status"],
            &rows[0]["result"],
            &rows[0]["ready_seq"]
        ),
        (
            &serde_json::json!("done"),
            &serde_json::json!({ "ok": true }),
            &serde_json::Value::Null
        )
    );
    let inbox: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_signals")
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(inbox, 0, "the inboxes of the ended rows are deleted");
    let told: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT to_jsonb(h) - 'entry' - 'instance_id' - 'at' - 'started_at'
              || jsonb_build_object('ran', h.at - h.started_at)
           FROM gd_history h ORDER BY instance_id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    assert_eq!(told.len(), 6, "{told:?}");
    for n in 0..3 {
        assert_eq!(told[n], told[n + 3], "the history of both");
    }
    assert_eq!(
        (&told[0]["kind"], &told[0]["step"], &told[0]["attempt"]),
        (
            &serde_json::json!("done"),
            &serde_json::json!("a"),
            &serde_json::json!(1)
        )
    );
    assert_eq!(told[0]["state"], serde_json::json!({ "n": 0 }));
    assert_eq!(told[0]["ran"], serde_json::json!("00:00:00.001"));

    // Rows 7-10: a cancelled row and a held one send the batch to the general commit.
    let mut holder = p.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM gd_instances WHERE id = 9 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let none: Option<Vec<i64>> = sqlx::query_scalar(&format!(
        "SELECT gd_commit_done({}, now(){})",
        args("8,9,10", "18,19,20", false),
        history(3)
    ))
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(none, None, "a held row: the lean commit writes nothing");
    let done: (Vec<i64>, Vec<i64>) = sqlx::query_as(&format!(
        "SELECT committed, deferred FROM gd_commit_outcomes({}{})",
        args("7,8,9,10", "17,18,19,20", true),
        general_tail(4)
    ))
    .fetch_one(p)
    .await
    .unwrap();
    holder.rollback().await.unwrap();
    assert_eq!(done, (vec![7, 8, 10], vec![9]));
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT id, status::text, last_error FROM gd_instances WHERE id >= 7 ORDER BY id",
    )
    .fetch_all(p)
    .await
    .unwrap();
    let s = |x: &str| Some(x.to_string());
    assert_eq!(
        rows,
        vec![
            (7, "failed".into(), s("cancelled")),
            (8, "done".into(), None),
            (9, "runnable".into(), s("boom")),
            (10, "done".into(), None),
        ]
    );
    db.close().await;
}

/// A step's output of `outcome` with `state`, no signal seen, no transition.
fn output(outcome: Outcome, state: serde_json::Value) -> StepOutput {
    StepOutput {
        outcome,
        state,
        awaited: vec![],
        error: None,
        tx: None,
        run_ahead: false,
        transition: Transition::default(),
        duration: std::time::Duration::ZERO,
    }
}
