//! The ready log of storage v2 (`gen_durable/sql/log.sql`) through its SQL functions, on a
//! real database: what an append, a claim (`gd_advance`), a read and the reaper of batches
//! do, and the watermark under appenders that commit and roll back while claims run: the
//! properties the engine's claim of plain rows rests on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gen_durable_testkit::TestDb;

mod common;
use sqlx::{PgPool, Row};

/// Inserts `n` rows of FSM `F` v1 in queue `q` at `priority`, and appends them, in one
/// transaction; returns their ids.
async fn ready(pool: &PgPool, n: i64, priority: i16) -> Vec<i64> {
    let mut tx = pool.begin().await.unwrap();
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority)
         SELECT 'F', 1, 's', jsonb_build_object('g', g), 'q', $2 FROM generate_series(1, $1) g
         RETURNING id",
    )
    .bind(n)
    .bind(priority)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    sqlx::query("SELECT gd_append($1, NULL)")
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    ids
}

/// One claim of up to `demand` entries of queue `q` by `node`: the batches (lane, batch
/// pairs) `gd_advance` took, in its own transaction.
async fn advance(pool: &PgPool, node: &str, demand: i64) -> Vec<i64> {
    let rows = sqlx::query("SELECT lane, batch FROM gd_advance('q', '{F}', $1, $2, 30000, NULL)")
        .bind(demand)
        .bind(node)
        .fetch_all(pool)
        .await
        .unwrap();
    rows.iter()
        .flat_map(|r| [r.get::<i32, _>("lane") as i64, r.get::<i64, _>("batch")])
        .collect()
}

/// The rows of `batches` as `gd_read` returns them for a node that runs `F` v1: (id,
/// lease_epoch), in entry order.
async fn read(pool: &PgPool, batches: &[i64]) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT id, lease_epoch FROM gd_read($1, '{F}', '{1}', NULL)")
        .bind(batches)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A claim and its read: the ids claimed.
async fn claim(pool: &PgPool, node: &str, demand: i64) -> Vec<i64> {
    let batches = advance(pool, node, demand).await;
    if batches.is_empty() {
        return vec![];
    }
    read(pool, &batches)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[tokio::test]
async fn a_claim_takes_a_range_of_entries_in_order_and_the_epoch_is_the_rows_fence() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let ids = ready(pool, 10, 0).await;
    let batches = advance(pool, "n1", 4).await;
    assert_eq!(batches.len(), 2, "one batch (lane, batch): {batches:?}");
    let rows = read(pool, &batches).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        ids[..4],
        "the first four rows, first in first out"
    );
    for (id, epoch) in &rows {
        let fence: i64 = sqlx::query_scalar("SELECT ready_seq FROM gd_instances WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(fence, *epoch, "row {id}'s fence is its entry");
    }
    let written: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE updated_at <> inserted_at")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(written, 0, "a claim writes no row");
    assert_eq!(claim(pool, "n1", 100).await, ids[4..], "the rest, once");
    assert!(claim(pool, "n1", 100).await.is_empty(), "nothing twice");
    db.close().await;
}

#[tokio::test]
async fn a_claim_serves_the_most_urgent_priority_first_and_nothing_of_a_paused_queue() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let late = ready(pool, 3, 5).await;
    let urgent = ready(pool, 3, 0).await;
    sqlx::query("INSERT INTO gd_queue_pauses (queue) VALUES ('q')")
        .execute(pool)
        .await
        .unwrap();
    assert!(advance(pool, "n1", 10).await.is_empty(), "paused");
    sqlx::query("DELETE FROM gd_queue_pauses")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(claim(pool, "n1", 3).await, urgent, "priority 0 first");
    assert_eq!(claim(pool, "n1", 3).await, late);
    db.close().await;
}

/// R4-3 in CI: a claim that began before a pause waited for an appender in flight (its
/// lane's watermark waits for them), and then took the entry that appender committed,
/// after the pause: a step started in a paused queue. The claim looks at the pauses again
/// once it holds its lanes.
#[tokio::test]
async fn a_claim_that_waited_for_an_appender_takes_nothing_once_its_queue_is_paused() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let first = ready(pool, 1, 0).await;
    assert_eq!(
        claim(pool, "n1", 10).await,
        first,
        "the lane's settled range is used up"
    );
    let lane: i32 = sqlx::query_scalar("SELECT lane FROM gd_lanes WHERE queue = 'q'")
        .fetch_one(pool)
        .await
        .unwrap();
    // An appender in flight: it holds its lane's append lock until it commits.
    let mut appender = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock_shared(1734631276, $1)")
        .bind(lane)
        .execute(&mut *appender)
        .await
        .unwrap();
    // A claim starts before the pause: it waits for the appender to move the watermark.
    let claiming = {
        let pool = pool.clone();
        tokio::spawn(async move { advance(&pool, "n1", 10).await })
    };
    common::eventually(10, "the claim to wait for the appender", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    })
    .await;
    sqlx::query("INSERT INTO gd_queue_pauses (queue) VALUES ('q')")
        .execute(pool)
        .await
        .unwrap();
    // The appender's entry, committed after the pause.
    let late: i64 = sqlx::query_scalar(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
         VALUES ('F', 1, 's', '{}', 'q') RETURNING id",
    )
    .fetch_one(&mut *appender)
    .await
    .unwrap();
    sqlx::query("SELECT gd_append(ARRAY[$1::int8], NULL)")
        .bind(late)
        .execute(&mut *appender)
        .await
        .unwrap();
    appender.commit().await.unwrap();
    assert_eq!(
        claiming.await.unwrap(),
        Vec::<i64>::new(),
        "a paused queue gives nothing, even to a claim that began before the pause"
    );
    db.close().await;
}

#[tokio::test]
async fn a_row_due_later_waits_apart_until_a_claim_of_its_queue_once_it_is_due() {
    let db = TestDb::new().await;
    let pool = db.pool();
    // Appended at its insert's commit (`gd_instances_enqueue`): not due, so set apart.
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, eligible_at)
         VALUES ('F', 1, 's', '{}', 'q', now() + interval '1 hour') RETURNING id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let due: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_due WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(due, 1);
    assert!(claim(pool, "n1", 10).await.is_empty(), "not due");
    let later = "SELECT lane, batch FROM gd_advance('q', '{F}', 10, 'n1', 30000, now() + interval '2 hours')";
    let rows = sqlx::query(later).fetch_all(pool).await.unwrap();
    let batches: Vec<i64> = rows
        .iter()
        .flat_map(|r| [r.get::<i32, _>("lane") as i64, r.get::<i64, _>("batch")])
        .collect();
    let got: Vec<i64> = read(pool, &batches)
        .await
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(got, [id], "due two hours later");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_due")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    db.close().await;
}

#[tokio::test]
async fn a_row_at_a_version_the_node_cannot_run_is_given_back_for_another_node() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let ids = ready(pool, 2, 0).await;
    sqlx::query("UPDATE gd_instances SET fsm_version = 2 WHERE id = $1")
        .bind(ids[1])
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(claim(pool, "n1", 10).await, [ids[0]], "v2 is not run here");
    let (fence, due): (Option<i64>, i64) = sqlx::query_as(
        "SELECT ready_seq, (SELECT count(*) FROM gd_due WHERE id = $1)
           FROM gd_instances WHERE id = $1",
    )
    .bind(ids[1])
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (fence, due),
        (None, 1),
        "off the log, due again in a moment"
    );
    db.close().await;
}

#[tokio::test]
async fn an_expired_batch_gives_its_rows_back_with_a_new_fence_and_fails_them_at_max_reaps() {
    let db = TestDb::new().await;
    let pool = db.pool();
    let ids = ready(pool, 3, 0).await;
    sqlx::query("UPDATE gd_instances SET max_reaps = 2 WHERE id = $1")
        .bind(ids[2])
        .execute(pool)
        .await
        .unwrap();
    let batches = advance(pool, "n1", 10).await;
    let first = read(pool, &batches).await;
    // Row 0's step committed meanwhile: its fence moved on (its outcome's own write).
    sqlx::query("UPDATE gd_instances SET ready_seq = NULL, status = 'done' WHERE id = $1")
        .bind(ids[0])
        .execute(pool)
        .await
        .unwrap();
    let reap = "SELECT id, failed FROM gd_reap_batches(10, now() + interval '1 minute', 30000)";
    let reaped: Vec<(i64, bool)> = sqlx::query_as(reap).fetch_all(pool).await.unwrap();
    assert_eq!(reaped, [(ids[1], false), (ids[2], false)]);
    let batches_left: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_batches")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(batches_left, 0);
    let second = read(pool, &advance(pool, "n2", 10).await).await;
    assert_eq!(second.iter().map(|r| r.0).collect::<Vec<_>>(), ids[1..]);
    for (id, epoch) in &second {
        let before = first.iter().find(|r| r.0 == *id).unwrap().1;
        assert!(
            *epoch > before,
            "row {id} has a new fence: {before} → {epoch}"
        );
    }
    let (attempt, reaps): (i32, i32) =
        sqlx::query_as("SELECT attempt, reaps FROM gd_instances WHERE id = $1")
            .bind(ids[1])
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((attempt, reaps), (1, 1));
    let reaped: Vec<(i64, bool)> = sqlx::query_as(reap).fetch_all(pool).await.unwrap();
    assert_eq!(
        reaped,
        [(ids[1], false), (ids[2], true)],
        "row 2 at max_reaps = 2"
    );
    let (status, error): (String, String) =
        sqlx::query_as("SELECT status::text, last_error FROM gd_instances WHERE id = $1")
            .bind(ids[2])
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(status, "failed");
    assert!(error.contains("lease lost 2 times"), "{error}");
    db.close().await;
}

/// The watermark: appenders that hold their transactions open a while and commit or roll
/// back at random, while two claimers take ranges as fast as they can. Every committed
/// row is claimed exactly once and no rolled-back row is claimed. A claim that passed an
/// entry whose transaction was still running would never deliver it (the cursor is past
/// it): without the tick's lock this test loses rows.
#[tokio::test]
async fn no_entry_is_lost_or_claimed_twice_while_appenders_commit_and_roll_back() {
    let db = TestDb::with_pool_size(8).await;
    let pool = db.pool().clone();
    let appending = Arc::new(AtomicBool::new(true));
    let mut appenders = Vec::new();
    for a in 0..4 {
        let pool = pool.clone();
        appenders.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for _ in 0..60 {
                let mut tx = pool.begin().await.unwrap();
                let ids: Vec<i64> = sqlx::query_scalar(
                    "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
                     SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 1 + $1 % 3)
                     RETURNING id",
                )
                .bind(a)
                .fetch_all(&mut *tx)
                .await
                .unwrap();
                sqlx::query("SELECT gd_append($1, NULL)")
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                // The transaction stays open a moment after its seqs are taken.
                let keep: bool =
                    sqlx::query_scalar("SELECT random() < 0.75 FROM pg_sleep(random() * 0.004)")
                        .fetch_one(&mut *tx)
                        .await
                        .unwrap();
                if keep {
                    tx.commit().await.unwrap();
                    committed.extend(ids);
                } else {
                    tx.rollback().await.unwrap();
                }
            }
            committed
        }));
    }
    let mut claimers = Vec::new();
    for c in 0..2 {
        let pool = pool.clone();
        let appending = appending.clone();
        claimers.push(tokio::spawn(async move {
            let node = format!("n{c}");
            let mut claimed = Vec::new();
            loop {
                let done = !appending.load(Ordering::SeqCst);
                let got = claim(&pool, &node, 7).await;
                if got.is_empty() && done {
                    return claimed;
                }
                claimed.extend(got);
            }
        }));
    }
    let mut committed = BTreeSet::new();
    for a in appenders {
        committed.extend(a.await.unwrap());
    }
    appending.store(false, Ordering::SeqCst);
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for c in claimers {
        for id in c.await.unwrap() {
            *times.entry(id).or_default() += 1;
        }
    }
    // What the claimers left (a claimer may stop between two ranges of a drain).
    loop {
        let got = claim(&pool, "n9", 1000).await;
        if got.is_empty() {
            break;
        }
        for id in got {
            *times.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "claimed more than once: {twice:?}");
    let claimed: BTreeSet<i64> = times.keys().copied().collect();
    let lost: Vec<_> = committed.difference(&claimed).collect();
    assert!(
        lost.is_empty(),
        "{} committed rows never claimed: {lost:?}",
        lost.len()
    );
    let phantom: Vec<_> = claimed.difference(&committed).collect();
    assert!(phantom.is_empty(), "rolled back yet claimed: {phantom:?}");
    assert!(
        committed.len() > 100,
        "the run appended: {}",
        committed.len()
    );
    db.close().await;
}
