-- The lease: the epoch that fences every write of the worker that claimed a row, the
-- reaper that takes expired leases back, and the release of rows a worker gives back.
-- Each runs its statements one after the other inside one function, so they cost one round
-- trip and each statement takes a fresh snapshot (READ COMMITTED) after the locks the one
-- before it took. Service statements lock with SKIP LOCKED and never wait for a row.

-- The epoch a claim gives: at least the statement's time in microseconds since 1970, else
-- the prior epoch + 1. A claim commits without waiting for its WAL flush (claim.sql), so a
-- server crash may forget it: the row is back at its old epoch while the worker that
-- claimed it may still run its step. With `old + 1`, the same node claiming the row again
-- would get the forgotten claim's epoch and both workers would pass the fence. A claim
-- after the recovery gets a later epoch than any before the crash, as long as the server's
-- clock does not step back by more than a crash and recovery take. Used by the three
-- claims and the hand-off.
CREATE FUNCTION gd_lease_epoch(prior int8) RETURNS int8
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT greatest(prior + 1, (extract(epoch FROM statement_timestamp()) * 1000000)::int8) $$;

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
CREATE FUNCTION gd_reap(p_limit int8, p_now timestamptz, p_only int8[] DEFAULT NULL,
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

-- Gives rows back to `runnable` without counting an attempt: a draining worker's buffer, or
-- steps cancelled at the drain deadline. A plain row claimed from the log (`locked_by`
-- NULL, its epoch its entry) gets a new entry at the end of its lane, at commit
-- (`gd_instances_enqueue`, log.sql). Fenced like an outcome; a row whose instance was
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
