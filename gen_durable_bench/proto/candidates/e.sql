-- e: s's single row, but a `done` that keeps no result deletes the row (opt-in, e.g. for
-- jobs): nothing is left to collect.
-- @setup
@include _single.sql
-- @seed
INSERT INTO s_instances (fsm, fsm_version, step, state, queue)
SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
  FROM generate_series(1, $1) g
-- @claim
WITH c AS MATERIALIZED (
    SELECT id FROM s_instances
     WHERE queue = 'default' AND status = 'runnable' AND eligible_at <= now()
     ORDER BY priority, eligible_at, id
     LIMIT $2
       FOR NO KEY UPDATE SKIP LOCKED)
UPDATE s_instances i
   SET status = 'executing', locked_by = $1,
       lease_epoch = greatest(i.lease_epoch + 1,
                              (extract(epoch FROM statement_timestamp()) * 1000000)::int8),
       lease_expires_at = now() + interval '30 s', updated_at = now()
  FROM c, set_config('synchronous_commit', 'off', true) AS without_flush
 WHERE i.id = c.id
RETURNING i.id, i.lease_epoch AS epoch, i.step, i.state
-- @commit
-- Rows by primary key (`= ANY`), each outcome found by binary search in the sorted
-- ids (`width_bucket`): no join of the arrays with a table, whose plan could rescan them.
WITH n AS (
    UPDATE s_instances i
       SET step = ($4::text[])[width_bucket(i.id, $1::int8[])], state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])], status = 'runnable', eligible_at = now(),
           locked_by = NULL, lease_expires_at = NULL, attempt = 0, updated_at = now()
     WHERE i.id = ANY ($1::int8[]) AND i.locked_by = $3 AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])] AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NOT NULL
    RETURNING 1),
d AS (
    DELETE FROM s_instances i
     WHERE i.id = ANY ($1::int8[]) AND i.locked_by = $3 AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])] AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL
    RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM d)
-- @tables
s_instances
