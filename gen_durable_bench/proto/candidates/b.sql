-- b: s's single row, but a claim writes no WAL for the lease: the lease is a row of the
-- unlogged p_leases, the instance stays `runnable` while it runs (the pick skips rows
-- with a live lease), and a `next` changes no indexed column, so its update is HOT.
-- @setup
@include _single.sql
@include _leases.sql
-- The claim, as a function of two statements: the first locks the entries and takes their
-- leases; the second, with a fresh snapshot, reads the rows' step and state. In one
-- statement the read would use the snapshot taken before the locks: a lease deleted by a
-- commit after it would let the claim read the step that commit has just moved past, and
-- run it again. (v1 locks and reads the same row, so the lock's recheck gives it the
-- latest version.) The lease probe has a LIMIT so that it stays a probe of p_leases' key
-- per row: as an anti-join the planner materialized every lease.
CREATE FUNCTION p_claim(p_worker text, p_batch int8)
RETURNS TABLE (id int8, epoch int8, step text, state jsonb)
LANGUAGE plpgsql AS $claim$
#variable_conflict use_column
DECLARE
    ids    int8[];
    epochs int8[];
BEGIN
    WITH c AS MATERIALIZED (
        SELECT i.id FROM s_instances i
         WHERE i.queue = 'default' AND i.status = 'runnable' AND i.eligible_at <= now()
           AND NOT EXISTS (SELECT 1 FROM p_leases l
                            WHERE l.id = i.id AND l.expires_at > now() LIMIT 1)
         ORDER BY i.priority, i.eligible_at, i.id
         LIMIT p_batch
           FOR NO KEY UPDATE SKIP LOCKED),
    l AS (
        INSERT INTO p_leases AS p (id, epoch, locked_by, expires_at)
        SELECT c.id, (extract(epoch FROM clock_timestamp()) * 1000000)::int8, p_worker,
               now() + interval '30 s'
          FROM c
        -- A row whose lease is still there is not taken; an expired lease is the reaper's
        -- to delete (not measured here). DO UPDATE … WHERE would lock the lease even when
        -- it does not take it, and a commit deleting that lease would deadlock with it.
        ON CONFLICT (id) DO NOTHING
        RETURNING p.id, p.epoch)
    SELECT array_agg(l.id ORDER BY l.id), array_agg(l.epoch ORDER BY l.id)
      INTO ids, epochs FROM l;
    RETURN QUERY
    SELECT i.id, epochs[width_bucket(i.id, ids)], i.step, i.state
      FROM s_instances i WHERE i.id = ANY (ids);
END
$claim$;
-- @seed
INSERT INTO s_instances (fsm, fsm_version, step, state, queue)
SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
  FROM generate_series(1, $1) g
-- @claim
SELECT c.* FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       p_claim($1, $2) c
-- @commit
-- Rows by primary key (`= ANY`), each outcome found by binary search in the sorted
-- ids (`width_bucket`): no join of the arrays with a table, whose plan could rescan them.
-- The rows first, then the leases: a claim holds a row it locked while it takes the
-- lease, so the other order deadlocks.
WITH k AS MATERIALIZED (
    SELECT i.id FROM s_instances i WHERE i.id = ANY ($1::int8[]) ORDER BY i.id
       FOR NO KEY UPDATE),
f AS (
    DELETE FROM p_leases l
     WHERE l.id = ANY ($1::int8[]) AND l.locked_by = $3 AND l.epoch = ($2::int8[])[width_bucket(l.id, $1::int8[])]
       AND l.id IN (SELECT id FROM k)
    RETURNING l.id),
u AS (
    UPDATE s_instances i
       SET step = coalesce(($4::text[])[width_bucket(i.id, $1::int8[])], i.step), state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])],
           status = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN 'done' ELSE i.status END,
           result = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN '{"ok": true}'::jsonb END,
           finished_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN now() END,
           attempt = 0, updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM f))
    RETURNING 1)
SELECT count(*) FROM u
-- @gc
WITH d AS (DELETE FROM s_instances WHERE id IN (
             SELECT id FROM s_instances WHERE finished_at <= now() ORDER BY finished_at
              LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM d
-- @tables
s_instances, p_leases
