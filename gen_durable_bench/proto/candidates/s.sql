-- s: v1's design (one wide row is queue entry, lease, state and result; claim and commit
-- each update it; `gc` deletes) with five indexes instead of twelve: what the indexes
-- cost, apart from the design.
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
WITH u AS (
    UPDATE s_instances i
       SET step = coalesce(($4::text[])[width_bucket(i.id, $1::int8[])], i.step), state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])],
           status = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN 'done' ELSE 'runnable' END,
           result = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN '{"ok": true}'::jsonb END,
           eligible_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN i.eligible_at ELSE now() END,
           finished_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN now() END,
           locked_by = NULL, lease_expires_at = NULL, attempt = 0, updated_at = now()
     WHERE i.id = ANY ($1::int8[]) AND i.locked_by = $3 AND i.lease_epoch = ($2::int8[])[width_bucket(i.id, $1::int8[])]
    RETURNING 1)
SELECT count(*) FROM u
-- @gc
WITH d AS (DELETE FROM s_instances WHERE id IN (
             SELECT id FROM s_instances WHERE finished_at <= now() ORDER BY finished_at
              LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM d
-- @tables
s_instances
