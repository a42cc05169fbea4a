//! Committing step outcomes, many at once (group commit), fenced per row: [`commit`],
//! with [`spawn_children`] for a batch that spawns children and [`Arrays`] for the commit
//! function's parameters.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{FromRow, PgConnection, Postgres, Row};

use crate::error::Result;
use crate::kind::OutcomeKind;
use crate::pooler::On;
use crate::runtime::{NewInstance, Outcome, StepOutput, Transition};
use crate::store::pg::claim::Claimed;
use crate::store::pg::handoff::{self, Freed, HandoffParams};
use crate::store::pg::insert::{gate_error, insert_with_parents};
use crate::store::pg::millis;

/// Only for a batch that spawns children, in its own transaction, before the children
/// are inserted: lock the rows this worker still owns, without waiting, and say which
/// were cancelled. A row whose `(locked_by, lease_epoch)` moved on — reaped, released, or
/// claimed by another worker — is not returned, and none of its children are inserted:
/// that is the fence. A row someone else holds right now is not returned either; it is
/// left out of this commit and deferred. The apply that follows in the same transaction
/// fences again and finds the same rows.
///
/// Shaped like the function's update: the fence is `(locked_by, lease_epoch)` alone
/// (`locked_by` is set only while a row is claimed), the rows are read by primary key and
/// each epoch is found by binary search in the sorted ids — no join whose plan could
/// rescan the arrays per row, no scan of every executing row through the lease index.
pub(super) const FENCE: &str = r#"/* gd:fence */
WITH locked AS MATERIALIZED (
    SELECT i.id, i.cancel_requested
      FROM gd_instances i
     WHERE i.id = ANY ($1::int8[])
       AND i.locked_by = $3
       AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])]
     ORDER BY i.id
       FOR NO KEY UPDATE OF i SKIP LOCKED
)
SELECT i.id, l.id IS NOT NULL AS locked, coalesce(l.cancel_requested, false) AS cancelled
  FROM gd_instances i LEFT JOIN locked l ON l.id = i.id
 WHERE i.id = ANY ($1::int8[])
   AND i.locked_by = $3
   AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])]
"#;

/// Applies a batch of outcomes in one round trip: `gd_commit_outcomes` (migration 0013)
/// locks the rows (and the parents of the rows it ends) without waiting, fences each row
/// in its update, applies the outcome table, then — with a fresh snapshot, under
/// the row locks it now holds — deletes the whole inbox of the finished rows and wakes a
/// parked `await` whose signal is already in. Why it is a function: see the migration.
const APPLY: &str = r#"/* gd:apply */
SELECT committed, continued, at, deferred
  FROM gd_commit_outcomes($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                          $17, $18, $19, $20, $21, $22)
"#;

/// The apply and the hand-off of the slots it frees, in one statement: see
/// [`commit_and_hand_off`]. An apply too (its first row is [`APPLY`]'s); the rows after
/// it are the claims of the hand-off, as [`handoff::HANDOFF`] returns them.
const COMMIT_HANDOFF: &str = r#"/* gd:apply */
SELECT *
  FROM gd_commit_handoff($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                         $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29,
                         $30)
"#;

/// The outcome children are inserted for: none if the instance was cancelled while the
/// step ran (it commits as `stop` "cancelled").
fn spawns<'x>(c: &'x Commit<'_>, cancelled: &HashSet<i64>) -> Option<&'x [NewInstance]> {
    match &c.output.outcome {
        Outcome::ScheduleChildren { children, .. } if !cancelled.contains(&c.id) => Some(children),
        _ => None,
    }
}

/// One outcome to commit: the row and lease it belongs to, and what the step produced.
#[derive(Debug)]
pub(crate) struct Commit<'a> {
    pub(crate) id: i64,
    pub(crate) epoch: i64,
    pub(crate) output: &'a StepOutput,
    /// Commit a `next` as run-ahead (the worker decided it will go on).
    pub(crate) run_ahead: bool,
    /// Keep the stored state instead of the output's (an outcome the database refused,
    /// committed as `stop` in its place).
    pub(crate) keep_state: bool,
}

/// What a commit did.
#[derive(Debug, Default)]
pub(crate) struct Committed {
    /// Ids whose outcome was written; the others lost their lease and changed nothing.
    pub(crate) fenced: HashSet<i64>,
    /// Of those, ids committed with run-ahead: still claimed by this worker.
    pub(crate) continued: HashSet<i64>,
    /// Ids still this worker's whose row (or parent) someone else held: nothing of their
    /// outcome was written; commit them again.
    pub(crate) deferred: HashSet<i64>,
    /// The clock's time at commit.
    pub(crate) now: Option<DateTime<Utc>>,
}

/// Whether committing `batch` needs a transaction: a batch that spawns children fences,
/// inserts them and applies in three statements. Any other batch is one statement that
/// commits by itself.
pub(crate) fn needs_transaction(batch: &[Commit<'_>]) -> bool {
    batch
        .iter()
        .any(|c| matches!(c.output.outcome, Outcome::ScheduleChildren { .. }))
}

/// The batch sorted by id, one outcome per row: both statements find each row's outcome
/// by binary search. Two outcomes of one row (a stale run's and the newer claim's) never
/// share a call: the newer epoch's is kept, the older is reported as not committed — it
/// would fail the fence anyway, and sharing the call would pool their consumed signals.
fn one_per_row<'x, 'a>(batch: &'x [Commit<'a>]) -> Vec<&'x Commit<'a>> {
    let mut sorted: Vec<&Commit<'_>> = batch.iter().collect();
    sorted.sort_unstable_by_key(|c| (c.id, std::cmp::Reverse(c.epoch)));
    sorted.dedup_by_key(|c| c.id);
    sorted
}

/// Commits `batch`: one statement, plus a fence and one insert when children are
/// spawned — then `conn` must be in a transaction (see [`needs_transaction`]).
pub(crate) async fn commit(
    mut conn: On<&mut PgConnection>,
    node: &str,
    batch: &[Commit<'_>],
    notify: &[String],
    now: Option<DateTime<Utc>>,
) -> Result<Committed> {
    let mut sorted = one_per_row(batch);
    let mut spawned = Spawned::default();
    if needs_transaction(batch) {
        spawned = spawn_children(conn.again(), node, &mut sorted, now).await?;
    }
    if sorted.is_empty() {
        return Ok(Committed {
            deferred: spawned.deferred,
            now,
            ..Committed::default()
        });
    }
    let a = Arrays::of(&sorted, &spawned.per_parent);
    let row = bind_apply(sqlx::query(APPLY), node, &a, notify, now)
        .fetch_one(conn.again())
        .await
        .map_err(gate_error)?;
    let mut done = Committed::of_row(&row)?;
    done.deferred.extend(spawned.deferred);
    Ok(done)
}

/// The group commit of a batch that ends rows of a gate key, with the hand-off of their
/// slots, in one statement that commits by itself (`gd_commit_handoff`, migration 0021):
/// the apply of [`commit`], then `gd_handoff` for the rows of `gated` the apply ended
/// (written, and not run ahead). Not for a batch that spawns children (see
/// [`needs_transaction`]). Returns what [`commit`] and [`handoff::handoff`] return.
pub(crate) async fn commit_and_hand_off(
    mut conn: On<&mut PgConnection>,
    node: &str,
    batch: &[Commit<'_>],
    notify: &[String],
    p: &HandoffParams<'_>,
    gated: &[Freed],
) -> Result<(Committed, Vec<(String, Claimed)>)> {
    if needs_transaction(batch) {
        // Its children would be left out: the caller commits it in a transaction instead.
        return Err(crate::error::Error::CommitFailed {
            id: 0,
            reason: "a batch that spawns children commits in a transaction".into(),
        });
    }
    let sorted = one_per_row(batch);
    let a = Arrays::of(&sorted, &HashMap::new());
    let query = bind_apply(sqlx::query(COMMIT_HANDOFF), node, &a, notify, p.now)
        .bind(p.names)
        .bind(p.versions)
        .bind(p.lease_ttl_ms);
    let rows = handoff::bind_freed(query, gated)
        .fetch_all(conn.again())
        .await
        .map_err(gate_error)?;
    let (first, handed) = rows.split_first().ok_or_else(|| sqlx::Error::RowNotFound)?;
    let done = Committed::of_row(first)?;
    let handed = handed
        .iter()
        .map(|r| Ok((r.try_get("queue")?, Claimed::from_row(r)?)))
        .collect::<Result<_>>()?;
    Ok((done, handed))
}

/// Binds the apply's arguments (`$1` to `$22` of [`APPLY`] and [`COMMIT_HANDOFF`]).
fn bind_apply<'q>(
    q: Query<'q, Postgres, PgArguments>,
    node: &'q str,
    a: &'q Arrays<'q>,
    notify: &'q [String],
    now: Option<DateTime<Utc>>,
) -> Query<'q, Postgres, PgArguments> {
    let moves = a.moves.as_ref();
    q.bind(node)
        .bind(&a.id)
        .bind(&a.epoch)
        .bind(&a.kind)
        .bind(&a.step)
        .bind(&a.state)
        .bind(&a.result)
        .bind(&a.error)
        .bind(&a.delay)
        .bind(&a.awaits)
        .bind(&a.children)
        .bind(&a.run_ahead)
        .bind(&a.consumed)
        .bind(&a.seen)
        .bind(notify)
        .bind(now)
        .bind(moves.map(|m| &m.keyed))
        .bind(moves.map(|m| &m.key))
        .bind(moves.map(|m| &m.gate))
        .bind(moves.map(|m| &m.rate_limit))
        .bind(moves.map(|m| &m.rate_key))
        .bind(moves.map(|m| &m.rate_weight))
}

impl Committed {
    /// The apply's row: `committed`, `continued`, `at` and `deferred`.
    fn of_row(row: &PgRow) -> Result<Self> {
        let committed: Vec<i64> = row.try_get("committed")?;
        let continued: Vec<i64> = row.try_get("continued")?;
        let deferred: Vec<i64> = row.try_get("deferred")?;
        Ok(Committed {
            fenced: committed.into_iter().collect(),
            continued: continued.into_iter().collect(),
            deferred: deferred.into_iter().collect(),
            now: Some(row.try_get("at")?),
        })
    }
}

/// What [`spawn_children`] did.
#[derive(Debug, Default)]
struct Spawned {
    /// Children inserted, per parent id: each parent's counter is what was inserted.
    per_parent: HashMap<i64, i32>,
    /// Rows still this worker's that someone else held: left out of this commit.
    deferred: HashSet<i64>,
}

/// The first two statements of a batch that spawns children, in its transaction: the
/// fence, then one insert of every child. `sorted` keeps only the rows the fence locked;
/// rows no longer this worker's are dropped (not committed), rows someone else holds are
/// deferred. Neither reaches the apply, which must not commit a `schedule_children`
/// without its children.
async fn spawn_children(
    mut conn: On<&mut PgConnection>,
    node: &str,
    sorted: &mut Vec<&Commit<'_>>,
    now: Option<DateTime<Utc>>,
) -> Result<Spawned> {
    let ids: Vec<i64> = sorted.iter().map(|c| c.id).collect();
    let epochs: Vec<i64> = sorted.iter().map(|c| c.epoch).collect();
    let rows: Vec<(i64, bool, bool)> = sqlx::query_as(FENCE)
        .bind(&ids)
        .bind(&epochs)
        .bind(node)
        .fetch_all(conn.again())
        .await?;
    let fenced: HashSet<i64> = rows.iter().filter(|r| r.1).map(|r| r.0).collect();
    let cancelled: HashSet<i64> = rows.iter().filter(|r| r.1 && r.2).map(|r| r.0).collect();
    let mut out = Spawned {
        deferred: rows.iter().filter(|r| !r.1).map(|r| r.0).collect(),
        ..Spawned::default()
    };
    sorted.retain(|c| fenced.contains(&c.id));
    let mut children: Vec<NewInstance> = Vec::new();
    let mut parents: Vec<Option<i64>> = Vec::new();
    for c in sorted.iter() {
        if let Some(kids) = spawns(c, &cancelled) {
            children.extend(kids.iter().cloned());
            parents.extend(std::iter::repeat_n(Some(c.id), kids.len()));
        }
    }
    if !children.is_empty() {
        let mut queues: Vec<String> = children.iter().map(|r| r.queue.clone()).collect();
        queues.sort();
        queues.dedup();
        let (_, inserted_parents) =
            insert_with_parents(conn.again(), &children, &parents, &queues, now).await?;
        for p in inserted_parents.into_iter().flatten() {
            *out.per_parent.entry(p).or_default() += 1;
        }
    }
    Ok(out)
}

/// The commit function's parameters: one array per column of the outcome table, in the
/// batch's id order, plus the signals consumed and the signals an `await` saw.
#[derive(Debug, Default)]
struct Arrays<'x> {
    id: Vec<i64>,
    epoch: Vec<i64>,
    kind: Vec<&'static str>,
    step: Vec<Option<&'static str>>,
    state: Vec<Option<&'x Value>>,
    result: Vec<Option<&'x Value>>,
    error: Vec<Option<&'x str>>,
    delay: Vec<Option<i64>>,
    awaits: Vec<Option<String>>,
    children: Vec<i32>,
    run_ahead: Vec<bool>,
    consumed: Vec<i64>,
    seen: Vec<i64>,
    /// The transitions' keys and limits; `None` when no outcome of the batch has any
    /// (the function then keeps every key and clears every transition's limit).
    moves: Option<Moves>,
}

/// The per-transition columns (see [`crate::runtime::Transition`]), one element per outcome.
#[derive(Debug, Default)]
struct Moves {
    keyed: Vec<bool>,
    key: Vec<Option<String>>,
    gate: Vec<Option<String>>,
    rate_limit: Vec<Option<String>>,
    rate_key: Vec<Option<String>>,
    rate_weight: Vec<Option<f64>>,
}

impl Moves {
    fn of(sorted: &[&Commit<'_>]) -> Option<Self> {
        let plain = |c: &&Commit<'_>| c.output.transition == Transition::default();
        if sorted.iter().all(plain) {
            return None;
        }
        let mut m = Moves::default();
        for c in sorted {
            let t = &c.output.transition;
            let (keyed, key, gate) = t.key_columns();
            m.keyed.push(keyed);
            m.key.push(key);
            m.gate.push(gate);
            m.rate_limit
                .push(t.rate.as_ref().map(|r| r.key.name.clone()));
            m.rate_key.push(t.rate.as_ref().map(|r| r.key.key.clone()));
            m.rate_weight.push(t.rate.as_ref().map(|r| r.weight));
        }
        Some(m)
    }
}

impl<'x> Arrays<'x> {
    fn of(sorted: &[&'x Commit<'_>], spawned: &HashMap<i64, i32>) -> Self {
        let n = sorted.len();
        let mut a = Arrays {
            id: Vec::with_capacity(n),
            epoch: Vec::with_capacity(n),
            kind: Vec::with_capacity(n),
            step: Vec::with_capacity(n),
            state: Vec::with_capacity(n),
            result: Vec::with_capacity(n),
            error: Vec::with_capacity(n),
            delay: Vec::with_capacity(n),
            awaits: Vec::with_capacity(n),
            children: Vec::with_capacity(n),
            run_ahead: Vec::with_capacity(n),
            consumed: Vec::new(),
            seen: Vec::new(),
            moves: Moves::of(sorted),
        };
        for c in sorted {
            let out: &'x StepOutput = c.output;
            let outcome = &out.outcome;
            a.id.push(c.id);
            a.epoch.push(c.epoch);
            a.kind.push(sql_kind(outcome.kind()));
            a.state.push((!c.keep_state).then_some(&out.state));
            a.error.push(match outcome {
                Outcome::Stop { reason } => Some(reason.as_str()),
                _ => out.error.as_deref(),
            });
            a.children.push(spawned.get(&c.id).copied().unwrap_or(0));
            a.run_ahead
                .push(c.run_ahead && matches!(outcome, Outcome::Next { .. }));
            let (step, result, delay, awaits) = match outcome {
                Outcome::Next { step } => (Some(*step), None, None, None),
                Outcome::Replay { delay } => (None, None, Some(millis(*delay)), None),
                Outcome::Await {
                    names,
                    step,
                    timeout,
                } => (
                    Some(*step),
                    None,
                    timeout.map(millis),
                    // Unit separator: cannot appear in a signal name worth awaiting.
                    Some(names.join("\u{1f}")),
                ),
                Outcome::ScheduleChildren { step, .. } => (Some(*step), None, None, None),
                Outcome::Done { result } => (None, Some(result), None, None),
                Outcome::Stop { .. } => (None, None, None, None),
            };
            a.step.push(step);
            a.result.push(result);
            a.delay.push(delay);
            a.awaits.push(awaits);
            match outcome {
                Outcome::Next { .. } | Outcome::ScheduleChildren { .. } => {
                    a.consumed.extend_from_slice(&out.awaited)
                }
                Outcome::Await { .. } => a.seen.extend_from_slice(&out.awaited),
                _ => {}
            }
        }
        a
    }
}

/// A kind as the commit function names it: migration 0004 predates the
/// `schedule_children` spelling, and a migration's text is fixed by its checksum.
fn sql_kind(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::ScheduleChildren => "schedule_childs",
        other => other.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_outcome_never_shares_a_call_with_the_newer_claims() {
        let out = StepOutput::stopped("x".into());
        let c = |id, epoch| Commit {
            id,
            epoch,
            output: &out,
            run_ahead: false,
            keep_state: false,
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
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
             SELECT 'F', 1, 's', '{}', 'q' FROM generate_series(1, 5000);
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
                "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
                 VALUES ('F', 1, 'a', '{}', 'q')",
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

            let out =
                |by: &str| output(Outcome::Next { step: "b" }, serde_json::json!({ "by": by }));
            let (old, new) = (out("forgotten"), out("live"));
            for (epoch, output) in [(forgotten, &old), (live, &new)] {
                let batch = [Commit {
                    id: 1,
                    epoch,
                    output,
                    run_ahead: false,
                    keep_state: false,
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
}
