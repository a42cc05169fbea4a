//! Claiming runnable rows: the pick.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{FromRow, PgExecutor, Row};

use crate::ctx::{ChildInfo, Signal};
use crate::error::Result;

/// A `FROM` item that sets `synchronous_commit` off until the end of the statement's
/// transaction: a call in the statement itself, since the `SET` clauses of the claim
/// functions would undo a `SET LOCAL` made inside them when they return, before the commit.
macro_rules! without_flush {
    () => {
        "set_config('synchronous_commit', 'off', true) AS without_flush"
    };
}

/// Claims up to `$4` runnable rows of queue `$1` in one statement, and returns each with
/// its inbox and children, so a pick is one round trip whatever its size.
///
/// The statement is the body of the function `gd_claim` (migrations 0015 and 0016; [`body`]
/// returns it), so that PostgreSQL plans it once per connection and not on every call: sent as a
/// prepared statement it was planned anew each time (its generic plan looks costly with an
/// unknown `LIMIT`), 2.4–2.7 ms of a claim. The function's `SET plan_cache_mode =
/// force_generic_plan` reuses the plan; its `SET enable_seqscan = off` keeps that plan on
/// the indexes even when it was made while the table was empty (a plan made then and kept
/// read the whole table on every claim once it had filled, until the next `ANALYZE`); its
/// `SET jit = off` (migration 0018) keeps PostgreSQL from compiling it with LLVM on every
/// call when the backlog makes its estimate large (1.8 s per claim at 1,000,000 rows).
///
/// - `picked` is MATERIALIZED: the fence that makes `LIMIT` bound the rows locked. It
///   reads the pick index `(queue, priority, eligible_at, id) WHERE status = 'runnable'`
///   in order with `queue = $1` equality and stops after `$4` entries, so a pick is
///   O(batch), not O(backlog). `FOR NO KEY UPDATE` (not `FOR UPDATE`) so that signal
///   inserts, which take `KEY SHARE` on their target through the foreign key, don't wait.
/// - Only `(fsm, fsm_version)` pairs this node has registered are claimed (`$2`, `$3`);
///   other rows stay runnable for a node that can run them.
/// - Partitions: a row whose key already has an executing row is skipped. The
///   `NOT EXISTS` stands alone (a NULL key matches no row, so it needs no `OR … IS NULL`):
///   alone it is an anti-join, planned as a probe of the partial unique index per row
///   read; inside an `OR` it was a hash of every executing row of every queue on each
///   claim. (A `LATERAL … LIMIT 1` probe instead estimates its `IS NULL` at 0.5% and
///   turns the pick into a bitmap scan and sort of the whole backlog.) Only the first row
///   per key in this batch
///   is claimed (`chosen`); the others are handed back at once, untouched (no attempt
///   burned), and listed in `contended`. Two nodes racing on one key make one claim fail on that
///   unique index; the caller retries it.
/// - Gates (migration 0011): a gated row (`gate` set; its key in `partition_key`) is
///   skipped before the `LIMIT` when its key already has K executing rows, so a full gate
///   takes no place in the batch. The full keys are one array, computed once per
///   statement (an InitPlan: one pass over the executing gated rows through their partial
///   index, empty when nothing gated runs) and tested per row read as a filter: as a join
///   against a CTE, its row estimate turned the pick into a sequential scan and sort of
///   the whole queue on a backlog of gated rows. Of the rest,
///   the first `room` rows per key (K minus its executing rows) are claimed, each into a
///   free slot below K (`free`: one row per key, its free slots as an array, ordered from
///   an offset that depends on the node, so two nodes claiming one key at once mostly
///   pick different slots; the n-th row of the key takes the n-th slot). The unique index over
///   (gate, key, slot) of executing rows is the guarantee: two claims that chose one
///   slot cannot both commit (the loser fails on it and retries, as on a K = 1 key).
///   Rows beyond the room are handed back untouched, in `contended` with their gate.
///   They are few: while a gate is declared, `head` first reads the first `$4` rows
///   without locking them, and `bound` caps the rows `picked` locks at what can be
///   claimed of them (each row without a gate, at most the room of each gate key, and
///   the rows of a full key, which `picked` skips to read as many beyond; migration
///   0016). Without it a hot key with little room had most of each claim's rows locked
///   and handed back, and locked again by the next claim. Claims of one gate take turns
///   across nodes: `gd_claim` first locks the `gd_gates` rows of the gates at the head of
///   the queue, then counts free slots in a statement of its own, whose snapshot sees
///   what the claim before it took (two nodes otherwise chose the same free slots, and
///   one failed on the slot index every time).
/// - Rate limits (migration 0012, 0031): chosen rows whose step is their limit's step,
///   or that reserved tokens (`wants`), take them from their key's bucket, reserved rows
///   first, in pick order (a running sum of weights per key). The existing buckets are
///   locked in key order (`stored`; claims, and cancels and restarts that give tokens
///   back after locking all their instances, write them, so a claim waits at most for
///   such a statement, and never in a cycle), refilled to now, and debited by the batch's total
///   (`debited`); a key's first admission mints its bucket, full minus what it took
///   (`minted`; two claims minting one key at once: the loser fails on the primary key
///   and retries whole). A row beyond the tokens there is not claimed: it reserves its
///   tokens (the bucket goes negative) and is deferred, runnable and paid, until the
///   instant they are due (`owed`, `deferred`). `next_due` is the first instant a paid
///   row of this queue is due (through `gd_instances_rate_due`), so the picker wakes then.
/// - The claim bumps `lease_epoch`: every later write of this worker is fenced by it.
/// - The claimed rows' inboxes and children are read in one pass each over the claimed
///   ids (migration 0026), grouped by row: not two subqueries per claimed row.
/// - A queue an operator paused (`gd_queue_pauses`, `Client::pause_queue`) gives nothing.
///   The `NOT EXISTS` does not reference `i`, so it is planned once per statement as an
///   InitPlan (one primary-key probe) and a one-time filter above the pick's index scan:
///   the scan is not even started for a paused queue, and is unchanged for any other.
///
/// While no gate is declared, `gd_claim` hands the claim to `gd_claim_rated` (migration
/// 0020): this statement without the gates' CTEs (`head`, `bound`, `free`, the full keys,
/// the gates' lock), leaving rows that name a gate to the next pick. Their work cost a
/// drain of rate-limited rows ~7% of its rate.
///
/// The claim commits without waiting for its WAL flush: `synchronous_commit` is off for
/// its transaction (`without_flush!`). A claim is the one write of the engine that a
/// server crash may forget without harm: the row is back as it was before it, runnable,
/// and the worker that claimed it cannot commit its outcome (the fence), so its step runs
/// again, as after a worker's crash. Every later commit of the row's outcome does wait,
/// and its flush carries the claim's WAL with it. A forgotten claim also frees its gate
/// slot and the tokens it took (RELIABILITY.md, "What a server crash may forget"). Since
/// migration 0022 an epoch is never given twice, even by a claim the crash forgot
/// (`gd_lease_epoch`).
pub(super) const CLAIM: &str = concat!(
    "/* gd:claim */ SELECT c.* FROM ",
    without_flush!(),
    ", gd_claim($1, $2, $3, $4, $5, $6, $7) c"
);

/// [`CLAIM`] without gates and rate limits, for as long as none is declared: the function
/// `gd_claim_plain`, which skips their CTEs (planned, they made a claim 5× as long to plan,
/// 2.4–2.7 ms against 0.4–0.5 ms, before the claim's plan was reused; run, they still
/// cost each claim their probes and sorts).
///
/// With no gate declared no row can name one (the references' checks, migration 0025),
/// and likewise for rate limits; the filter on both is belt and braces. Each variant says
/// in `flow` whether any gate or rate limit is declared now (two probes of tiny tables),
/// and returns its summary row when the engine should switch (this one when one is,
/// `CLAIM` when none is), so a gate declared by another process is used from the next
/// pick on. Otherwise the statement is `CLAIM`'s, whose comments explain it.
pub(super) const CLAIM_PLAIN: &str = concat!(
    "/* gd:claim */ SELECT c.* FROM ",
    without_flush!(),
    ", gd_claim_plain($1, $2, $3, $4, $5, $6, $7) c"
);

/// The migrations that define the claim's functions, oldest first: 0015 made both, 0016
/// replaced both, 0020 replaced `gd_claim` and made `gd_claim_rated`, 0026 replaced all
/// three, 0031 `gd_claim` and `gd_claim_rated`. (0022 recreated all three from their definitions with a new epoch: [`body`]
/// makes the same change in the older ones.)
const FUNCTIONS: [&str; 5] = [
    include_str!("../../../migrations/0015_claim_functions.sql"),
    include_str!("../../../migrations/0016_claim_plans.sql"),
    include_str!("../../../migrations/0020_flow_costs.sql"),
    include_str!("../../../migrations/0026_claim_inbox_in_one_pass.sql"),
    include_str!("../../../migrations/0031_reservations_and_pauses.sql"),
];

/// The statement inside claim function `function` (`gd_claim`, `gd_claim_rated` or
/// `gd_claim_plain`) as its newest migration defines it and PostgreSQL prepares it, with
/// its marker: for the plan tests and the SQL audit's probes. (`gd_claim`'s first
/// `RETURN QUERY`, the call of `gd_claim_rated`, is on one line and not taken.)
pub(crate) fn body(function: &str) -> String {
    let heads = [
        format!("CREATE FUNCTION {function}("),
        format!("CREATE OR REPLACE FUNCTION {function}("),
    ];
    let text = FUNCTIONS
        .iter()
        .rev()
        .find_map(|m| {
            heads
                .iter()
                .find_map(|h| m.find(h.as_str()).map(|at| &m[at..]))
        })
        .unwrap_or_else(|| panic!("no function {function} in the claim's migrations"));
    let start = text.find("RETURN QUERY\n").expect("its RETURN QUERY") + "RETURN QUERY\n".len();
    let end = start + text[start..].find(";\nEND").expect("its END");
    // Migration 0022 recreated each claim from its own definition with this one change.
    let body = text[start..end].replace(
        "lease_epoch = i.lease_epoch + 1,",
        "lease_epoch = gd_lease_epoch(i.lease_epoch),",
    );
    format!("/* gd:claim */\n{body}")
}

/// One claimed row with its inbox and children.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Claimed {
    pub(crate) id: i64,
    pub(crate) fsm: String,
    pub(crate) fsm_version: i32,
    pub(crate) step: String,
    pub(crate) state: Value,
    pub(crate) attempt: i32,
    pub(crate) awaits: Vec<String>,
    pub(crate) lease_epoch: i64,
    /// Its partition key (a K = 1 key, or its key within `gate`): when its step ends,
    /// the key's next row may run.
    pub(crate) partition_key: Option<String>,
    /// Its gate.
    pub(crate) gate: Option<String>,
    pub(crate) inbox: Json<Vec<Signal>>,
    pub(crate) children: Json<Vec<ChildInfo>>,
    pub(crate) now: DateTime<Utc>,
    /// The gate slot it holds, where the statement says: the hand-off does (migration
    /// 0027), the claims do not. Passed back to the hand-off of the commit that ends it.
    #[sqlx(default)]
    pub(crate) gate_slot: Option<i16>,
}

/// What one claim statement did: the rows it claimed, and what it handed back or
/// deferred.
#[derive(Debug, Default)]
pub(crate) struct Pick {
    pub(crate) rows: Vec<Claimed>,
    /// Rows this pick locked but handed back because an earlier row of the batch has the
    /// same K = 1 key, or their gate key had no free slot left.
    pub(crate) contended: Vec<Contended>,
    /// Per rate-limit key of the pick: the rows that wanted tokens and how many of them
    /// were deferred until their tokens are due.
    pub(crate) throttled: Vec<Throttled>,
    /// The earliest instant a row of this queue that waits for reserved tokens is due.
    pub(crate) next_due: Option<DateTime<Utc>>,
    /// The statement's time.
    pub(crate) now: Option<DateTime<Utc>>,
    /// Whether a gate or a rate limit is declared: the next pick's variant
    /// ([`CLAIM`] or [`CLAIM_PLAIN`]). `None` when the pick returned nothing.
    pub(crate) flow: Option<bool>,
    /// `flow` differs from the variant this pick ran: pick again at once with the other.
    pub(crate) switch: bool,
}

/// One rate-limit key of a pick.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Throttled {
    pub(crate) limit: String,
    pub(crate) key: String,
    pub(crate) wanted: usize,
    pub(crate) deferred: usize,
}

/// A row handed back by a pick because its partition was taken.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Contended {
    pub(crate) id: i64,
    pub(crate) fsm: String,
    pub(crate) partition_key: String,
    /// Its gate, when a full gate key (not a K = 1 one) turned it back.
    #[serde(default)]
    pub(crate) gate: Option<String>,
}

/// What the claim needs to know.
#[derive(Debug)]
pub(crate) struct ClaimParams<'a> {
    pub(crate) queue: &'a str,
    pub(crate) names: &'a [String],
    pub(crate) versions: &'a [i32],
    pub(crate) demand: i64,
    pub(crate) node: &'a str,
    pub(crate) lease_ttl_ms: i64,
    pub(crate) now: Option<DateTime<Utc>>,
    /// Gates or rate limits are declared (as the last pick found): the full [`CLAIM`].
    pub(crate) flow: bool,
}

/// Runs the claim. Its result has one row per claimed row — or, when it claimed none but
/// rows of the queue wait for reserved tokens, one row of NULLs — and every row carries
/// the pick's summary (an empty pick returns no row, as an idle queue's polls do).
pub(crate) async fn claim<'e>(db: impl PgExecutor<'e>, p: &ClaimParams<'_>) -> Result<Pick> {
    let statement = if p.flow { CLAIM } else { CLAIM_PLAIN };
    let rows = sqlx::query(statement)
        .bind(p.queue)
        .bind(p.names)
        .bind(p.versions)
        .bind(p.demand)
        .bind(p.node)
        .bind(p.lease_ttl_ms)
        .bind(p.now)
        .fetch_all(db)
        .await?;
    let mut pick = Pick::default();
    if let Some(first) = rows.first() {
        pick.contended = first.try_get::<Json<Vec<Contended>>, _>("contended")?.0;
        pick.throttled = first.try_get::<Json<Vec<Throttled>>, _>("throttled")?.0;
        pick.next_due = first.try_get("next_due")?;
        pick.now = Some(first.try_get("now")?);
        let flow: bool = first.try_get("flow")?;
        (pick.flow, pick.switch) = (Some(flow), flow != p.flow);
    }
    for row in &rows {
        if row.try_get::<Option<i64>, _>("id")?.is_some() {
            pick.rows.push(Claimed::from_row(row)?);
        }
    }
    Ok(pick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gen_durable_testkit::TestDb;

    /// The pause check is one probe per statement (an InitPlan under a one-time filter),
    /// not a join: the pick stays an index scan of the pick index that stops at the batch,
    /// and for a paused queue that scan never starts.
    #[tokio::test]
    async fn a_paused_queue_is_checked_once_and_the_pick_stays_an_index_scan() {
        let db = TestDb::new().await;
        let mut conn = db.pool().acquire().await.unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', CASE WHEN g % 10 = 0 THEN 'other' ELSE 'q' END
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
                paused.contains(
                    "Index Scan using gd_instances_pick on gd_instances i (never executed)"
                ),
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
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 20);
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
    /// ones each claim spent 1.8 s compiling (PERFORMANCE.md, "Claim with gated rows";
    /// migration 0018). `plan_of` explains under the functions' own settings with the
    /// threshold at 0, so a function that allowed JIT would show it on any table. (Where
    /// the server has no JIT, as `pg_jit_available()` says, this cannot fail.)
    #[tokio::test]
    async fn no_claim_is_compiled_by_jit() {
        let db = TestDb::new().await;
        let mut conn = db.pool().acquire().await.unwrap();
        sqlx::raw_sql(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 1000);
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
                    CASE WHEN g % 10 = 0 THEN 'k' || (g / 10) % 5 END
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
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 10);",
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
            .bind(None::<&str>)
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
             SELECT 'F', 1, 's', '{}', 'q', CASE WHEN g % 10 = 0 THEN 'k' || g % 100 END
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

    /// Both claims turn `synchronous_commit` off for their own transaction only: inside a
    /// transaction it is off after the claim; on a pooled connection in autocommit, the
    /// next statement finds it on again.
    #[tokio::test]
    async fn a_claim_commits_without_waiting_for_its_flush_and_leaves_the_session_as_it_was() {
        let db = TestDb::new().await;
        let mut conn = db.pool().acquire().await.unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 4)",
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

    /// A claim of `demand` rows of queue `q`, FSM `F` v1, by `node`, with a 30 s lease, at
    /// the database's now.
    fn claim_params(node: &'static str, demand: i64, flow: bool) -> ClaimParams<'static> {
        static NAMES: std::sync::LazyLock<[String; 1]> =
            std::sync::LazyLock::new(|| ["F".to_string()]);
        ClaimParams {
            queue: "q",
            names: &NAMES[..],
            versions: &[1],
            demand,
            node,
            lease_ttl_ms: 30_000,
            now: None,
            flow,
        }
    }

    /// The plan `gd_claim` reuses, as `EXPLAIN ANALYZE` of a claim of `batch` rows of
    /// queue `q`, FSM `F` v1, by node `n1`, at the database's now.
    async fn plan(conn: &mut sqlx::PgConnection, batch: i64) -> String {
        plan_of(conn, "gd_claim", batch).await
    }

    /// As [`plan`], of claim function `function`: its statement prepared and explained
    /// under the function's settings, in a transaction rolled back after (EXPLAIN ANALYZE
    /// executes the claim).
    ///
    /// The settings are the function's own, read from the catalog, on top of
    /// `jit_above_cost = 0`: a plan the function would let JIT compile shows its `JIT:`
    /// section (printed with the costs), which every plan test then sees.
    async fn plan_of(conn: &mut sqlx::PgConnection, function: &str, batch: i64) -> String {
        let mut tx = sqlx::Connection::begin(conn).await.unwrap();
        sqlx::query(
            "SELECT set_config('jit_above_cost', '0', true),
                    (SELECT count(set_config(split_part(c, '=', 1),
                                             substr(c, strpos(c, '=') + 1), true))
                       FROM pg_proc, unnest(proconfig) c
                      WHERE proname = $1)",
        )
        .bind(function)
        .execute(&mut *tx)
        .await
        .unwrap();
        let prepare = format!(
            "PREPARE explained(text, text[], int4[], int8, text, int8, timestamptz) AS {};",
            body(function)
        );
        sqlx::raw_sql(&prepare).execute(&mut *tx).await.unwrap();
        let lines: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF)
             EXECUTE explained('q', '{{F}}', '{{1}}', {batch}, 'n1', 30000, NULL)"
        ))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        sqlx::raw_sql("DEALLOCATE explained")
            .execute(&mut *conn)
            .await
            .unwrap();
        // Each node as `COSTS OFF` prints it: the estimates cut out.
        lines
            .iter()
            .map(|l| match l.find("  (cost=") {
                Some(from) => match l[from..].find(')') {
                    Some(len) => format!("{}{}", &l[..from], &l[from + len + 1..]),
                    None => l.clone(),
                },
                None => l.clone(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
