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
        SELECT r.id FROM p_ready r
         WHERE r.queue = 'default' AND r.eligible_at <= now()
           AND NOT EXISTS (SELECT 1 FROM p_leases l
                            WHERE l.id = r.id AND l.expires_at > now() LIMIT 1)
         ORDER BY r.priority, r.eligible_at, r.id
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
      FROM p_instances i WHERE i.id = ANY (ids);
END
$claim$;
