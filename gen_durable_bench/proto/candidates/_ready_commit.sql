-- Rows by primary key (`= ANY`), each outcome found by binary search in the sorted
-- ids (`width_bucket`): no join of the arrays with a table, whose plan could rescan them.
-- The queue entries of the `done` rows are locked (`k`, an InitPlan of `f`, so before the
-- first lease is deleted), then the leases: a claim holds an entry it locked while it
-- waits on a lease a commit is deleting, so the other order deadlocks.
WITH k AS MATERIALIZED (
    SELECT r.id FROM p_ready r
     WHERE r.id = ANY ($1::int8[]) AND ($4::text[])[width_bucket(r.id, $1::int8[])] IS NULL
     ORDER BY r.id
       FOR NO KEY UPDATE),
f AS (
    DELETE FROM p_leases l
     WHERE l.id = ANY ($1::int8[]) AND l.locked_by = $3 AND l.epoch = ($2::int8[])[width_bucket(l.id, $1::int8[])]
       AND (SELECT count(*) FROM k) >= 0
    RETURNING l.id, ($4::text[])[width_bucket(l.id, $1::int8[])] AS s),
