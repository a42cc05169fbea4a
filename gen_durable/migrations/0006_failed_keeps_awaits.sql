-- A failed instance keeps what the step it failed in was woken for.
--
-- `stop` (a step's own, a failing `handle`'s, or the one a cancel turns any outcome into)
-- used to clear `awaits` like every progressing outcome. It now keeps them, as a cancel of
-- a parked row and the reaper's last reap already did, so that a retry can put the row back
-- where its step began: awaiting the signals it was woken by (the failure deleted its
-- inbox) rather than running that step with nothing awaited, as if its await had timed out.
-- The function is otherwise the one of migration 0005, whose comments explain it.

CREATE OR REPLACE FUNCTION gd_commit_outcomes(
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
    OUT at        timestamptz,
    OUT deferred  int8[]
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t        timestamptz := coalesce(p_now, statement_timestamp());
    mine     int8[];
    wanted   int8[];
    parents  int8[];
    ready    int8[];
    finished int8[];
    ended    int8[];
    parked   int8[];
    notified bigint;
BEGIN
    -- 0. The rows, then the parents of the rows this commit ends (a `done`, a `stop`, or
    --    any outcome of a row whose cancel was requested: it commits as `stop`). Rows are
    --    read by primary key; each finds its outcome by binary search in the sorted ids.
    SELECT coalesce(array_agg(id), '{}') INTO mine FROM (
        SELECT i.id FROM gd_instances i
         WHERE i.id = ANY (p_ids)
         ORDER BY i.id
           FOR NO KEY UPDATE SKIP LOCKED) x;
    SELECT coalesce(array_agg(DISTINCT i.parent_id), '{}') INTO wanted FROM gd_instances i
     WHERE i.id = ANY (mine) AND i.parent_id IS NOT NULL
       AND (i.cancel_requested OR p_kinds[width_bucket(i.id, p_ids)] IN ('done', 'stop'));
    IF cardinality(wanted) = 0 THEN
        ready := mine;
    ELSE
        SELECT coalesce(array_agg(id), '{}') INTO parents FROM (
            SELECT p.id FROM gd_instances p
             WHERE p.id = ANY (wanted)
             ORDER BY p.id
               FOR NO KEY UPDATE SKIP LOCKED) x;
        IF cardinality(parents) = cardinality(wanted) THEN
            ready := mine;
        ELSE
            SELECT coalesce(array_agg(i.id), '{}') INTO ready FROM gd_instances i
             WHERE i.id = ANY (mine)
               AND (i.parent_id IS NULL OR i.parent_id = ANY (parents)
                    OR NOT (i.cancel_requested
                            OR p_kinds[width_bucket(i.id, p_ids)] IN ('done', 'stop')));
        END IF;
    END IF;
    -- Deferred: still this node's, but locked by someone else (or its parent is).
    IF cardinality(ready) = cardinality(p_ids) THEN
        deferred := '{}';
    ELSE
        SELECT coalesce(array_agg(i.id), '{}') INTO deferred FROM gd_instances i
         WHERE i.id = ANY (p_ids) AND i.id <> ALL (ready)
           AND i.locked_by = p_node AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)];
    END IF;

    -- 1. Apply every fenced outcome (what each kind writes: `Step` in fsm.rs); an `await`
    --    parks here and statement 3 wakes it if its signal is in. The fence is
    --    `(locked_by, lease_epoch)`: `locked_by` is set exactly while a row is claimed, and
    --    a new claim bumps the epoch. No join between the arrays and the table (its plan
    --    would rescan the arrays per row): rows by primary key, outcomes by binary search.
    WITH upd AS (
        UPDATE gd_instances i
           SET (step, state, status, result, last_error, awaits, await_deadline,
                eligible_at, attempt, reaps, children_pending, locked_by,
                lease_expires_at, updated_at) = (
               SELECT coalesce(CASE WHEN e.kind <> 'stop' THEN p_steps[e.n] END, i.step),
                      coalesce(p_states[e.n], i.state),
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
                                  WHEN 'stop' THEN i.awaits
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
                 -- The effective outcome: `stop` "cancelled" if a cancel was requested.
                 FROM (SELECT x.n,
                              CASE WHEN i.cancel_requested THEN 'stop'
                                   ELSE p_kinds[x.n] END AS kind,
                              CASE WHEN i.cancel_requested THEN 'cancelled'
                                   ELSE p_errors[x.n] END AS err
                         FROM (SELECT width_bucket(i.id, p_ids) AS n) x) e)
         WHERE i.id = ANY (ready)
           AND i.locked_by = p_node
           AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)]
        RETURNING i.id, i.status, i.parent_id, i.queue
    ), consumed AS (
        DELETE FROM gd_signals s USING upd u
         WHERE s.id = ANY (p_consumed) AND s.target_id = u.id
        RETURNING 1
    )
    SELECT coalesce(array_agg(u.id ORDER BY u.id), '{}'),
           coalesce(array_agg(u.id) FILTER (WHERE u.status = 'executing'), '{}'),
           array_agg(u.id) FILTER (WHERE u.status IN ('done', 'failed')),
           array_agg(u.parent_id) FILTER (WHERE u.status IN ('done', 'failed')
                                            AND u.parent_id IS NOT NULL),
           array_agg(u.id) FILTER (WHERE u.status = 'awaiting_signal'),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM upd
                     WHERE status = 'runnable' AND queue = ANY (p_notify)) w)
      INTO committed, continued, finished, ended, parked, notified
      FROM upd u;

    -- 2. The parents of the rows that ended (their locks are held since statement 0),
    --    and the whole inbox of every finished row, as of now.
    PERFORM gd_rows_ended(finished, ended, t);

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
