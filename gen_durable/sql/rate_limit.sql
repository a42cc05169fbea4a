-- The rate limits' helpers: the weight an insert stores, and the collector's recount of
-- what waiting rows reserved. The admission itself is part of the claims (claim.sql).

-- The weight an insert stores: as given when it fits its limit's burst (or the limit is
-- unknown: the reference trigger then refuses the row), negated when it does not, so that
-- the row's check (`gd_instances_rate`) refuses it: such a weight could never be admitted.
CREATE FUNCTION gd_rate_weight(p_limit text, p_weight double precision)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN l.burst IS NULL OR p_weight <= l.burst THEN p_weight ELSE -p_weight END
      FROM (SELECT (SELECT burst FROM gd_rate_limits WHERE name = p_limit) AS burst) l
$$;

-- The collector's recount of what is reserved: `held` of up to `p_limit` buckets, from
-- their rows, moving `tokens` by the same difference (so `tokens + held`, the tokens not
-- yet taken, is unchanged), so a write that missed `held` (a cancel by a node of an earlier
-- version) is corrected. Every write of `held` locks its bucket, so the buckets are locked
-- first (skipping those a claim or an operator holds) and counted in a statement of its
-- own, whose snapshot sees what the holders before it committed. Returns how many were
-- corrected.
CREATE FUNCTION gd_recount_held(p_limit int8) RETURNS int8
LANGUAGE plpgsql AS $recount$
DECLARE
    tids tid[];
    n    int8;
BEGIN
    SELECT array_agg(b.ctid) INTO tids
      FROM (SELECT g.ctid FROM gd_buckets g
             WHERE g.held > 0 OR EXISTS (SELECT 1 FROM gd_instances i
                                          WHERE i.rate_limit = g.name AND i.rate_key = g.key
                                            AND i.status = 'runnable' AND i.rate_paid)
             ORDER BY g.name, g.key
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED) b;
    WITH counted AS (
        SELECT g.ctid AS tid, g.held AS was,
               coalesce((SELECT sum(i.rate_weight) FROM gd_instances i
                          WHERE i.rate_limit = g.name AND i.rate_key = g.key
                            AND i.status = 'runnable' AND i.rate_paid), 0) AS held
          FROM gd_buckets g
         WHERE g.ctid = ANY (tids)
    ), fixed AS (
        UPDATE gd_buckets g SET held = c.held, tokens = g.tokens + (c.was - c.held)
          FROM counted c
         WHERE g.ctid = c.tid AND c.held <> c.was
        RETURNING 1
    )
    SELECT count(*) INTO n FROM fixed;
    RETURN n;
END
$recount$;
