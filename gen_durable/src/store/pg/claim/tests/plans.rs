//! The plans the claim functions keep: index scans that stop at the batch, whatever the
//! table held when the plan was made, one pass for the inboxes, no JIT. These claims take
//! the rows with a K = 1 key, a gate or a rate limit (plain rows are claimed from the log),
//! so the rows here have keys: unique ones (`u…`) where a test means rows no key holds back.

use super::super::*;
use super::{claim_params, plan, plan_of};
use gen_durable_testkit::TestDb;
use serde_json::Value;

/// The pause check is one probe per statement (an InitPlan under a one-time filter),
/// not a join: the pick stays an index scan of the pick index that stops at the batch,
/// and for a paused queue that scan never starts.
#[tokio::test]
async fn a_paused_queue_is_checked_once_and_the_pick_stays_an_index_scan() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'F', 1, 's', '{}', CASE WHEN g % 10 = 0 THEN 'other' ELSE 'q' END, 'u' || g
           FROM generate_series(1, 20000) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::query("ANALYZE gd_instances")
        .execute(&mut *conn)
        .await
        .unwrap();
    for function in ["gd_claim", "gd_claim_rated", "gd_claim_plain"] {
        let running = plan_of(&mut conn, function, 16).await;
        assert!(running.contains("One-Time Filter: (NOT"), "{running}");
        assert!(
            running.contains(
                "Index Scan using gd_instances_pick on gd_instances i (actual rows=16 loops=1)"
            ),
            "the pick reads the batch only:\n{running}"
        );
        assert!(!running.contains("Seq Scan on gd_instances"), "{running}");

        sqlx::query("INSERT INTO gd_queue_pauses (queue) VALUES ('q')")
            .execute(&mut *conn)
            .await
            .unwrap();
        let paused = plan_of(&mut conn, function, 16).await;
        assert!(
            paused
                .contains("Index Scan using gd_instances_pick on gd_instances i (never executed)"),
            "{paused}"
        );
        sqlx::query("DELETE FROM gd_queue_pauses")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    drop(conn);
    db.close().await;
}

/// Each claim reads its rows' inboxes and children in one pass each, not by two
/// subqueries per claimed row (migration 0026), and each row still gets its own, in
/// id order, and `[]` where it has none.
#[tokio::test]
async fn a_claim_reads_its_rows_inboxes_and_children_in_one_pass_each() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'u' || g FROM generate_series(1, 20) g;
         CREATE TEMP TABLE nth AS
         SELECT id, row_number() OVER (ORDER BY id) AS n FROM gd_instances;
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, parent_id, status,
                                   result)
         SELECT 'C', 1, 's', jsonb_build_object('n', c), 'kids', nth.id,
                (CASE c WHEN 1 THEN 'done' ELSE 'runnable' END)::gd_status,
                CASE c WHEN 1 THEN '7'::jsonb END
           FROM nth, generate_series(1, 2) c WHERE nth.n = 2;
         INSERT INTO gd_signals (target_id, name, payload)
         SELECT id, 'b', '1' FROM nth WHERE n = 3;
         INSERT INTO gd_signals (target_id, name, payload)
         SELECT id, 'a', '2' FROM nth WHERE n = 3;
         INSERT INTO gd_signals (target_id, name, payload)
         SELECT id, 'c', '3' FROM nth WHERE n = 4;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let first: i64 = sqlx::query_scalar("SELECT min(id) FROM gd_instances")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    for function in ["gd_claim", "gd_claim_rated", "gd_claim_plain"] {
        let plan = plan_of(&mut conn, function, 16).await;
        assert!(
            plan.contains("on gd_signals s (actual rows=3 loops=1)"),
            "{function}: the inboxes in one pass:\n{plan}"
        );
        assert!(
            plan.contains("on gd_instances ch (actual rows=2 loops=1)"),
            "{function}: the children in one pass:\n{plan}"
        );
    }
    for flow in [false, true] {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let rows = claim(&mut *tx, &claim_params("n1", 16, flow))
            .await
            .unwrap()
            .rows;
        let nth: Vec<i64> = rows.iter().map(|r| r.id - first + 1).collect();
        assert_eq!(nth, (1..=16).collect::<Vec<i64>>(), "flow {flow}");
        for r in &rows {
            let n = r.id - first + 1;
            let inbox: Vec<(&str, &Value)> =
                r.inbox.0.iter().map(|s| (&*s.name, &s.payload)).collect();
            let children: Vec<(&str, &Value)> =
                r.children.0.iter().map(|c| (&*c.fsm, &c.state)).collect();
            match n {
                2 => {
                    assert!(inbox.is_empty());
                    assert_eq!(
                        children,
                        [
                            ("C", &serde_json::json!({"n": 1})),
                            ("C", &serde_json::json!({"n": 2}))
                        ]
                    );
                    assert_eq!(r.children.0[0].result, Some(serde_json::json!(7)));
                }
                3 => assert_eq!(
                    inbox,
                    [("b", &serde_json::json!(1)), ("a", &serde_json::json!(2))]
                ),
                4 => assert_eq!(inbox, [("c", &serde_json::json!(3))]),
                _ => assert!(inbox.is_empty(), "row {n}"),
            }
            if n != 2 {
                assert!(children.is_empty(), "row {n}");
            }
        }
        tx.rollback().await.unwrap();
    }
    drop(conn);
    db.close().await;
}

/// No claim is compiled by JIT, however costly its plan looks. PostgreSQL compiles a
/// statement whose estimate is above `jit_above_cost` on every execution; `gd_claim`'s
/// generic plan is estimated from the whole backlog, and at 1,000,000 rows with gated
/// ones each claim spent 1.8 s compiling (gen_durable_bench/results/PERFORMANCE-log.md, "Claim with gated rows";
/// migration 0018). `plan_of` explains under the functions' own settings with the
/// threshold at 0, so a function that allowed JIT would show it on any table. (Where
/// the server has no JIT, as `pg_jit_available()` says, this cannot fail.)
#[tokio::test]
async fn no_claim_is_compiled_by_jit() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'u' || g FROM generate_series(1, 1000) g;
         ANALYZE gd_instances;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let jit: bool = sqlx::query_scalar("SELECT pg_jit_available()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    for function in ["gd_claim", "gd_claim_rated", "gd_claim_plain"] {
        let plan = plan_of(&mut conn, function, 16).await;
        assert!(
            plan.contains("actual rows=16"),
            "{function} claims:\n{plan}"
        );
        assert!(
            !plan.contains("JIT:"),
            "{function} is compiled by JIT (available: {jit}):\n{plan}"
        );
    }
    drop(conn);
    db.close().await;
}

/// Rows of full gate keys are skipped inside the pick, before the `LIMIT`: the pick
/// stays an index scan of the pick index that stops a few entries past the batch,
/// whatever the backlog holds behind it, and claims a whole batch of other rows.
#[tokio::test]
async fn full_gate_keys_are_skipped_before_the_limit_and_the_pick_stays_an_index_scan() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    // 50,000 runnable rows; every tenth is gated (5 keys of gate g, K = 2), and each
    // key already has 2 executing rows: every gated row is held back.
    sqlx::raw_sql(
        "INSERT INTO gd_gates (name, size) VALUES ('g', 2);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
         SELECT 'F', 1, 's', '{}', 'q',
                CASE WHEN g % 10 = 0 THEN 'g' END,
                CASE WHEN g % 10 = 0 THEN 'k' || (g / 10) % 5 ELSE 'u' || g END
           FROM generate_series(1, 50000) g;
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                                   status, gate_slot, locked_by)
         SELECT 'F', 1, 's', '{}', 'q', 'g', 'k' || k, 'executing', s, 'n0'
           FROM generate_series(0, 4) k, generate_series(0, 1) s;
         ANALYZE gd_instances;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan = plan(&mut conn, 64).await;
    let scan = plan
        .lines()
        .find(|l| l.contains("Index Scan using gd_instances_pick on gd_instances i"))
        .unwrap_or_else(|| panic!("no pick index scan:\n{plan}"));
    let read: i64 = scan
        .split("actual rows=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{scan}"));
    assert!(
        (64..=80).contains(&read),
        "the scan stops just past the batch (64 claimed, 1 in 10 skipped): read {read}\n{plan}"
    );
    assert!(!plan.contains("Seq Scan on gd_instances"), "{plan}");
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let params = claim_params("n1", 64, true);
    let claimed = claim(&mut *tx, &params).await.unwrap().rows;
    assert_eq!(claimed.len(), 64, "a whole batch of ungated rows");
    assert!(claimed.iter().all(|c| c.gate.is_none()));
    tx.rollback().await.unwrap();
    drop(conn);
    db.close().await;
}

/// Each claim function keeps the plan it made at its connection's first call, often on
/// an empty table. Once 50,000 rows are in, unseen by any `ANALYZE` (autovacuum off,
/// as between two of its runs), that plan still reads the batch through the pick
/// index and never the table whole, and updates the claimed rows by primary key (with
/// 0015's join, that plan walked the whole primary key for every claim and matched
/// each entry against the batch: 0.3-0.7 s per claim of a 10,000-row fan-out).
#[tokio::test]
async fn a_plan_made_on_an_empty_table_still_reads_only_the_batch() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE gd_instances SET (autovacuum_enabled = false); ANALYZE gd_instances;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let params = |flow| claim_params("n1", 16, flow);
    for flow in [false, true] {
        let pick = claim(&mut *conn, &params(flow)).await.unwrap();
        assert!(pick.rows.is_empty());
    }
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', CASE WHEN g % 10 = 0 THEN 'k' || g % 100 ELSE 'u' || g END
           FROM generate_series(1, 50000) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let reads = "SELECT seq_scan,
                        pg_stat_get_xact_tuples_returned('gd_instances_pick'::regclass),
                        pg_stat_get_xact_tuples_returned('gd_instances_pkey'::regclass)
                   FROM pg_stat_xact_user_tables WHERE relname = 'gd_instances'";
    for flow in [false, true] {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        sqlx::query("SET LOCAL statement_timeout = '5s'")
            .execute(&mut *tx)
            .await
            .unwrap();
        let (scans, read, by_id): (i64, i64, i64) =
            sqlx::query_as(reads).fetch_one(&mut *tx).await.unwrap();
        let pick = claim(&mut *tx, &params(flow)).await.unwrap();
        assert_eq!(pick.rows.len(), 16, "flow {flow}");
        let (scans_after, read_after, by_id_after): (i64, i64, i64) =
            sqlx::query_as(reads).fetch_one(&mut *tx).await.unwrap();
        assert_eq!(scans_after, scans, "flow {flow}: no sequential scan");
        assert!(
            read_after - read <= 32,
            "flow {flow}: {} pick index entries read for 16 rows",
            read_after - read
        );
        // The claimed rows are updated through the primary key, one probe each: not
        // the whole index walked and joined with the batch.
        assert!(
            by_id_after - by_id <= 32,
            "flow {flow}: {} primary-key entries read to update 16 rows",
            by_id_after - by_id
        );
        tx.rollback().await.unwrap();
    }
    drop(conn);
    db.close().await;
}
