-- gen_durable schema, part 4: the group commit of step outcomes as one function call, so a
-- batch of outcomes costs one round trip and, outside a caller's transaction, commits by
-- itself (spec §3.1, §5, §7.3; PERFORMANCE.md "Cost of one step").
--
-- Why a function and not one statement: every statement of a VOLATILE PL/pgSQL function
-- takes a fresh snapshot under READ COMMITTED. The apply (statement 1) updates and so
-- locks each row it still owns — the lease fence is in its WHERE clause, re-checked by
-- Postgres on the newest row version. Statements 2 and 3 run after those locks are held,
-- so they see every signal a delivery committed while it held the row before us (a
-- delivery locks its target row first): the inbox of a finished row is deleted whole,
-- and a parked `await` whose signal is there runs at once. A delivery that comes after
-- waits for our commit and sees the row as we left it. No wake-up is lost, no signal of
-- a finished instance is left behind, and no row is locked twice.
--
-- Parameters are parallel arrays, one element per outcome, sorted by `ids` ascending with
-- no id twice (`kinds`: next, replay, await, schedule_childs, done, stop). A row whose `(locked_by, lease_epoch)` moved on is not
-- touched: it is missing from `committed`. A row
-- cancelled while its step ran commits as `stop` "cancelled" instead of its outcome.
-- `notify`: the queues this commit may wake (the engine coalesces wake-ups).

CREATE FUNCTION gd_commit_outcomes(
    p_node      text,
    p_ids       int8[],
    p_epochs    int8[],
    p_kinds     text[],
    p_steps     text[],
    p_states    jsonb[],
    p_results   jsonb[],
    p_errors    text[],
    p_delays    int8[],
    p_awaits    text[],
    p_children  int4[],
    p_run_ahead bool[],
    p_consumed  int8[],
    p_seen      int8[],
    p_notify    text[],
    p_now       timestamptz,
    OUT committed int8[],
    OUT continued int8[],
    OUT at        timestamptz
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t        timestamptz := coalesce(p_now, now());
    finished int8[];
    parked   int8[];
    notified bigint;
BEGIN
    -- 1. Apply every fenced outcome, exactly as the table of spec §3.1 says; an `await`
    --    parks here and statement 3 wakes it if its signal is in. Consume the signals a
    --    progressing step received, decrement each finished child's parent once per
    --    child, and wake a parent whose count reaches zero.
    --
    --    There is no join between the arrays and the table: the rows are read by primary
    --    key (`id = ANY`) and each finds its outcome by binary search in the sorted ids
    --    (`width_bucket` returns how many of them are <= its id: its 1-based position).
    --    A join leaves the plan to estimates, and with `locked_by = p_node` estimated at
    --    one row Postgres rescans the arrays for every row: quadratic in the batch.
    WITH upd AS (
        UPDATE gd_instances i
           SET (step, state, status, result, last_error, awaits, await_deadline,
                eligible_at, attempt, reaps, children_pending, locked_by,
                lease_expires_at, updated_at) = (
               SELECT coalesce(CASE WHEN e.kind <> 'stop' THEN p_steps[e.n] END, i.step),
                      p_states[e.n],
                      (CASE
                           WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN 'executing'
                           WHEN e.kind IN ('next', 'replay') THEN 'runnable'
                           WHEN e.kind = 'await' THEN 'awaiting_signal'
                           WHEN e.kind = 'schedule_childs' THEN
                               CASE WHEN p_children[e.n] = 0 THEN 'runnable'
                                    ELSE 'awaiting_children' END
                           WHEN e.kind = 'done' THEN 'done'
                           ELSE 'failed' END)::gd_status,
                      CASE WHEN e.kind = 'done' THEN p_results[e.n] ELSE i.result END,
                      CASE WHEN e.err IS NOT NULL THEN e.err
                           WHEN e.kind = 'replay' THEN i.last_error END,
                      CASE e.kind WHEN 'await' THEN string_to_array(p_awaits[e.n], chr(31))
                                  WHEN 'replay' THEN i.awaits
                                  ELSE '{}' END,
                      CASE WHEN e.kind = 'await' AND p_delays[e.n] IS NOT NULL
                                THEN t + p_delays[e.n] * interval '1 millisecond'
                           WHEN e.kind = 'replay' THEN i.await_deadline END,
                      t + CASE WHEN e.kind = 'replay'
                               THEN p_delays[e.n] * interval '1 millisecond'
                               ELSE interval '0' END,
                      CASE WHEN e.kind = 'replay' THEN i.attempt + 1
                           WHEN e.kind IN ('done', 'stop') THEN i.attempt
                           ELSE 0 END,
                      CASE WHEN e.kind IN ('next', 'await', 'schedule_childs') THEN 0
                           ELSE i.reaps END,
                      CASE WHEN e.kind = 'schedule_childs' THEN p_children[e.n]
                           ELSE i.children_pending END,
                      -- Run-ahead keeps the claim: same worker, same epoch, same lease.
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN i.locked_by END,
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN i.lease_expires_at END,
                      t
                 -- The effective outcome: `stop` "cancelled" if a cancel was requested,
                 -- read from the row version being updated (the newest, under the lock).
                 FROM (SELECT x.n,
                              CASE WHEN i.cancel_requested THEN 'stop'
                                   ELSE p_kinds[x.n] END AS kind,
                              CASE WHEN i.cancel_requested THEN 'cancelled'
                                   ELSE p_errors[x.n] END AS err
                         FROM (SELECT width_bucket(i.id, p_ids) AS n) x) e)
         -- The fence. `locked_by` is set exactly while a row is claimed (`executing`):
         -- every statement that ends a claim clears it, and a new claim bumps the epoch.
         -- Not naming the status keeps the planner on the primary key: the partial
         -- lease index would read every executing row of every node.
         WHERE i.id = ANY (p_ids)
           AND i.locked_by = p_node
           AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)]
        RETURNING i.id, i.status, i.parent_id, i.queue
    ), consumed AS (
        DELETE FROM gd_signals s USING upd u
         WHERE s.id = ANY (p_consumed) AND s.target_id = u.id
        RETURNING 1
    ), fanin AS (
        UPDATE gd_instances p
           SET children_pending = p.children_pending - d.n,
               status = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - d.n = 0
                             THEN 'runnable' ELSE p.status END,
               eligible_at = CASE WHEN p.status = 'awaiting_children'
                                   AND p.children_pending - d.n = 0
                                  THEN t ELSE p.eligible_at END,
               updated_at = t
          -- Parents in id order, as every writer locks rows.
          FROM (SELECT parent_id, count(*)::int AS n FROM upd
                 WHERE status IN ('done', 'failed') AND parent_id IS NOT NULL
                 GROUP BY parent_id ORDER BY parent_id) d
         WHERE p.id = d.parent_id
        RETURNING p.queue, p.status
    ), woke AS (
        SELECT count(pg_notify('gd_wake', q)) AS n
          FROM (SELECT queue AS q FROM upd WHERE status = 'runnable' AND queue = ANY (p_notify)
                UNION SELECT queue FROM fanin WHERE status = 'runnable') w
    )
    SELECT coalesce(array_agg(u.id), '{}'),
           coalesce(array_agg(u.id) FILTER (WHERE u.status = 'executing'), '{}'),
           array_agg(u.id) FILTER (WHERE u.status IN ('done', 'failed')),
           array_agg(u.id) FILTER (WHERE u.status = 'awaiting_signal'),
           (SELECT n FROM woke)
      INTO committed, continued, finished, parked, notified
      FROM upd u;

    -- 2. The whole inbox of every finished row, as of now.
    IF finished IS NOT NULL THEN
        DELETE FROM gd_signals WHERE target_id = ANY (finished);
    END IF;

    -- 3. A parked `await` runs at once if a signal it names is in its inbox that the step
    --    did not already see in `ctx.awaited()`: a signal that arrived while the step ran
    --    is not lost, and a step that re-awaits to accumulate signals parks until a new
    --    one comes instead of spinning on the ones it has.
    IF parked IS NOT NULL THEN
        WITH woken AS (
            UPDATE gd_instances i
               SET status = 'runnable', await_deadline = NULL
             WHERE i.id = ANY (parked)
               AND EXISTS (SELECT 1 FROM gd_signals s
                            WHERE s.target_id = i.id AND s.name = ANY (i.awaits)
                              AND s.id <> ALL (p_seen))
            RETURNING i.queue
        )
        SELECT count(pg_notify('gd_wake', q)) INTO notified
          FROM (SELECT DISTINCT queue AS q FROM woken WHERE queue = ANY (p_notify)) w;
    END IF;

    at := t;
END
$$;
