-- A lease that ran out because the database was down is not the step's fault
-- (RELIABILITY.md, "The chaos soak"): while PostgreSQL restarts, no heartbeat reaches it, so
-- a restart longer than the lease TTL let every step in flight lose its lease, and the
-- reaper counted each toward `max_reaps`. A few restarts could fail a healthy instance with
-- "lease lost N times".
--
-- Now the reaper does not count a lease the restart took: one of a row claimed before the
-- server's start (`updated_at`, which a claim sets and a heartbeat does not) that expired
-- before `pg_postmaster_start_time() + p_lease_ms` (the caller's lease TTL), that is one
-- last extended before the server went down (a lease extended or granted after the start
-- runs to at least the start plus the TTL). Such a row goes back to `runnable` with
-- `attempt + 1` as before (its step runs again), but its `reaps` stay as they were. A
-- lease granted after the restart counts as always, whatever the TTLs of the nodes, so a
-- step that kills its process fails after `max_reaps` whatever the server does; each
-- restart spares a row at most one reap.
--
-- Only with the database clock (`p_now` NULL): a manual clock's times are not the server's.
-- A caller that does not pass a TTL (a node of the version before) is spared only the
-- leases that expired before the start. Not recognised: a failover to a standby started
-- before the outage (its start time is older), or a crash of one backend that the
-- postmaster recovers from without restarting (its start time stays).
--
-- Everything else is `gd_reap` as 0005 made it. The TTL is a new argument with a default,
-- so the function is dropped and made again; two- and three-argument calls still resolve.

DROP FUNCTION gd_reap(int8, timestamptz, int8[]);

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
