CREATE OR REPLACE FUNCTION gd_commit_general(
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
    p_history      int2[],
    p_ran_us       int8[],
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
    logged   int8[];
    closed   int8[];
    wanted   int8[];
    parents  int8[];
    ready    int8[];
    finished int8[];
    ended    int8[];
    parked   int8[];
    notified bigint;
    -- The locked rows as they were (aligned with `mine`), for the history's entries.
    was_step    text[];
    was_attempt int4[];
    was_cancel  bool[];
    was_state   jsonb[];
BEGIN
    -- A run-ahead `next` of a queue that is paused now goes back to its queue, runnable,
    -- as a `next` without run-ahead does: a pause holds every step that has not started,
    -- the steps a claimed row runs ahead into included (R4-3). One probe of a small table
    -- while nothing is paused.
    IF EXISTS (SELECT 1 FROM gd_queue_pauses) AND true = ANY (p_run_ahead) THEN
        SELECT array_agg(f.ahead AND NOT EXISTS (
                   SELECT 1 FROM gd_instances i JOIN gd_queue_pauses qp ON qp.queue = i.queue
                    WHERE i.id = f.id) ORDER BY f.n)
          INTO p_run_ahead
          FROM unnest(p_ids, p_run_ahead) WITH ORDINALITY f(id, ahead, n);
    END IF;
    -- 0. The rows, then the parents of the rows this commit ends (a `done`, a `stop`, or
    --    any outcome of a row whose cancel was requested: it commits as `stop`). Rows are
    --    read by primary key, locked, once; each finds its outcome by binary search in the
    --    sorted ids, and there what it is: `how` by position, 1 for a `done` or a `stop`,
    --    2 for the short path of statement 1, 0 for the rest.
    SELECT array_agg(CASE WHEN f.kind IN ('done', 'stop') THEN 1
                          WHEN f.kind = 'next' AND NOT coalesce(f.keyed, false)
                               AND f.rate_limit IS NULL THEN CASE WHEN f.ahead THEN 2 ELSE 3 END
                          ELSE 0 END ORDER BY f.n)
      INTO how
      FROM unnest(p_kinds, p_run_ahead, p_keyed, p_rate_limits)
           WITH ORDINALITY f(kind, ahead, keyed, rate_limit, n);
    --    (Rows without a parent are left out by the aggregate's filter: in a WHERE,
    --    `parent_id IS NOT NULL` matched the partial index over children, which the planner
    --    chose when the statistics said no row has a parent; 0017.)
    --    The step, attempt, cancel flag and (at level full) state of each row, as the
    --    history's entries record them, are read here too: read again by the entries'
    --    statement, they cost that statement a join or a probe per row (13% of a
    --    five-step workflow's throughput).
    SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how = 2 AND NOT x.log), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how IN (2, 3) AND x.log), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.done AND x.log), '{}'),
           coalesce(array_agg(DISTINCT x.parent_id)
                        FILTER (WHERE (x.cancelled OR x.how = 1) AND x.parent_id IS NOT NULL),
                    '{}'),
           array_agg(x.step ORDER BY x.id), array_agg(x.attempt ORDER BY x.id),
           array_agg(x.cancelled ORDER BY x.id), array_agg(x.state ORDER BY x.id)
      INTO mine, quick, logged, closed, wanted, was_step, was_attempt, was_cancel, was_state
      FROM (SELECT i.id, i.parent_id, i.cancel_requested AS cancelled,
                   how[width_bucket(i.id, p_ids)] AS how, i.locked_by IS NULL AS log,
                   p_kinds[width_bucket(i.id, p_ids)] = 'done' AS done, i.step, i.attempt,
                   CASE WHEN p_history[width_bucket(i.id, p_ids)] = 2 THEN i.state END AS state
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
        -- A parent that is gone (collected) waits for nothing: it counts as held.
        parents := parents || ARRAY(SELECT w FROM unnest(wanted) w
                                     WHERE NOT EXISTS (SELECT 1 FROM gd_instances p WHERE p.id = w));
        IF cardinality(parents) = cardinality(wanted) THEN
            ready := mine;
        ELSE
            SELECT coalesce(array_agg(i.id), '{}') INTO ready FROM gd_instances i
             WHERE i.id = ANY (mine)
               AND (i.parent_id IS NULL OR i.parent_id = ANY (parents)
                    OR NOT (i.cancel_requested
                            OR p_kinds[width_bucket(i.id, p_ids)] IN ('done', 'stop')));
            closed := ARRAY(SELECT unnest(closed) INTERSECT SELECT unnest(ready));
        END IF;
    END IF;
    -- Deferred: still this node's, but locked by someone else (or its parent is).
    IF cardinality(ready) = cardinality(p_ids) THEN
        deferred := '{}';
    ELSE
        SELECT coalesce(array_agg(i.id), '{}') INTO deferred FROM gd_instances i
         WHERE i.id = ANY (p_ids) AND i.id <> ALL (ready)
           AND CASE WHEN i.locked_by IS NULL THEN i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
                    ELSE i.locked_by = p_node
                         AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)] END;
    END IF;

    -- 1. Apply every fenced outcome (what each kind writes: `Step` in fsm.rs); an `await`
    --    parks here and statement 3 wakes it if its signal is in. The fence is
    --    `(locked_by, lease_epoch)`: `locked_by` is set exactly while a row is claimed, and
    --    a new claim bumps the epoch. No join between the arrays and the table (its plan
    --    would rescan the arrays per row): rows by primary key, outcomes by binary search.
    --    A run-ahead `next` that moves no key and takes no limit (`quick`, never a row
    --    that ends) writes only what such an outcome changes; the general `UPDATE` takes
    --    the rest, a cancelled row included.
    --    A plain row claimed from the log (`locked_by` NULL) is fenced by its entry
    --    (`ready_seq`, in a batch this node holds: a batch a server crash forgot is gone,
    --    and with it the commits of the worker that ran it). Its `next` that moves no key
    --    and takes no limit (`logged`) writes only what it changes: a new entry at the end
    --    of its lane, or the same entry when it runs ahead, so its update can be HOT; the
    --    append locks of its lanes are taken first (log.sql).
    IF cardinality(logged) > 0 THEN
        PERFORM pg_advisory_xact_lock_shared(1734631276, x.lane) FROM (
            SELECT DISTINCT l.lane FROM gd_instances i
              JOIN gd_lanes l ON l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
             WHERE i.id = ANY (logged) AND NOT p_run_ahead[width_bucket(i.id, p_ids)]
             ORDER BY l.lane) x;
    END IF;
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
        RETURNING i.id, i.status, i.parent_id, i.queue, false AS ahead
    ), logd AS (
        UPDATE gd_instances i
           SET (step, state, last_error) = (
                   SELECT p_steps[x.n], coalesce(p_states[x.n], i.state), p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               awaits = '{}', await_deadline = NULL, attempt = 0, reaps = 0, updated_at = t,
               ready_seq = CASE WHEN p_run_ahead[width_bucket(i.id, p_ids)] THEN i.ready_seq
                                ELSE nextval('gd_ready_seq') END
         WHERE i.id = ANY (logged)
           AND i.locked_by IS NULL AND i.status = 'runnable'
           AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
           AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                        WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                          AND b.node = p_node AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
        RETURNING i.id, i.status, i.parent_id, i.queue, i.fsm, i.priority, i.ready_seq,
                  p_run_ahead[width_bucket(i.id, p_ids)] AS ahead
    ), shut AS (
        -- A plain row's `done` (`closed`) writes only what a `done` changes.
        UPDATE gd_instances i
           SET (step, state, result, last_error) = (
                   SELECT coalesce(p_steps[x.n], i.step), coalesce(p_states[x.n], i.state),
                          p_results[x.n], p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               status = 'done', awaits = '{}', await_deadline = NULL, updated_at = t,
               ready_seq = NULL
         WHERE i.id = ANY (closed)
           AND i.locked_by IS NULL AND i.status = 'runnable'
           AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
           AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                        WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                          AND b.node = p_node AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
        RETURNING i.id, i.status, i.parent_id, i.queue, false AS ahead
    ), appended AS (
        INSERT INTO gd_ready (lane, seq, id)
        SELECT l.lane, g.ready_seq, g.id FROM logd g
          JOIN gd_lanes l ON l.queue = g.queue AND l.fsm = g.fsm AND l.priority = g.priority
         WHERE NOT g.ahead
    ), slow AS (
        UPDATE gd_instances i
           SET (step, state, status, result, last_error, awaits, await_deadline,
                eligible_at, attempt, reaps, children_pending, locked_by,
                lease_expires_at, updated_at, partition_key, gate, rate_limit, rate_key,
                rate_weight, rate_step, rate_paid, ready_seq) = (
               SELECT coalesce(CASE WHEN e.kind <> 'stop' THEN p_steps[e.n] END, i.step),
                      coalesce(p_states[e.n], i.state),
                      (CASE
                           WHEN e.kind = 'next' AND p_run_ahead[e.n] AND i.locked_by IS NOT NULL
                           THEN 'executing'
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
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] AND i.locked_by IS NOT NULL
                           THEN i.eligible_at
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
                      CASE WHEN e.moves THEN false ELSE i.rate_paid END,
                      -- Off the log: a plain row that is ready again gets its entry at
                      -- commit (`gd_instances_enqueue`, log.sql).
                      NULL::int8
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
           AND i.id <> ALL (logged)
           AND i.id <> ALL (closed)
           AND CASE WHEN i.locked_by IS NULL
                    THEN i.status = 'runnable'
                         AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
                         AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                                     WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                                       AND b.node = p_node AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
                    ELSE i.locked_by = p_node
                         AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)] END
        RETURNING i.id, i.status, i.parent_id, i.queue, false AS ahead
    ), upd AS (
        SELECT * FROM fast UNION ALL SELECT * FROM slow UNION ALL SELECT * FROM shut
        UNION ALL SELECT g.id, g.status, g.parent_id, g.queue, g.ahead FROM logd g
    ), consumed AS (
        DELETE FROM gd_signals s USING upd u
         WHERE s.id = ANY (p_consumed) AND s.target_id = u.id
        RETURNING s.target_id, s.id
    ), told AS (
        -- Each entry's outcome and its row as statement 0 read it, joined by id to the
        -- arrays unnested once: a subscript of an array of text or jsonb walks it from its
        -- start, so per row it cost the batch's length.
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, started_at, next_step,
                                node, error, signals, children, state)
        SELECT u.id, t, e.kind, w.step, w.attempt + 1,
               t - a.ran_us * interval '1 microsecond',
               CASE WHEN e.kind IN ('next', 'await', 'children') THEN a.step END,
               p_node,
               CASE WHEN e.kind = 'cancelled' THEN 'cancelled' ELSE a.error END,
               CASE WHEN cardinality(p_consumed) > 0 THEN
                   (SELECT array_agg(c.id ORDER BY c.id) FROM consumed c
                     WHERE c.target_id = u.id) END,
               CASE WHEN e.kind = 'children' THEN a.children END,
               w.state
          FROM upd u
          JOIN unnest(p_ids, p_kinds, p_steps, p_errors, p_ran_us, p_children, p_history)
               AS a(id, kind, step, error, ran_us, children, history) ON a.id = u.id
          JOIN unnest(mine, was_step, was_attempt, was_cancel, was_state)
               AS w(id, step, attempt, cancel, state) ON w.id = u.id
         CROSS JOIN LATERAL (
               SELECT CASE WHEN w.cancel THEN 'cancelled'
                           ELSE CASE a.kind WHEN 'replay' THEN 'retry'
                                            WHEN 'schedule_childs' THEN 'children'
                                            WHEN 'stop' THEN 'failed'
                                            ELSE a.kind END END AS kind) e
         WHERE a.history IS NOT NULL
    )
    SELECT coalesce(array_agg(u.id ORDER BY u.id), '{}'),
           coalesce(array_agg(u.id) FILTER (WHERE u.status = 'executing' OR u.ahead), '{}'),
           array_agg(u.id) FILTER (WHERE u.status IN ('done', 'failed')),
           array_agg(u.parent_id) FILTER (WHERE u.status IN ('done', 'failed')
                                            AND u.parent_id IS NOT NULL),
           array_agg(u.id) FILTER (WHERE u.status = 'awaiting_signal'),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM upd
                     WHERE status = 'runnable' AND NOT ahead AND queue = ANY (p_notify)) w)
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

-- The engine as built, its commit called through the same SQL wrapper in each variant,
-- with history level steps, as the engine passes it (the bench FSMs declare no level).
ALTER FUNCTION gd_commit_outcomes(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[], int8[], text[], int4[],
    bool[], int8[], int8[], text[], timestamptz, bool[], text[], text[], text[], text[], float8[],
    int2[], int8[]) RENAME TO gd_commit_outcomes_bench;
CREATE FUNCTION gd_commit_outcomes(p_node text, p_ids int8[], p_epochs int8[], p_kinds text[], p_steps text[], p_states jsonb[],
    p_results jsonb[], p_errors text[], p_delays int8[], p_awaits text[], p_children int4[],
    p_run_ahead bool[], p_consumed int8[], p_seen int8[], p_notify text[], p_now timestamptz,
    p_keyed bool[], p_keys text[], p_gates text[], p_rate_limits text[], p_rate_keys text[],
    p_rate_weights float8[], p_history int2[] DEFAULT NULL, p_ran_us int8[] DEFAULT NULL,
    OUT committed int8[], OUT continued int8[], OUT at timestamptz, OUT deferred int8[]
) LANGUAGE sql VOLATILE AS $$
    SELECT f.committed, f.continued, f.at, f.deferred
      FROM gd_commit_outcomes_bench(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states,
               p_results, p_errors, p_delays, p_awaits, p_children, p_run_ahead, p_consumed,
               p_seen, p_notify, p_now, p_keyed, p_keys, p_gates, p_rate_limits, p_rate_keys,
               p_rate_weights, p_history, p_ran_us) f
$$;
