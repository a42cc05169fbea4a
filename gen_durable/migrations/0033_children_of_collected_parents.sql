-- A child whose parent is gone (collected after the retention, e.g. a cancelled parent
-- whose flagged child still ran) ends like any other row. The four writers that end rows
-- lock the parents of the rows they end and skipped a row whose parent they had not
-- locked: a parent that no longer exists was never locked, so the child's commit was
-- deferred until it failed and its reap never happened. A parent that is gone now
-- counts as held.

-- The group commit: a batch of outcomes in one call, one round trip, committing by itself
-- outside a caller's transaction. A function and not one statement because each statement
-- of a VOLATILE PL/pgSQL function takes a fresh snapshot under READ COMMITTED (the engine
-- runs it at READ COMMITTED whatever the database's default):
--   0. lock the batch's rows and, for outcomes that end a child, its parent (read as the
--      rows are locked), without waiting: an outcome whose row or parent someone else holds
--      is `deferred` (nothing of it is written; the engine commits it again a moment later);
--   1. apply each fenced outcome and consume the signals a progressing step received. A row
--      whose `(locked_by, lease_epoch)` moved on is not touched: it is missing from
--      `committed`. A row cancelled while its step ran commits as `stop` "cancelled";
--   2. decrement the parents of the rows that ended and delete the whole inbox of every
--      finished row (`gd_rows_ended`);
--   3. wake a parked `await` whose signal is in.
-- Statements 2 and 3 run after the apply holds the rows' locks, so they see every signal a
-- delivery committed while it held the row before (a delivery locks its target first): the
-- inbox of a finished row is deleted whole, and a parked `await` whose signal is there runs
-- at once. A delivery that comes after waits for this commit. No wake-up is lost.
--
-- Parameters are parallel arrays, one element per outcome, sorted by `ids` ascending with
-- no id twice (`kinds`: next, replay, await, schedule_childs, done, stop; a NULL state keeps
-- the stored one). `notify`: the queues this commit may wake (the engine coalesces
-- wake-ups). The time is the statement's start, not the transaction's: inside a step's own
-- transaction that began long ago, an await timeout or a replay delay counts from the
-- commit. A `stop` keeps `awaits`, so a retry parks the row again where its step began.
--
-- Transition options, one element per outcome (the arrays may all be NULL when no outcome
-- of the batch has any: every transition then keeps its key and clears its limit):
--   p_keyed        the transition sets the key: `partition_key` := p_keys, `gate` :=
--                  p_gates (both NULL: released); false or NULL keeps the key.
--   p_rate_limits  the rate limit of the step the outcome leads to, with p_rate_keys and
--                  p_rate_weights; NULL: that step is not limited. Every transition (`next`,
--                  `await`, `schedule_childs`) sets the row's limit anew and points
--                  `rate_step` at its target; `replay`, `done` and `stop` keep it. A weight
--                  above the burst is negated by `gd_rate_weight` and fails the row's check,
--                  an undeclared gate or limit fails its reference trigger: the committer
--                  then isolates that outcome and stops the instance with the refusal.
--
-- Plans: the rows are read by primary key only (`id = ANY`), never through the partial
-- index of children by parent, which the planner read whole where the statistics said no
-- row had a parent. The commonest outcome of a workflow, a `next` that runs ahead (keeps
-- its claim and moves no key nor limit), unless a cancel was requested, is written by its
-- own `UPDATE` of the few columns it changes (`quick`), in the same statement as the
-- general one: its ~21 per-column `CASE`s were a third of the apply. The two sets are
-- disjoint, since statement 0 locked the rows and read their cancel flag. A run-ahead
-- `next` of a paused queue is committed as a plain `next`: the row goes back to its queue
-- (RELIABILITY.md, R4-3).
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
    logged   int8[];
    closed   int8[];
    wanted   int8[];
    parents  int8[];
    ready    int8[];
    finished int8[];
    ended    int8[];
    parked   int8[];
    notified bigint;
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
    SELECT coalesce(array_agg(x.id), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how = 2 AND NOT x.log), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how IN (2, 3) AND x.log), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.done AND x.log), '{}'),
           coalesce(array_agg(DISTINCT x.parent_id)
                        FILTER (WHERE (x.cancelled OR x.how = 1) AND x.parent_id IS NOT NULL),
                    '{}')
      INTO mine, quick, logged, closed, wanted
      FROM (SELECT i.id, i.parent_id, i.cancel_requested AS cancelled,
                   how[width_bucket(i.id, p_ids)] AS how, i.locked_by IS NULL AS log,
                   p_kinds[width_bucket(i.id, p_ids)] = 'done' AS done
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
        RETURNING 1
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


-- The reaper: expired `executing` rows go back to `runnable` with `attempt + 1`, or fail
-- once `reaps` reaches `max_reaps` (or a cancel was requested). Locks without waiting: a
-- row someone holds, or a failing row whose parent someone holds, is left for the next
-- pass. The inbox of the rows it fails is deleted in a later statement (`gd_rows_ended`),
-- with a fresh snapshot, so a signal delivered while the reaper took its locks is not left
-- behind. Returns each reaped row and whether it failed. `p_only`: reap only these ids (the
-- engine reaps row by row when a batch fails, so one row cannot stop the reaper).
--
-- A lease that ran out because the database was down is not the step's fault: a restart
-- longer than the lease TTL let every step in flight lose its lease. So a lease of a row
-- claimed before the server's start (`updated_at`, which a claim sets and a heartbeat does
-- not) that expired before `pg_postmaster_start_time() + p_lease_ms` goes back to
-- `runnable` without counting toward `reaps`; each restart spares a row at most one reap.
-- Only with the database clock (`p_now` NULL). A caller that passes no TTL (a node of an
-- earlier version; two- and three-argument calls still resolve) is spared only the leases
-- that expired before the start. Not recognised: a failover to a standby started before
-- the outage, or a backend crash the postmaster recovers from without restarting.
CREATE OR REPLACE FUNCTION gd_reap(p_limit int8, p_now timestamptz, p_only int8[] DEFAULT NULL,
                        p_lease_ms int8 DEFAULT NULL)
RETURNS TABLE (id int8, failed bool) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(p_now, statement_timestamp());
    -- The server's start ('-infinity', so that nothing is spared, with a manual clock).
    started timestamptz := CASE WHEN p_now IS NULL THEN pg_postmaster_start_time()
                                ELSE '-infinity' END;
    cand    int8[];
    spared  int8[];
    parents int8[];
    rows_   int8[];
    fails   int8[];
    ended   int8[];
    n       bigint;
BEGIN
    SELECT coalesce(array_agg(x.id), '{}') INTO cand FROM (
        SELECT i.id FROM gd_instances i
         WHERE i.status = 'executing' AND i.lease_expires_at < t
           AND (p_only IS NULL OR i.id = ANY (p_only))
         ORDER BY i.lease_expires_at
         LIMIT p_limit
           FOR NO KEY UPDATE SKIP LOCKED) x;
    IF cardinality(cand) = 0 THEN
        RETURN;
    END IF;
    -- The leases the restart took: claimed before the start, expired before start + TTL.
    SELECT coalesce(array_agg(i.id), '{}') INTO spared FROM gd_instances i
     WHERE i.id = ANY (cand) AND i.updated_at < started
       AND i.lease_expires_at < started + coalesce(p_lease_ms, 0) * interval '1 millisecond';
    -- A row fails when this reap counts (it is not spared) and reaches its limit, or when
    -- its instance was cancelled.
    SELECT coalesce(array_agg(x.id), '{}') INTO parents FROM (
        SELECT p.id FROM gd_instances p
         WHERE p.id IN (SELECT i.parent_id FROM gd_instances i
                         WHERE i.id = ANY (cand) AND i.parent_id IS NOT NULL
                           AND (i.cancel_requested
                                OR (i.id <> ALL (spared) AND i.reaps + 1 >= i.max_reaps)))
         ORDER BY p.id
           FOR NO KEY UPDATE SKIP LOCKED) x;
    -- A parent that is gone (collected) waits for nothing: it counts as held.
    parents := parents || ARRAY(SELECT DISTINCT i.parent_id FROM gd_instances i
                                 WHERE i.id = ANY (cand) AND i.parent_id IS NOT NULL
                                   AND NOT EXISTS (SELECT 1 FROM gd_instances p
                                                    WHERE p.id = i.parent_id));
    WITH counted AS (
        SELECT c.id, c.id <> ALL (spared) AS counts FROM unnest(cand) AS c(id)
    ), reaped AS (
        UPDATE gd_instances i
           SET status = (CASE WHEN i.cancel_requested OR (c.counts AND i.reaps + 1 >= i.max_reaps)
                              THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE
                   WHEN i.cancel_requested THEN 'cancelled'
                   WHEN NOT c.counts
                   THEN format('lease ran out while the database was down (started again at %s) on %s (epoch %s); retrying, not counted toward max_reaps',
                               pg_postmaster_start_time(), i.locked_by, i.lease_epoch)
                   WHEN i.reaps + 1 >= i.max_reaps
                   THEN format('lease lost %s times (max_reaps = %s): the step at %L never committed an outcome',
                               i.reaps + 1, i.max_reaps, i.step)
                   ELSE format('lease lost on %s (epoch %s); retrying', i.locked_by, i.lease_epoch) END,
               attempt = i.attempt + 1,
               reaps = i.reaps + CASE WHEN c.counts THEN 1 ELSE 0 END,
               locked_by = NULL,
               lease_expires_at = NULL,
               eligible_at = t,
               updated_at = t
          FROM counted c
         WHERE i.id = c.id
           AND i.status = 'executing'
           AND (i.parent_id IS NULL OR i.parent_id = ANY (parents)
                OR NOT (i.cancel_requested OR (c.counts AND i.reaps + 1 >= i.max_reaps)))
        RETURNING i.id, i.status, i.parent_id, i.queue
    )
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}'),
           array_agg(r.id) FILTER (WHERE r.status = 'failed'),
           array_agg(r.parent_id) FILTER (WHERE r.status = 'failed' AND r.parent_id IS NOT NULL),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM reaped WHERE status = 'runnable') w)
      INTO rows_, fails, ended, n
      FROM reaped r;
    PERFORM gd_rows_ended(fails, ended, t);
    RETURN QUERY SELECT r, r = ANY (coalesce(fails, '{}')) FROM unnest(rows_) AS r;
END
$$;


-- Gives rows back to `runnable` without counting an attempt: a draining worker's buffer, or
-- steps cancelled at the drain deadline. A plain row claimed from the log (`locked_by`
-- NULL, its epoch its entry) gets a new entry at the end of its lane, at commit
-- (`gd_instances_enqueue`, log.sql). Fenced like an outcome; a row whose instance was
-- cancelled meanwhile fails instead, as its commit would have. Locks as the reaper does: a
-- row it cannot take at once is left to its lease's expiry. Returns the released ids.
CREATE OR REPLACE FUNCTION gd_release(p_ids int8[], p_epochs int8[], p_node text, p_now timestamptz)
RETURNS SETOF int8 LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(p_now, statement_timestamp());
    mine    int8[];
    parents int8[];
    rows_   int8[];
    fails   int8[];
    ended   int8[];
    n       bigint;
BEGIN
    SELECT coalesce(array_agg(x.id), '{}') INTO mine FROM (
        SELECT i.id FROM gd_instances i
          JOIN unnest(p_ids, p_epochs) AS l(id, epoch) ON l.id = i.id
         WHERE CASE WHEN i.locked_by IS NULL
                    THEN i.status = 'runnable' AND i.ready_seq = l.epoch
                    ELSE i.lease_epoch = l.epoch AND i.locked_by = p_node
                         AND i.status = 'executing' END
         ORDER BY i.id
           FOR NO KEY UPDATE OF i SKIP LOCKED) x;
    IF cardinality(mine) = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(x.id), '{}') INTO parents FROM (
        SELECT p.id FROM gd_instances p
         WHERE p.id IN (SELECT i.parent_id FROM gd_instances i
                         WHERE i.id = ANY (mine) AND i.parent_id IS NOT NULL AND i.cancel_requested)
         ORDER BY p.id
           FOR NO KEY UPDATE SKIP LOCKED) x;
    -- A parent that is gone (collected) waits for nothing: it counts as held.
    parents := parents || ARRAY(SELECT DISTINCT i.parent_id FROM gd_instances i
                                 WHERE i.id = ANY (mine) AND i.parent_id IS NOT NULL
                                   AND NOT EXISTS (SELECT 1 FROM gd_instances p
                                                    WHERE p.id = i.parent_id));
    WITH released AS (
        UPDATE gd_instances i
           SET status = (CASE WHEN i.cancel_requested THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE i.last_error END,
               locked_by = NULL, lease_expires_at = NULL, updated_at = t, ready_seq = NULL
         WHERE i.id = ANY (mine)
           AND (i.parent_id IS NULL OR i.parent_id = ANY (parents) OR NOT i.cancel_requested)
        RETURNING i.id, i.status, i.parent_id, i.queue
    )
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}'),
           array_agg(r.id) FILTER (WHERE r.status = 'failed'),
           array_agg(r.parent_id) FILTER (WHERE r.status = 'failed' AND r.parent_id IS NOT NULL),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM released WHERE status = 'runnable') w)
      INTO rows_, fails, ended, n
      FROM released r;
    PERFORM gd_rows_ended(fails, ended, t);
    RETURN QUERY SELECT unnest(rows_);
END
$$;


-- The reaper of batches: a batch whose lease ran out gives back the rows still at their
-- entry in it. Each goes to the end of its lane with `attempt + 1` and `reaps + 1`, or
-- fails once `reaps` reaches `max_reaps` (or a cancel was requested), as `gd_reap` does
-- for a row's lease (lease.sql), a restart's leases spared likewise (a batch's id is its
-- claim's time). The row's fence moves with `ready_seq`, so the worker that held the
-- batch can commit nothing of it. A batch one of whose rows (or a failing row's parent)
-- someone holds is left whole for the next pass: its worker may be committing it.
-- Returns each row it gave back or failed.
CREATE OR REPLACE FUNCTION gd_reap_batches(p_limit int8, p_now timestamptz, p_lease_ms int8)
RETURNS TABLE (id int8, failed bool) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(p_now, statement_timestamp());
    started timestamptz := CASE WHEN p_now IS NULL THEN pg_postmaster_start_time()
                                ELSE '-infinity' END;
    g       record;
    want    int8[];
    got     int8[];
    fail    int8[];
    parents int8[];
    back    int8[] := '{}';
    fails   int8[] := '{}';
    ended   int8[] := '{}';
    counts  bool;
BEGIN
    FOR g IN SELECT b.lane, b.batch, b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
              WHERE b.expires_at < t ORDER BY b.expires_at LIMIT p_limit
                FOR UPDATE SKIP LOCKED
    LOOP
        SELECT coalesce(array_agg(r.id), '{}') INTO want FROM gd_ready r
          JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq AND i.status = 'runnable'
         WHERE r.lane = g.lane AND r.seq >= g.lo AND r.seq < g.hi;
        SELECT coalesce(array_agg(x.id), '{}') INTO got FROM (
            SELECT i.id FROM gd_instances i WHERE i.id = ANY (want)
             ORDER BY i.id FOR NO KEY UPDATE SKIP LOCKED) x;
        CONTINUE WHEN cardinality(got) < cardinality(want);
        -- As locked: still at their entry in this batch.
        SELECT coalesce(array_agg(i.id), '{}') INTO got FROM gd_instances i
         WHERE i.id = ANY (got) AND i.status = 'runnable'
           AND EXISTS (SELECT 1 FROM gd_ready r WHERE r.lane = g.lane AND r.seq = i.ready_seq
                          AND r.seq >= g.lo AND r.seq < g.hi);
        -- Not counted: a lease that ran out because the database was down.
        counts := NOT (to_timestamp(g.batch / 1000000.0) < started
                       AND g.expires_at < started + coalesce(p_lease_ms, 0) * interval '1 millisecond');
        SELECT coalesce(array_agg(i.id), '{}') INTO fail FROM gd_instances i
         WHERE i.id = ANY (got) AND (i.cancel_requested OR (counts AND i.reaps + 1 >= i.max_reaps));
        SELECT coalesce(array_agg(x.id), '{}') INTO parents FROM (
            SELECT p.id FROM gd_instances p
             WHERE p.id IN (SELECT i.parent_id FROM gd_instances i WHERE i.id = ANY (fail))
             ORDER BY p.id FOR NO KEY UPDATE SKIP LOCKED) x;
        -- A parent that is gone (collected) waits for nothing: it counts as held.
        parents := parents || ARRAY(SELECT DISTINCT i.parent_id FROM gd_instances i
                                     WHERE i.id = ANY (fail) AND i.parent_id IS NOT NULL
                                       AND NOT EXISTS (SELECT 1 FROM gd_instances p
                                                        WHERE p.id = i.parent_id));
        CONTINUE WHEN cardinality(parents) < (SELECT count(DISTINCT i.parent_id) FROM gd_instances i
                                              WHERE i.id = ANY (fail));
        UPDATE gd_instances i
           SET status = (CASE WHEN i.id = ANY (fail) THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE
                   WHEN i.cancel_requested THEN 'cancelled'
                   WHEN NOT counts
                   THEN format('lease ran out while the database was down (started again at %s) on %s (batch %s); retrying, not counted toward max_reaps',
                               pg_postmaster_start_time(), g.node, g.batch)
                   WHEN i.id = ANY (fail)
                   THEN format('lease lost %s times (max_reaps = %s): the step at %L never committed an outcome',
                               i.reaps + 1, i.max_reaps, i.step)
                   ELSE format('lease lost on %s (batch %s); retrying', g.node, g.batch) END,
               attempt = i.attempt + 1,
               reaps = i.reaps + CASE WHEN counts THEN 1 ELSE 0 END,
               ready_seq = NULL,
               eligible_at = t,
               updated_at = t
         WHERE i.id = ANY (got);
        DELETE FROM gd_batches b WHERE b.lane = g.lane AND b.batch = g.batch;
        back := back || ARRAY(SELECT x FROM unnest(got) x WHERE x <> ALL (fail));
        fails := fails || fail;
        ended := ended || ARRAY(SELECT i.parent_id FROM gd_instances i
                                 WHERE i.id = ANY (fail) AND i.parent_id IS NOT NULL);
    END LOOP;
    PERFORM pg_notify('gd_wake', q) FROM gd_append(back, p_now) q;
    PERFORM gd_rows_ended(nullif(fails, '{}'), nullif(ended, '{}'), t);
    RETURN QUERY SELECT r, r = ANY (fails) FROM unnest(back || fails) r ORDER BY r;
END
$$;

