//! What a claim takes, hands back and defers, and how claims on two connections meet.
//! These claims take the rows with a K = 1 key, a gate or a rate limit (plain rows are
//! claimed from the log): rows that no key holds back have unique keys (`u…`) here.

use super::super::*;
use super::claim_params;
use gen_durable_testkit::TestDb;

/// A claim locks no more rows of a gate key than the key has room for: of a hot key
/// with 2 free slots it takes 2 rows and hands none back (migration 0016; before it,
/// it locked a whole batch and handed back all but 2). Once the key is full, the rows
/// without a gate queued behind it are still claimed: a full key's rows do not count
/// against the batch.
#[tokio::test]
async fn a_claim_locks_no_more_rows_of_a_gate_key_than_its_room() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    // Gate g, K = 4: two rows of key k run; 100 of k wait, then 10 without a gate.
    sqlx::raw_sql(
        "INSERT INTO gd_gates (name, size) VALUES ('g', 4);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                                   status, gate_slot, locked_by)
         SELECT 'F', 1, 's', '{}', 'q', 'g', 'k', 'executing', s, 'n0'
           FROM generate_series(0, 1) s;
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'g', 'k' FROM generate_series(1, 100);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'u' || g FROM generate_series(1, 10) g;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let params = claim_params("n1", 16, true);
    let pick = claim(&mut *conn, &params).await.unwrap();
    assert_eq!(pick.rows.len(), 2, "the key's two free slots");
    assert!(
        pick.contended.is_empty(),
        "no row locked only to be handed back: {:?}",
        pick.contended
    );
    let full = claim(&mut *conn, &params).await.unwrap();
    assert_eq!(
        full.rows.len(),
        10,
        "the rows without a gate, behind the full key"
    );
    assert!(full.rows.iter().all(|r| r.gate.is_none()));
    drop(conn);
    db.close().await;
}

/// Two nodes claim one gate key at once, each wanting all its room: the second waits
/// for the first (on the gate's row), then sees the slots it took and claims none,
/// instead of choosing the same free slots and failing on the slot index once the first
/// commits (before migration 0016 it failed with a unique violation every time).
#[tokio::test]
async fn two_claims_of_one_gate_key_take_turns_instead_of_racing_for_its_slots() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "INSERT INTO gd_gates (name, size) VALUES ('g', 4);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'g', 'k' FROM generate_series(1, 100);",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let params = claim_params("n1", 16, true);
    let mut first = db.pool().begin().await.unwrap();
    let took = claim(&mut *first, &params).await.unwrap().rows;
    assert_eq!(took.len(), 4, "the key's whole room");
    let mut other = db.pool().acquire().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *other)
        .await
        .unwrap();
    let second = tokio::spawn(async move {
        let params = claim_params("n2", 16, true);
        claim(&mut *other, &params).await.map(|p| p.rows.len())
    });
    // The second claim waits on a lock the first holds.
    crate::store::pg::until_waiting_on_a_lock(db.pool(), pid, "the second claim").await;
    first.commit().await.unwrap();
    let got = second.await.unwrap();
    assert!(
        matches!(got, Ok(0)),
        "the second claim sees the slots taken and claims nothing: {got:?}"
    );
    db.close().await;
}

/// Without a gate or a rate limit declared the plain claim runs and says so; once one
/// is declared it claims no row that names one, returns its summary saying to switch,
/// and the full claim then takes the gated row.
#[tokio::test]
async fn the_plain_claim_switches_to_the_full_one_once_a_gate_is_declared() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let params = |flow| claim_params("n1", 10, flow);
    let insert = "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, \
                  partition_key) VALUES ('F', 1, 's', '{}', 'q', $1, $2)";
    sqlx::query(insert)
        .bind(None::<&str>)
        .bind("u1")
        .execute(&mut *conn)
        .await
        .unwrap();
    let pick = claim(&mut *conn, &params(false)).await.unwrap();
    assert_eq!(
        (pick.rows.len(), pick.flow, pick.switch),
        (1, Some(false), false)
    );
    let idle = claim(&mut *conn, &params(false)).await.unwrap();
    assert_eq!(
        (idle.rows.len(), idle.flow),
        (0, None),
        "an idle poll returns nothing"
    );

    sqlx::query("INSERT INTO gd_gates (name, size) VALUES ('g', 1)")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(insert)
        .bind("g")
        .bind("k")
        .execute(&mut *conn)
        .await
        .unwrap();
    let plain = claim(&mut *conn, &params(false)).await.unwrap();
    assert_eq!(
        (plain.rows.len(), plain.flow, plain.switch),
        (0, Some(true), true)
    );
    let full = claim(&mut *conn, &params(true)).await.unwrap();
    assert_eq!(full.rows.len(), 1, "the gated row");
    assert_eq!(full.rows[0].gate.as_deref(), Some("g"));
    let idle = claim(&mut *conn, &params(true)).await.unwrap();
    assert_eq!((idle.rows.len(), idle.flow), (0, None));
    drop(conn);
    db.close().await;
}

/// While rate limits are declared and no gate is, the full claim hands its work to
/// `gd_claim_rated` (migration 0020), which takes the rate-limited row and debits its
/// bucket; once a gate is declared, `gd_claim` runs its own statement again. Which
/// function ran is read from the transaction's function counters.
#[tokio::test]
async fn the_full_claim_skips_the_gates_work_while_no_gate_is_declared() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO gd_rate_limits (name, per_second, burst) VALUES ('r', 1, 5);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, rate_limit,
                                   rate_key, rate_weight, rate_step)
         SELECT 'F', 1, 's', '{}', 'q', 'r', 'k', 1, 's' FROM generate_series(1, 2);",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // Calls of `gd_claim_rated` this session has made and not yet reported (the view
    // keeps them past the transaction's end until they are flushed).
    let calls = "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_xact_user_functions
                  WHERE funcname = 'gd_claim_rated'";
    for gate in [false, true] {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        sqlx::query("SET LOCAL track_functions = 'pl'")
            .execute(&mut *tx)
            .await
            .unwrap();
        if gate {
            sqlx::query("INSERT INTO gd_gates (name, size) VALUES ('g', 1)")
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        let before: i64 = sqlx::query_scalar(calls).fetch_one(&mut *tx).await.unwrap();
        let pick = claim(&mut *tx, &claim_params("n1", 1, true)).await.unwrap();
        let after: i64 = sqlx::query_scalar(calls).fetch_one(&mut *tx).await.unwrap();
        assert_eq!(pick.rows.len(), 1, "gate {gate}: the rate-limited row");
        let tokens: f64 = sqlx::query_scalar("SELECT tokens FROM gd_buckets")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert!(
            (tokens - 4.0).abs() < 0.01,
            "gate {gate}: {tokens} tokens left"
        );
        assert_eq!(
            after - before,
            i64::from(!gate),
            "gate {gate}: gd_claim_rated calls"
        );
        tx.rollback().await.unwrap();
    }
    drop(conn);
    db.close().await;
}

/// Both claims turn `synchronous_commit` off for their own transaction only: inside a
/// transaction it is off after the claim; on a pooled connection in autocommit, the
/// next statement finds it on again.
#[tokio::test]
async fn a_claim_commits_without_waiting_for_its_flush_and_leaves_the_session_as_it_was() {
    let db = TestDb::new().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'F', 1, 's', '{}', 'q', 'u' || g FROM generate_series(1, 4) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let setting = "SELECT current_setting('synchronous_commit')";
    for flow in [false, true] {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let rows = claim(&mut *tx, &claim_params("n1", 1, flow))
            .await
            .unwrap()
            .rows;
        assert_eq!(rows.len(), 1);
        let inside: String = sqlx::query_scalar(setting)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(inside, "off", "flow {flow}: in the claim's transaction");
        tx.commit().await.unwrap();
        let rows = claim(&mut *conn, &claim_params("n1", 1, flow))
            .await
            .unwrap()
            .rows;
        assert_eq!(rows.len(), 1);
        let after: String = sqlx::query_scalar(setting)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(after, "on", "flow {flow}: after an autocommitted claim");
    }
    drop(conn);
    db.close().await;
}
