-- The history (issue 45): an entry per step, written by the statement that commits the
-- step's outcome (the group commit, its lean path, the commit with a hand-off), and one per
-- lost lease (both reapers) and release, in `gd_history`, kept in day partitions that the
-- collector creates ahead and drops whole (`gd_history_keep`). The commit functions take
-- two more arguments (each outcome's history level and its step's duration), NULL when
-- an earlier node calls them: its steps are not recorded.

-- The history of every instance (docs/guide/history.md): one entry per outcome a step
-- committed, written by the commit in its statement (so it is exactly what committed,
-- fenced like the outcome), and one per lost lease and release. Kept by
-- its own age, in one partition per day that the collector drops whole (`gd_history_keep`):
-- no DELETE, no bloat, nothing written to the instance rows. Appended to, never updated.
--   entry       the entry's id: orders an instance's entries, and names one (a fork's origin)
--   at          when it was committed (the database's clock; the engine's manual clock in tests)
--   kind        next, retry, await, children, done, failed, cancelled (an outcome);
--               lease_lost, released (the engine)
--   step        the step that ran (for a lost lease or a release: the step that was to run)
--   attempt     the step's attempt, from 1
--   started_at  when the step began: `at` less the step's duration as its worker measured it
--   next_step   the step the outcome leads to (next, await, children)
--   node        the node whose worker ran the step (or lost its lease)
--   error       the step's error (a retry's, a stop's reason), a lost lease's account
--   signals     the signals the step consumed
--   children    how many children the step spawned
--   state       the state the step began with (level `full` only)
--   actor       who did an operator's action (to come: operator actions are not recorded yet)
CREATE SEQUENCE gd_history_entry;

CREATE TABLE gd_history (
    entry       bigint      NOT NULL DEFAULT nextval('gd_history_entry'),
    instance_id bigint      NOT NULL,
    at          timestamptz NOT NULL,
    kind        text        NOT NULL,
    step        text        NOT NULL,
    attempt     integer     NOT NULL,
    started_at  timestamptz,
    next_step   text,
    node        text,
    error       text,
    signals     int8[],
    children    integer,
    state       jsonb,
    actor       text
) PARTITION BY RANGE (at);

-- Entries the day partitions do not cover (the collector did not run ahead of them). They
-- are collected by DELETE, the only ones.
CREATE TABLE gd_history_default PARTITION OF gd_history DEFAULT;

-- An instance's entries in order (a read, a page of it, a fork's entry).
CREATE INDEX gd_history_instance ON gd_history (instance_id, entry);

-- Keeps the history's partitions: one per day (UTC) from `p_now`'s day to two days ahead,
-- and none whose whole day is older than `p_keep`; the default partition's entries older
-- than that are deleted. The collector's, once a pass. Returns the partitions it created
-- and dropped.
--
-- Engines connect as a role without DDL (docs/roles.sql): this runs as the schema's owner
-- (SECURITY DEFINER, its search path fixed), and takes from its caller only a time and an
-- interval. Anyone may call a function, so it first checks that its caller may delete the
-- history's entries (a role that may not, such as a read-only reader, may not drop them
-- by the day either). Creating a partition takes a lock that waits for no one (an attach, beside
-- the commits' inserts); dropping one needs the table to itself, so it gives up after
-- `lock_timeout` and is tried again at the next pass. A day whose entries went to the
-- default partition (the collector did not run ahead of it) gets no partition: its
-- entries stay there, and are deleted when they are old enough.
CREATE FUNCTION gd_history_keep(p_now timestamptz, p_keep interval,
                                OUT created integer, OUT dropped integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET lock_timeout = '100ms' AS $$
DECLARE
    today date := (p_now AT TIME ZONE 'UTC')::date;
    day   date;
    part  text;
    lo    timestamptz;
BEGIN
    IF NOT has_table_privilege(session_user, 'gd_history', 'DELETE') THEN
        RAISE EXCEPTION 'permission denied: role % may not delete from gd_history', session_user
              USING ERRCODE = 'insufficient_privilege';
    END IF;
    created := 0;
    dropped := 0;
    -- One keeper at a time (several nodes collect).
    IF NOT pg_try_advisory_xact_lock(1734631280) THEN
        RETURN;
    END IF;
    FOR day IN SELECT d::date FROM generate_series(today, today + 2, interval '1 day') d LOOP
        part := 'gd_history_' || to_char(day, 'YYYYMMDD');
        lo := day::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN to_regclass(part) IS NOT NULL
                   OR EXISTS (SELECT 1 FROM gd_history_default h
                               WHERE h.at >= lo AND h.at < lo + interval '1 day');
        BEGIN
            EXECUTE format('CREATE TABLE %I (LIKE gd_history INCLUDING DEFAULTS)', part);
            EXECUTE format('ALTER TABLE gd_history ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           part, lo, lo + interval '1 day');
            created := created + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    FOR part IN SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
                 WHERE h.inhparent = 'gd_history'::regclass
                   AND c.relname ~ '^gd_history_[0-9]{8}$'
                   AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= ((p_now - p_keep) AT TIME ZONE 'UTC')::date
                 ORDER BY c.relname LOOP
        BEGIN
            EXECUTE format('DROP TABLE %I', part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    DELETE FROM gd_history_default h WHERE h.at < p_now - p_keep;
END
$$;

DROP FUNCTION gd_commit_general(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[],
    int8[], text[], int4[], bool[], int8[], int8[], text[], timestamptz, bool[], text[], text[],
    text[], text[], float8[]);
DROP FUNCTION gd_commit_done(text, int8[], int8[], text[], jsonb[], jsonb[], text[], timestamptz);
DROP FUNCTION gd_commit_outcomes(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[],
    int8[], text[], int4[], bool[], int8[], int8[], text[], timestamptz, bool[], text[], text[],
    text[], text[], float8[]);
DROP FUNCTION gd_commit_handoff(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[],
    int8[], text[], int4[], bool[], int8[], int8[], text[], timestamptz, bool[], text[], text[],
    text[], text[], float8[], text[], int4[], int8, int8[], text[], text[], text[], int2[]);

CREATE FUNCTION gd_commit_general(
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
        RETURNING s.target_id, s.id
    ), was AS MATERIALIZED (
        SELECT i.id, i.step, i.attempt, i.cancel_requested,
               CASE WHEN p_history[width_bucket(i.id, p_ids)] = 2 THEN i.state END AS state
          FROM gd_instances i
         WHERE p_history IS NOT NULL AND i.id = ANY (p_ids)
    ), told AS (
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, started_at, next_step,
                                node, error, signals, children, state)
        SELECT u.id, t, e.kind, w.step, w.attempt + 1,
               t - p_ran_us[x.n] * interval '1 microsecond',
               CASE WHEN e.kind IN ('next', 'await', 'children') THEN p_steps[x.n] END,
               p_node,
               CASE WHEN e.kind = 'cancelled' THEN 'cancelled' ELSE p_errors[x.n] END,
               (SELECT array_agg(c.id ORDER BY c.id) FROM consumed c WHERE c.target_id = u.id),
               CASE WHEN e.kind = 'children' THEN p_children[x.n] END,
               w.state
          FROM upd u
          JOIN was w ON w.id = u.id
         CROSS JOIN LATERAL (SELECT width_bucket(u.id, p_ids) AS n) x
         CROSS JOIN LATERAL (
               SELECT CASE WHEN w.cancel_requested THEN 'cancelled'
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
        SELECT s.id, p_now, 'done', m.step, m.attempt + 1,
               p_now - p_ran_us[x.n] * interval '1 microsecond', p_node, p_errors[x.n], m.state
          FROM shut s
          JOIN mine m ON m.id = s.id
         CROSS JOIN LATERAL (SELECT width_bucket(s.id, p_ids) AS n) x
         WHERE p_history[x.n] IS NOT NULL
    )
    SELECT array_agg(id ORDER BY id) INTO ended FROM shut;
    IF cardinality(ended) IS DISTINCT FROM cardinality(p_ids) THEN
        RETURN NULL;
    END IF;
    DELETE FROM gd_signals s WHERE s.target_id = ANY (ended);
    RETURN ended;
END
$$;

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

CREATE FUNCTION gd_commit_handoff(
    p_node         text,
    p_ids          int8[],
    p_epochs       int8[],
    p_kinds        text[],
    p_steps        text[],
    p_states       jsonb[],
    p_results      jsonb[],
    p_errors       text[],
    p_delays       int8[],
    p_awaits       text[],
    p_children     int4[],
    p_run_ahead    bool[],
    p_consumed     int8[],
    p_seen         int8[],
    p_notify       text[],
    p_now          timestamptz,
    p_keyed        bool[],
    p_keys         text[],
    p_gates        text[],
    p_rate_limits  text[],
    p_rate_keys    text[],
    p_rate_weights float8[],
    p_names        text[],
    p_versions     int4[],
    p_lease_ms     int8,
    p_gated_ids    int8[],
    p_gated_queues text[],
    p_gated_gates  text[],
    p_gated_keys   text[],
    p_gated_slots  int2[],
    p_history      int2[] DEFAULT NULL,
    p_ran_us       int8[] DEFAULT NULL)
RETURNS TABLE (committed int8[], continued int8[], at timestamptz, deferred int8[],
    id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, queue text, gate_slot int2)
LANGUAGE plpgsql
AS $commit$
DECLARE
    a record;
    e record;
BEGIN
    SELECT o.committed, o.continued, o.at, o.deferred INTO a
      FROM gd_commit_outcomes(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states, p_results,
                              p_errors, p_delays, p_awaits, p_children, p_run_ahead,
                              p_consumed, p_seen, p_notify, p_now, p_keyed, p_keys, p_gates,
                              p_rate_limits, p_rate_keys, p_rate_weights, p_history,
                              p_ran_us) o;
    committed := a.committed;
    continued := a.continued;
    at := a.at;
    deferred := a.deferred;
    RETURN NEXT;
    committed := NULL;
    continued := NULL;
    at := NULL;
    deferred := NULL;
    SELECT array_agg(f.id) AS ids, array_agg(f.queue) AS queues, array_agg(f.gate) AS gates,
           array_agg(f.key) AS keys, array_agg(f.slot) AS slots INTO e
      FROM unnest(p_gated_ids, p_gated_queues, p_gated_gates, p_gated_keys, p_gated_slots)
           f(id, queue, gate, key, slot)
     WHERE f.id = ANY (a.committed) AND NOT f.id = ANY (a.continued);
    IF e.ids IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::int8[], NULL::int8[], NULL::timestamptz, NULL::int8[], h.*
          FROM gd_handoff(p_names, p_versions, p_node, p_lease_ms, p_now,
                          e.ids, e.queues, e.gates, e.keys, e.slots) h;
    END IF;
END
$commit$;

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
    ), was AS (
        SELECT i.id, i.locked_by FROM gd_instances i WHERE i.id = ANY (cand)
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
        RETURNING i.id, i.status, i.parent_id, i.queue, i.step, i.attempt, i.last_error
    ), told AS (
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, node, error)
        SELECT r.id, t, 'lease_lost', r.step, r.attempt, w.locked_by, r.last_error
          FROM reaped r JOIN was w ON w.id = r.id
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
        RETURNING i.id, i.status, i.parent_id, i.queue, i.step, i.attempt, i.last_error
    ), told AS (
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, node, error)
        SELECT r.id, t, 'released', r.step, r.attempt + 1, p_node,
               CASE WHEN r.status = 'failed' THEN r.last_error END
          FROM released r
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
        WITH reaped AS (
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
         WHERE i.id = ANY (got)
        RETURNING i.id, i.step, i.attempt, i.last_error
        )
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, node, error)
        SELECT r.id, t, 'lease_lost', r.step, r.attempt, g.node, r.last_error FROM reaped r;
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
