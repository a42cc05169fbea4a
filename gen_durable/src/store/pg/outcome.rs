//! Committing step outcomes, many at once (group commit), fenced per row: [`commit`],
//! with [`spawn_children`] for a batch that spawns children, and [`commit_and_hand_off`]
//! for a batch whose ended rows hand their gate slots on. The functions' parameters are
//! encoded in `arrays.rs` (`Arrays`); the tests against PostgreSQL are in `tests.rs`.

mod arrays;

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{FromRow, PgConnection, Postgres, Row};

use crate::model::error::Result;
use crate::model::history::HistoryLevel;
use crate::model::insert::NewInstance;
use crate::model::step::{Outcome, StepOutput};
use crate::store::pg::claim::Claimed;
use crate::store::pg::handoff::{self, Freed, HandoffParams};
use crate::store::pg::insert::{gate_error, insert_with_parents};
use crate::store::pooler::On;
use arrays::Arrays;

/// The fence of an outcome of row `i` at epoch `$2[n]` by node `$3`, as
/// `gd_commit_outcomes` has it (commit.sql): a row claimed by itself holds its lease; a
/// plain row claimed from the log (`locked_by` NULL) is still at its entry, in a batch
/// this node holds.
macro_rules! fence {
    () => {
        "CASE WHEN i.locked_by IS NULL
            THEN i.status = 'runnable'
                 AND i.ready_seq = ($2::int8[])[width_bucket(i.id, $1::int8[])]
                 AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                              WHERE l.queue = i.queue AND l.fsm = i.fsm
                                AND l.priority = i.priority AND b.node = $3
                                AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
            ELSE i.locked_by = $3
                 AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])] END"
    };
}

/// Only for a batch that spawns children, in its own transaction, before the children
/// are inserted: lock the rows this worker still owns, without waiting, and say which
/// were cancelled. A row whose `(locked_by, lease_epoch)` moved on — reaped, released, or
/// claimed by another worker — is not returned, and none of its children are inserted:
/// that is the fence. A row someone else holds right now is not returned either; it is
/// left out of this commit and deferred. The apply that follows in the same transaction
/// fences again and finds the same rows.
///
/// Shaped like the function's update: the fence is `(locked_by, lease_epoch)` alone, or
/// for a plain row claimed from the log its entry in a batch this node holds (`fence!`),
/// (`locked_by` is set only while a row is claimed), the rows are read by primary key and
/// each epoch is found by binary search in the sorted ids — no join whose plan could
/// rescan the arrays per row, no scan of every executing row through the lease index.
pub(super) const FENCE: &str = concat!(
    r#"/* gd:fence */
WITH locked AS MATERIALIZED (
    SELECT i.id, i.cancel_requested
      FROM gd_instances i
     WHERE i.id = ANY ($1::int8[])
       AND "#,
    fence!(),
    r#"
     ORDER BY i.id
       FOR NO KEY UPDATE OF i SKIP LOCKED
)
SELECT i.id, l.id IS NOT NULL AS locked, coalesce(l.cancel_requested, false) AS cancelled
  FROM gd_instances i LEFT JOIN locked l ON l.id = i.id
 WHERE i.id = ANY ($1::int8[])
   AND "#,
    fence!(),
    "\n"
);

/// Applies a batch of outcomes in one round trip: `gd_commit_outcomes` (migration 0013)
/// locks the rows (and the parents of the rows it ends) without waiting, fences each row
/// in its update, applies the outcome table, then — with a fresh snapshot, under
/// the row locks it now holds — deletes the whole inbox of the finished rows and wakes a
/// parked `await` whose signal is already in. Why it is a function: see the migration.
const APPLY: &str = r#"/* gd:apply */
SELECT committed, continued, at, deferred
  FROM gd_commit_outcomes($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                          $17, $18, $19, $20, $21, $22, $23, $24)
"#;

/// The apply and the hand-off of the slots it frees, in one statement: see
/// [`commit_and_hand_off`]. An apply too (its first row is [`APPLY`]'s); the rows after
/// it are the claims of the hand-off, as [`handoff::HANDOFF`] returns them.
const COMMIT_HANDOFF: &str = r#"/* gd:apply */
SELECT *
  FROM gd_commit_handoff($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                         $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29,
                         $30, $31, $32)
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
    /// How much of the step its FSM's history records.
    pub(crate) history: HistoryLevel,
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
    let row = bind_history(bind_apply(sqlx::query(APPLY), node, &a, notify, now), &a)
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
        return Err(crate::model::error::Error::CommitFailed {
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
    let rows = bind_history(handoff::bind_freed(query, gated), &a)
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

/// Binds the history's arguments, after the others (`$23`, `$24` of [`APPLY`]; `$31`,
/// `$32` of [`COMMIT_HANDOFF`]).
fn bind_history<'q>(
    q: Query<'q, Postgres, PgArguments>,
    a: &'q Arrays<'q>,
) -> Query<'q, Postgres, PgArguments> {
    let history = a.history.as_ref();
    q.bind(history.map(|h| &h.0)).bind(history.map(|h| &h.1))
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

#[cfg(test)]
mod tests;
