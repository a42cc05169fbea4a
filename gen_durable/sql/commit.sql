-- The group commit of step outcomes (`gen_durable::store::pg::outcome`, the committer in
-- `engine/committer.rs`), and what every statement that ends rows does next.
--
-- The locking rule of every service statement: row locks with SKIP LOCKED, never waiting
-- for one. A row a caller's transaction holds (a signal sent inside a transaction that stays
-- open, an operator's cancel) is left for the next pass or, for an outcome, deferred and
-- committed a moment later. The statements that do wait (a delivery, a cancel, a retry)
-- lock in ascending id order, a parent before its children (a parent's id is always the
-- smaller), so they cannot deadlock with each other, nor with a service statement.

-- The fan-in: one element of `p_parents` per child that has just ended (`done` or `failed`),
-- holding that child's parent id. Each parent is decremented once per child, in one update,
-- and one whose count reaches zero while it awaits its children becomes runnable at once.
-- Returns the queues of the parents it woke. The caller already holds the parents' row
-- locks (taken without waiting, or in ascending id order), so this never waits.
CREATE FUNCTION gd_fan_in(p_parents int8[], p_now timestamptz) RETURNS SETOF text
LANGUAGE sql VOLATILE AS $$
    WITH d AS (
        SELECT parent_id, count(*)::int AS n FROM unnest(p_parents) AS c(parent_id)
         WHERE parent_id IS NOT NULL GROUP BY parent_id
    ), fanin AS (
        UPDATE gd_instances p
           SET children_pending = p.children_pending - d.n,
               status = CASE WHEN p.status = 'awaiting_children' AND p.children_pending = d.n
                             THEN 'runnable' ELSE p.status END,
               eligible_at = CASE WHEN p.status = 'awaiting_children' AND p.children_pending = d.n
                                  THEN p_now ELSE p.eligible_at END,
               updated_at = p_now
          FROM d
         WHERE p.id = d.parent_id
        RETURNING p.queue, p.status
    )
    SELECT DISTINCT queue FROM fanin WHERE status = 'runnable'
$$;

-- What every statement that ends rows does next, as statements of their own (each with a
-- fresh snapshot under READ COMMITTED, after the caller took the rows' locks): the fan-in
-- of their parents (`p_parents`, one element per child that ended) and the deletion of
-- their whole inboxes: a delivery that held a row until the caller locked it has
-- committed by now, and is seen.
CREATE FUNCTION gd_rows_ended(p_rows int8[], p_parents int8[], p_now timestamptz)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_parents IS NOT NULL THEN
        PERFORM pg_notify('gd_wake', q) FROM gd_fan_in(p_parents, p_now) AS q;
    END IF;
    IF p_rows IS NOT NULL THEN
        DELETE FROM gd_signals s WHERE s.target_id = ANY (p_rows);
    END IF;
END
$$;

-- The group commit: a batch of outcomes in one call, one round trip, committing by itself
-- outside a caller's transaction (`gd_commit_outcomes` below: a batch of plain rows' `done`
-- takes the lean path of `gd_commit_done`, any other this one). A function and not one statement because each statement
-- of a VOLATILE PL/pgSQL function takes a fresh snapshot under READ COMMITTED (the engine
-- runs it at READ COMMITTED whatever the database's default):
--   0. lock the batch's rows and, for outcomes that end a child, its parent (read as the
--      rows are locked), without waiting: an outcome whose row or parent someone else holds
--      is `deferred` (nothing of it is written; the engine commits it again a moment later);
--   1. apply each fenced outcome, consume the signals a progressing step received, and
--      write each outcome's history entry (history.sql). A row whose `(locked_by,
--      lease_epoch)` moved on is not touched: it is missing from `committed`, and has no
--      entry. A row cancelled while its step ran commits as `stop` "cancelled";
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
-- The history, one element per outcome (both NULL when no outcome of the batch is
-- recorded): p_history the FSM's level (NULL: off, 1: steps, 2: full, with the state the
-- step began with), p_ran_us the step's duration as its worker measured it. The entry's
-- `attempt` counts from 1; its kind is the outcome's (`replay` is `retry`,
-- `schedule_childs` is `children`, `stop` is `failed`), or `cancelled`.
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
        -- Each entry's row as statement 0 read it: `x.k`, its place in `mine`.
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, started_at, next_step,
                                node, error, signals, children, state)
        SELECT u.id, t, e.kind, was_step[x.k], was_attempt[x.k] + 1,
               t - p_ran_us[x.n] * interval '1 microsecond',
               CASE WHEN e.kind IN ('next', 'await', 'children') THEN p_steps[x.n] END,
               p_node,
               CASE WHEN e.kind = 'cancelled' THEN 'cancelled' ELSE p_errors[x.n] END,
               CASE WHEN cardinality(p_consumed) > 0 THEN
                   (SELECT array_agg(c.id ORDER BY c.id) FROM consumed c
                     WHERE c.target_id = u.id) END,
               CASE WHEN e.kind = 'children' THEN p_children[x.n] END,
               was_state[x.k]
          FROM upd u
         CROSS JOIN LATERAL (SELECT width_bucket(u.id, p_ids) AS n,
                                    width_bucket(u.id, mine) AS k) x
         CROSS JOIN LATERAL (
               SELECT CASE WHEN was_cancel[x.k] THEN 'cancelled'
                           ELSE CASE p_kinds[x.n] WHEN 'replay' THEN 'retry'
                                                  WHEN 'schedule_childs' THEN 'children'
                                                  WHEN 'stop' THEN 'failed'
                                                  ELSE p_kinds[x.n] END END AS kind) e
         WHERE p_history[x.n] IS NOT NULL
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

-- The lean commit of a batch of plain rows' `done` (the drain's every commit): one statement
-- locks the rows without waiting, fences them and writes what a `done` changes, then the
-- inbox of the rows it ended is deleted with a fresh snapshot, as `gd_rows_ended` does.
-- All or nothing: if any row is not a plain row claimed from the log by this node, has a
-- parent to count down, was cancelled while its step ran, or is held by someone else, it
-- writes nothing and returns NULL, and the general commit takes the whole batch (the locks
-- it took are this transaction's, so the general commit finds the rows as it left them).
-- The fence is each row's entry in one of this node's batches, which are read once (a few
-- rows, by node) instead of probed per row. Planned once: a custom plan per call cost as
-- much as the update.
CREATE FUNCTION gd_commit_done(
    p_node    text,
    p_ids     int8[],
    p_epochs  int8[],
    p_steps   text[],
    p_states  jsonb[],
    p_results jsonb[],
    p_errors  text[],
    p_now     timestamptz,
    p_history int2[],
    p_ran_us  int8[]
) RETURNS int8[] LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    ended int8[];
BEGIN
    WITH held AS MATERIALIZED (
        SELECT l.queue, l.fsm, l.priority, b.lo, b.hi
          FROM gd_batches b JOIN gd_lanes l ON l.lane = b.lane
         WHERE b.node = p_node
    ), mine AS MATERIALIZED (
        SELECT i.id, i.step, i.attempt,
               CASE WHEN p_history[width_bucket(i.id, p_ids)] = 2 THEN i.state END AS state
          FROM gd_instances i
         WHERE i.id = ANY (p_ids)
           AND i.locked_by IS NULL AND i.status = 'runnable'
           AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
           AND NOT i.cancel_requested AND i.parent_id IS NULL
           AND EXISTS (SELECT 1 FROM held h
                        WHERE h.queue = i.queue AND h.fsm = i.fsm AND h.priority = i.priority
                          AND h.lo <= i.ready_seq AND h.hi > i.ready_seq)
         ORDER BY i.id
           FOR NO KEY UPDATE SKIP LOCKED
    ), shut AS (
        UPDATE gd_instances i
           SET (step, state, result, last_error) = (
                   SELECT coalesce(p_steps[x.n], i.step), coalesce(p_states[x.n], i.state),
                          p_results[x.n], p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               status = 'done', awaits = '{}', await_deadline = NULL, updated_at = p_now,
               ready_seq = NULL
         WHERE i.id IN (SELECT id FROM mine)
           AND (SELECT count(*) FROM mine) = cardinality(p_ids)
        RETURNING i.id
    ), told AS (
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, started_at, node, error,
                                state)
        -- From `mine`, which holds the rows as they were: `shut` updates every one of them
        -- or none (a join of the two cost the drain 17% of its throughput).
        SELECT m.id, p_now, 'done', m.step, m.attempt + 1,
               p_now - p_ran_us[x.n] * interval '1 microsecond', p_node, p_errors[x.n], m.state
          FROM mine m
         CROSS JOIN LATERAL (SELECT width_bucket(m.id, p_ids) AS n) x
         WHERE p_history[x.n] IS NOT NULL
           AND (SELECT count(*) FROM mine) = cardinality(p_ids)
    )
    SELECT array_agg(id ORDER BY id) INTO ended FROM shut;
    IF cardinality(ended) IS DISTINCT FROM cardinality(p_ids) THEN
        RETURN NULL;
    END IF;
    DELETE FROM gd_signals s WHERE s.target_id = ANY (ended);
    RETURN ended;
END
$$;

-- The group commit the engine calls (its parameters and results: `gd_commit_general`).
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
    p_keyed        bool[],
    p_keys         text[],
    p_gates        text[],
    p_rate_limits  text[],
    p_rate_keys    text[],
    p_rate_weights float8[],
    p_history      int2[] DEFAULT NULL,
    p_ran_us       int8[] DEFAULT NULL,
    OUT committed int8[],
    OUT continued int8[],
    OUT at        timestamptz,
    OUT deferred  int8[]
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    at := coalesce(p_now, statement_timestamp());
    IF 'done' = ALL (p_kinds) AND coalesce(cardinality(p_consumed), 0) = 0 THEN
        committed := gd_commit_done(p_node, p_ids, p_epochs, p_steps, p_states, p_results,
                                    p_errors, at, p_history, p_ran_us);
        IF committed IS NOT NULL THEN
            continued := '{}';
            deferred := '{}';
            RETURN;
        END IF;
    END IF;
    SELECT f.committed, f.continued, f.at, f.deferred INTO committed, continued, at, deferred
      FROM gd_commit_general(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states, p_results,
                             p_errors, p_delays, p_awaits, p_children, p_run_ahead, p_consumed,
                             p_seen, p_notify, at, p_keyed, p_keys, p_gates, p_rate_limits,
                             p_rate_keys, p_rate_weights, p_history, p_ran_us) f;
END
$$;

-- What nodes of an earlier version call (16 arguments): the function above without
-- transition options. Kept so that a rolling deploy keeps committing.
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
) LANGUAGE sql VOLATILE AS $$
    SELECT f.committed, f.continued, f.at, f.deferred
      FROM gd_commit_outcomes(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states, p_results,
                              p_errors, p_delays, p_awaits, p_children, p_run_ahead,
                              p_consumed, p_seen, p_notify, p_now,
                              NULL, NULL, NULL, NULL, NULL, NULL) f
$$;
