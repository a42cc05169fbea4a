-- gen_durable schema, part 5: statements that never wait behind a caller, keep the fan-in
-- barrier exact, and cannot be stalled by one row (RELIABILITY.md, "Audit findings").
--
-- The rule every service statement follows now: it takes its row locks with SKIP LOCKED and
-- never waits for one. A row a caller's transaction holds (a signal sent inside a transaction
-- that stays open, an operator's cancel) is left for the next pass — or, for an outcome,
-- deferred and committed a moment later — instead of holding up every other row of the batch.
-- The statements that do wait (a delivery, a cancel, a retry: one caller, one instance) lock
-- their rows in ascending id order, a parent before its children (a parent's id is always the
-- smaller), so two of them cannot deadlock, and none of them can deadlock with a service
-- statement, which never waits.
--
-- The barrier: `children_pending` is the number of the row's children that are not `done` or
-- `failed`, always — also for a parent that failed (a cancel decrements it for the children it
-- fails itself) — so a retry can re-arm it exactly. `gd_fan_in` is its one writer after the
-- children are inserted.

-- Uniqueness scopes a row can never re-enter (RELIABILITY.md, E2): every live status, plus any
-- of the terminal ones; or none. A scope that leaves a live status out lets a row leave it and
-- come back while another row holds the key, and the statement that brings it back — a commit,
-- a reap, a delivery, a claim of many rows — would fail on the unique index. The client checks
-- this before it writes; the constraint covers every other writer. NOT VALID: rows written
-- before this migration are not re-checked.
ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_unique_scope_live CHECK (
    unique_scope IS NULL OR cardinality(unique_scope) = 0
    OR unique_scope @> '{runnable,executing,awaiting_signal,awaiting_children}'::gd_status[]
) NOT VALID;

-- Keys are indexed by B-trees, whose entries are capped near 2.7 kB: a longer partition key
-- is stored fine and then fails every claim of its queue (RELIABILITY.md, E8). The client
-- refuses keys over 1,024 bytes (`MAX_KEY_BYTES`) before it writes; these cover the others.
ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_key_length CHECK (
    octet_length(partition_key) <= 1024 AND octet_length(unique_key) <= 1024
    AND octet_length(queue) <= 1024
) NOT VALID;
ALTER TABLE gd_signals ADD CONSTRAINT gd_signals_dedup_key_length CHECK (
    octet_length(dedup_key) <= 1024
) NOT VALID;

-- The fan-in: one element of `p_parents` per child that has just ended (`done` or `failed`),
-- holding that child's parent id. Each parent is decremented once per child, in one update, and
-- one whose count reaches zero while it awaits its children becomes runnable at once. Returns
-- the queues of the parents it woke. The caller already holds the parents' row locks (taken
-- without waiting, or in ascending id order), so this never waits.
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
-- their whole inboxes — a delivery that held a row until the caller locked it has
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

-- The group commit (migration 0004), in statements that each take a fresh snapshot
-- under READ COMMITTED (the engine runs it at READ COMMITTED whatever the database's
-- default):
--   0. lock the batch's rows and, for outcomes that end a child, its parent, without
--      waiting: an outcome whose row or parent someone else holds is `deferred` (nothing
--      of it is written; the engine commits it again a moment later);
--   1. apply each fenced outcome (spec §3.1) and consume the signals a progressing step
--      received;
--   2. decrement the parents of the rows that ended and delete the whole inbox of every
--      finished row (gd_rows_ended);
--   3. wake a parked `await` whose signal is in.
-- The time is the statement's start (not the transaction's: inside a step's own
-- transaction that began long ago, an await timeout or a replay delay counts from the
-- commit). Parameters as in 0004 (a NULL state keeps the stored one); `ids` sorted ascending. A second outcome of the same id
-- in one call is an error of the caller (the engine keeps only the newest epoch's).
DROP FUNCTION gd_commit_outcomes(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[],
                                 int8[], text[], int4[], bool[], int8[], int8[], text[], timestamptz);

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

    -- 1. Apply every fenced outcome, exactly as the table of spec §3.1 says; an `await`
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

-- The reaper (spec §3.2): expired `executing` rows go back to `runnable` with `attempt + 1`,
-- or fail once `reaps` reaches `max_reaps` (or a cancel was requested). Locks without
-- waiting: a row someone holds, or a failing row whose parent someone holds, is left for the
-- next pass. The inbox of the rows it fails is deleted in a later statement, with a fresh
-- snapshot, so a signal delivered while the reaper took its locks is not left behind.
-- Returns each reaped row and whether it failed. `p_only`: reap only these ids (the engine
-- reaps row by row when a batch fails, so that one row cannot stop the reaper).
CREATE FUNCTION gd_reap(p_limit int8, p_now timestamptz, p_only int8[] DEFAULT NULL)
RETURNS TABLE (id int8, failed bool) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(p_now, statement_timestamp());
    cand    int8[];
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
    SELECT coalesce(array_agg(x.id), '{}') INTO parents FROM (
        SELECT p.id FROM gd_instances p
         WHERE p.id IN (SELECT i.parent_id FROM gd_instances i
                         WHERE i.id = ANY (cand) AND i.parent_id IS NOT NULL
                           AND (i.cancel_requested OR i.reaps + 1 >= i.max_reaps))
         ORDER BY p.id
           FOR NO KEY UPDATE SKIP LOCKED) x;
    WITH reaped AS (
        UPDATE gd_instances i
           SET status = (CASE WHEN i.cancel_requested OR i.reaps + 1 >= i.max_reaps
                              THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE
                   WHEN i.cancel_requested THEN 'cancelled'
                   WHEN i.reaps + 1 >= i.max_reaps
                   THEN format('lease lost %s times (max_reaps = %s): the step at %L never committed an outcome',
                               i.reaps + 1, i.max_reaps, i.step)
                   ELSE format('lease lost on %s (epoch %s); retrying', i.locked_by, i.lease_epoch) END,
               attempt = i.attempt + 1,
               reaps = i.reaps + 1,
               locked_by = NULL,
               lease_expires_at = NULL,
               eligible_at = t,
               updated_at = t
         WHERE i.id = ANY (cand)
           AND i.status = 'executing'
           AND (i.parent_id IS NULL OR i.parent_id = ANY (parents)
                OR NOT (i.cancel_requested OR i.reaps + 1 >= i.max_reaps))
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
-- steps cancelled at the drain deadline. Fenced like an outcome; a row whose instance was
-- cancelled meanwhile fails instead, as its commit would have. Locks as the reaper does: a
-- row it cannot take at once is left to its lease's expiry. Returns the released ids.
CREATE FUNCTION gd_release(p_ids int8[], p_epochs int8[], p_node text, p_now timestamptz)
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
         WHERE i.lease_epoch = l.epoch AND i.locked_by = p_node AND i.status = 'executing'
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
    WITH released AS (
        UPDATE gd_instances i
           SET status = (CASE WHEN i.cancel_requested THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE i.last_error END,
               locked_by = NULL, lease_expires_at = NULL, updated_at = t
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
