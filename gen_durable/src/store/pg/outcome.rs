//! Committing step outcomes, many at once (group commit), fenced per row (spec §3.1, §7.3).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

use crate::error::Result;
use crate::runtime::{NewInstance, Outcome, StepOutput};
use crate::store::pg::insert::insert_with_parents;
use crate::store::pg::millis;

/// Statement 1 of a commit: lock the rows this worker still owns, in id order (so two
/// committers never wait on each other in a cycle), and return them. A row whose
/// `(locked_by, lease_epoch)` moved on — reaped, released, or claimed by another worker —
/// is not returned, and nothing of its outcome is written: that is the fence. A row
/// cancelled while its step ran commits as `stop` "cancelled" instead of its outcome.
///
/// `i.id = ANY ($1)` gives the planner a primary-key condition whatever it estimates
/// for `unnest`: without it, it reads every executing row through the lease index (and
/// the apply below plans a sequential scan on tables of ~10-20k rows).
///
/// It must be its own statement: under READ COMMITTED the next statement takes a fresh
/// snapshot *after* these locks are held, so an `await` sees every signal committed by
/// a delivery that held the row before us (deliveries lock the row first too).
const FENCE: &str = r#"
SELECT i.id, i.cancel_requested
  FROM gd_instances i
  JOIN unnest($1::int8[], $2::int8[]) AS f(id, epoch) ON i.id = f.id
 WHERE i.id = ANY ($1::int8[])
   AND i.locked_by = $3 AND i.lease_epoch = f.epoch AND i.status = 'executing'
 ORDER BY i.id
   FOR NO KEY UPDATE OF i
"#;

/// Statement 2: apply every fenced outcome from parallel arrays, exactly as the table of
/// §3.1 says. A `next` with run-ahead (`$13`) stays `executing` under the same claim, so
/// the worker runs the next step without a re-pick; it is committed all the same. An `await` commits as `runnable` at once if a matching signal is in the
/// inbox that the step did not already see in `ctx.awaited()` (`$12`): a signal that
/// arrived while the step ran is not lost, and a step that re-awaits to accumulate
/// signals parks until a new one comes instead of spinning on the ones it has; delete consumed signals by id and the whole inbox of finished rows;
/// decrement each finished child's parent once per child and wake a parent whose count
/// reaches zero; one NOTIFY per queue that got runnable work: always for a woken parent,
/// and for the steps' own queues among `$14` (coalesced by the engine's notifier).
const APPLY: &str = concat!(
    r#"
WITH o AS (
    SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[],
                         $6::text[], $7::int8[], $8::text[], $9::int4[], $13::bool[])
           AS o(id, kind, step, state, result, error, delay_ms, awaits, children, run_ahead)
), upd AS (
    UPDATE gd_instances i
       SET step = coalesce(o.step, i.step),
           state = o.state,
           status = (CASE
               WHEN o.kind = 'next' AND o.run_ahead THEN 'executing'
               WHEN o.kind IN ('next', 'replay') THEN 'runnable'
               WHEN o.kind = 'await' THEN
                   CASE WHEN EXISTS (SELECT 1 FROM gd_signals s
                                      WHERE s.target_id = i.id
                                        AND s.name = ANY (string_to_array(o.awaits, chr(31)))
                                        AND s.id <> ALL ($12::int8[]))
                        THEN 'runnable' ELSE 'awaiting_signal' END
               WHEN o.kind = 'schedule_childs' THEN
                   CASE WHEN o.children = 0 THEN 'runnable' ELSE 'awaiting_children' END
               WHEN o.kind = 'done' THEN 'done'
               ELSE 'failed' END)::gd_status,
           result = CASE WHEN o.kind = 'done' THEN o.result ELSE i.result END,
           last_error = CASE WHEN o.error IS NOT NULL THEN o.error
                             WHEN o.kind = 'replay' THEN i.last_error END,
           awaits = CASE o.kind WHEN 'await' THEN string_to_array(o.awaits, chr(31))
                                WHEN 'replay' THEN i.awaits
                                ELSE '{}' END,
           await_deadline = CASE WHEN o.kind = 'await' AND o.delay_ms IS NOT NULL
                                 THEN coalesce($11, now()) + o.delay_ms * interval '1 millisecond'
                                 WHEN o.kind = 'replay' THEN i.await_deadline END,
           eligible_at = coalesce($11, now())
                         + CASE WHEN o.kind = 'replay' THEN o.delay_ms * interval '1 millisecond'
                                ELSE interval '0' END,
           attempt = CASE WHEN o.kind = 'replay' THEN i.attempt + 1
                          WHEN o.kind IN ('done', 'stop') THEN i.attempt
                          ELSE 0 END,
           reaps = CASE WHEN o.kind IN ('next', 'await', 'schedule_childs') THEN 0 ELSE i.reaps END,
           children_pending = CASE WHEN o.kind = 'schedule_childs' THEN o.children
                                   ELSE i.children_pending END,
           -- Run-ahead keeps the claim: same worker, same epoch, same lease.
           locked_by = CASE WHEN o.kind = 'next' AND o.run_ahead THEN i.locked_by END,
           lease_expires_at = CASE WHEN o.kind = 'next' AND o.run_ahead THEN i.lease_expires_at END,
           updated_at = coalesce($11, now())
      FROM o
     WHERE i.id = o.id AND i.id = ANY ($1::int8[])
    RETURNING i.id, i.status, i.parent_id, i.queue
), consumed AS (
    DELETE FROM gd_signals s WHERE s.id = ANY ($10::int8[]) RETURNING 1
), inbox AS (
    DELETE FROM gd_signals s USING upd u
     WHERE s.target_id = u.id AND u.status IN ('done', 'failed') RETURNING 1
), "#,
    fan_in!("upd", "$11", ""),
    r#"
SELECT (SELECT count(pg_notify('gd_wake', q))
          FROM (SELECT queue AS q FROM upd WHERE status = 'runnable' AND queue = ANY ($14::text[])
                UNION SELECT queue FROM fanin WHERE status = 'runnable') w) AS notified,
       (SELECT count(*) FROM consumed) + (SELECT count(*) FROM inbox) AS deleted,
       (SELECT coalesce(array_agg(id), '{}') FROM upd WHERE status = 'executing') AS continued,
       coalesce($11, now()) AS now
"#
);

/// The outcome to apply: the step's own, or `stop` "cancelled" if the instance was
/// cancelled while the step ran.
fn effective<'x>(c: &'x Commit<'_>, cancelled: &HashSet<i64>, stop: &'x Outcome) -> &'x Outcome {
    if cancelled.contains(&c.id) {
        stop
    } else {
        &c.output.outcome
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
}

/// What a commit did.
#[derive(Debug, Default)]
pub(crate) struct Committed {
    /// Ids whose outcome was written; the others lost their lease and changed nothing.
    pub(crate) fenced: HashSet<i64>,
    /// Of those, ids committed with run-ahead: still claimed by this worker.
    pub(crate) continued: HashSet<i64>,
    /// The clock's time at commit.
    pub(crate) now: Option<DateTime<Utc>>,
}

/// Commits `batch` inside the caller's transaction (`conn` must be in one).
/// Always a constant number of statements: two, plus one insert when children are spawned.
pub(crate) async fn commit(
    conn: &mut PgConnection,
    node: &str,
    batch: &[Commit<'_>],
    notify: &[String],
    now: Option<DateTime<Utc>>,
) -> Result<Committed> {
    let ids: Vec<i64> = batch.iter().map(|c| c.id).collect();
    let epochs: Vec<i64> = batch.iter().map(|c| c.epoch).collect();
    let rows: Vec<(i64, bool)> = sqlx::query_as(FENCE)
        .bind(&ids)
        .bind(&epochs)
        .bind(node)
        .fetch_all(&mut *conn)
        .await?;
    let fenced: HashSet<i64> = rows.iter().map(|(id, _)| *id).collect();
    let cancelled: HashSet<i64> = rows.iter().filter(|(_, c)| *c).map(|(id, _)| *id).collect();
    let cancel_stop = Outcome::Stop {
        reason: "cancelled".to_string(),
    };
    let live: Vec<&Commit<'_>> = batch.iter().filter(|c| fenced.contains(&c.id)).collect();
    if live.is_empty() {
        return Ok(Committed {
            fenced,
            ..Committed::default()
        });
    }

    // Children first, so each parent's counter is what was actually inserted.
    let mut rows: Vec<NewInstance> = Vec::new();
    let mut parents: Vec<Option<i64>> = Vec::new();
    let outcome_of = |c| effective(c, &cancelled, &cancel_stop);
    for c in &live {
        if let Outcome::ScheduleChilds { children, .. } = outcome_of(c) {
            rows.extend(children.iter().cloned());
            parents.extend(std::iter::repeat_n(Some(c.id), children.len()));
        }
    }
    let mut spawned: HashMap<i64, i32> = HashMap::new();
    if !rows.is_empty() {
        let queues: Vec<String> = {
            let mut q: Vec<String> = rows.iter().map(|r| r.queue.clone()).collect();
            q.sort();
            q.dedup();
            q
        };
        let (_, inserted_parents) =
            insert_with_parents(&mut *conn, &rows, &parents, &queues, now).await?;
        for p in inserted_parents.into_iter().flatten() {
            *spawned.entry(p).or_default() += 1;
        }
    }

    let n = live.len();
    let mut a_id = Vec::with_capacity(n);
    let mut a_kind = Vec::with_capacity(n);
    let mut a_step: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut a_state = Vec::with_capacity(n);
    let mut a_result: Vec<Option<&Value>> = Vec::with_capacity(n);
    let mut a_error: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut a_delay: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut a_awaits: Vec<Option<String>> = Vec::with_capacity(n);
    let mut a_children: Vec<i32> = Vec::with_capacity(n);
    let mut a_run_ahead: Vec<bool> = Vec::with_capacity(n);
    let mut consumed: Vec<i64> = Vec::new();
    let mut seen: Vec<i64> = Vec::new();
    for c in &live {
        let out = c.output;
        let outcome = outcome_of(c);
        a_id.push(c.id);
        a_kind.push(outcome.kind());
        a_state.push(&out.state);
        a_error.push(match outcome {
            Outcome::Stop { reason } => Some(reason.as_str()),
            _ => out.error.as_deref(),
        });
        a_children.push(spawned.get(&c.id).copied().unwrap_or(0));
        a_run_ahead.push(c.run_ahead && matches!(outcome, Outcome::Next { .. }));
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
            Outcome::ScheduleChilds { step, .. } => (Some(*step), None, None, None),
            Outcome::Done { result } => (None, Some(result), None, None),
            Outcome::Stop { .. } => (None, None, None, None),
        };
        a_step.push(step);
        a_result.push(result);
        a_delay.push(delay);
        a_awaits.push(awaits);
        match outcome {
            Outcome::Next { .. } | Outcome::ScheduleChilds { .. } => {
                consumed.extend_from_slice(&out.awaited)
            }
            Outcome::Await { .. } => seen.extend_from_slice(&out.awaited),
            _ => {}
        }
    }
    let (_, _, continued, db_now): (i64, i64, Vec<i64>, DateTime<Utc>) = sqlx::query_as(APPLY)
        .bind(a_id)
        .bind(a_kind)
        .bind(a_step)
        .bind(a_state)
        .bind(a_result)
        .bind(a_error)
        .bind(a_delay)
        .bind(a_awaits)
        .bind(a_children)
        .bind(consumed)
        .bind(now)
        .bind(seen)
        .bind(a_run_ahead)
        .bind(notify)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Committed {
        fenced,
        continued: continued.into_iter().collect(),
        now: Some(db_now),
    })
}
