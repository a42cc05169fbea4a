-- `gd_commit_outcomes` again (0017's), with a short path for the commonest outcome of a
-- workflow of several steps: a `next` that runs ahead (the row keeps its claim and runs its
-- next step at once; `fsm.rs`).
--
-- The apply set all 21 columns of every row through one expression each, most of them a
-- `CASE` on the outcome's kind: ~6 µs per row of a PostgreSQL backend, a third of the
-- apply (PERFORMANCE.md, "What to cut", item 5). A run-ahead `next` that moves no key and
-- takes no rate limit changes only its step, its state and what a transition resets; it
-- keeps its status, its claim, its eligibility, its key and its result. Such rows, unless
-- a cancel was requested, are now written by their own `UPDATE` of those columns alone
-- (`quick`), in the same statement as the general one, which takes every other row. The
-- two sets are disjoint: the rows are locked by statement 0, which reads whether each was
-- asked to cancel, so nothing changes that between the two.
--
-- Statement 0 also reads the parents of the rows that end as it locks the rows: they were
-- read a second time, by primary key, on every commit.
--
-- Test: `outcome::tests::a_run_ahead_next_writes_what_the_general_apply_writes` (every
-- column of a row after the short path equals what the general apply wrote).

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
    p_keyed        bool[],
    p_keys         text[],
    p_gates        text[],
    p_rate_limits  text[],
    p_rate_keys    text[],
    p_rate_weights float8[],
    OUT committed int8[],
    OUT continued int8[],
    OUT at        timestamptz,
    OUT deferred  int8[]
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t        timestamptz := coalesce(p_now, statement_timestamp());
    mine     int8[];
    how      int[];
    quick    int8[];
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
    --    read by primary key, locked, once; each finds its outcome by binary search in the
    --    sorted ids, and there what it is: `how` by position, 1 for a `done` or a `stop`,
    --    2 for the short path of statement 1, 0 for the rest.
    SELECT array_agg(CASE WHEN f.kind IN ('done', 'stop') THEN 1
                          WHEN f.kind = 'next' AND f.ahead AND NOT coalesce(f.keyed, false)
                               AND f.rate_limit IS NULL THEN 2
                          ELSE 0 END ORDER BY f.n)
      INTO how
      FROM unnest(p_kinds, p_run_ahead, p_keyed, p_rate_limits)
           WITH ORDINALITY f(kind, ahead, keyed, rate_limit, n);
    --    (Rows without a parent are left out by the aggregate's filter: in a WHERE,
    --    `parent_id IS NOT NULL` matched the partial index over children, which the planner
    --    chose when the statistics said no row has a parent; 0017.)
    SELECT coalesce(array_agg(x.id), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how = 2), '{}'),
           coalesce(array_agg(DISTINCT x.parent_id)
                        FILTER (WHERE (x.cancelled OR x.how = 1) AND x.parent_id IS NOT NULL),
                    '{}')
      INTO mine, quick, wanted
      FROM (SELECT i.id, i.parent_id, i.cancel_requested AS cancelled,
                   how[width_bucket(i.id, p_ids)] AS how
              FROM gd_instances i
             WHERE i.id = ANY (p_ids)
             ORDER BY i.id
               FOR NO KEY UPDATE SKIP LOCKED) x;
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
    --    A run-ahead `next` that moves no key and takes no limit (`quick`, never a row
    --    that ends) writes only what such an outcome changes; the general `UPDATE` takes
    --    the rest, a cancelled row included.
    WITH fast AS (
        UPDATE gd_instances i
           SET (step, state, last_error) = (
                   SELECT p_steps[x.n], coalesce(p_states[x.n], i.state), p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               awaits = '{}', await_deadline = NULL, attempt = 0, reaps = 0, updated_at = t,
               rate_limit = NULL, rate_key = NULL, rate_weight = NULL, rate_step = NULL,
               rate_paid = false
         WHERE i.id = ANY (quick)
           AND i.locked_by = p_node
           AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)]
        RETURNING i.id, i.status, i.parent_id, i.queue
    ), slow AS (
        UPDATE gd_instances i
           SET (step, state, status, result, last_error, awaits, await_deadline,
                eligible_at, attempt, reaps, children_pending, locked_by,
                lease_expires_at, updated_at, partition_key, gate, rate_limit, rate_key,
                rate_weight, rate_step, rate_paid) = (
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
                      -- A row that runs ahead keeps its eligibility (it is not
                      -- runnable; a release or the reaper sets it): with `updated_at`
                      -- unindexed (migration 0014), such a step's update is HOT.
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN i.eligible_at
                           ELSE t + CASE WHEN e.kind = 'replay'
                                         THEN p_delays[e.n] * interval '1 millisecond'
                                         ELSE interval '0' END END,
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
                      t,
                      -- A transition's key and its target step's limit.
                      CASE WHEN e.moves AND p_keyed[e.n] THEN p_keys[e.n] ELSE i.partition_key END,
                      CASE WHEN e.moves AND p_keyed[e.n] THEN p_gates[e.n] ELSE i.gate END,
                      CASE WHEN e.moves THEN p_rate_limits[e.n] ELSE i.rate_limit END,
                      CASE WHEN e.moves THEN p_rate_keys[e.n] ELSE i.rate_key END,
                      CASE WHEN NOT e.moves THEN i.rate_weight
                           WHEN p_rate_limits[e.n] IS NOT NULL
                           THEN gd_rate_weight(p_rate_limits[e.n], p_rate_weights[e.n]) END,
                      CASE WHEN NOT e.moves THEN i.rate_step
                           WHEN p_rate_limits[e.n] IS NOT NULL THEN p_steps[e.n] END,
                      CASE WHEN e.moves THEN false ELSE i.rate_paid END
                 -- The effective outcome: `stop` "cancelled" if a cancel was requested.
                 FROM (SELECT x.n,
                              CASE WHEN i.cancel_requested THEN 'stop'
                                   ELSE p_kinds[x.n] END AS kind,
                              CASE WHEN i.cancel_requested THEN 'cancelled'
                                   ELSE p_errors[x.n] END AS err,
                              -- A transition: the outcome leads to a step.
                              NOT i.cancel_requested
                                  AND p_kinds[x.n] IN ('next', 'await', 'schedule_childs')
                                  AS moves
                         FROM (SELECT width_bucket(i.id, p_ids) AS n) x) e)
         WHERE i.id = ANY (ready)
           AND i.id <> ALL (quick)
           AND i.locked_by = p_node
           AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)]
        RETURNING i.id, i.status, i.parent_id, i.queue
    ), upd AS (
        SELECT * FROM fast UNION ALL SELECT * FROM slow
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
