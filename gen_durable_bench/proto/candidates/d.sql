-- d: s's single row, but a `done` moves the row (a delete and an insert) into a table of
-- terminal rows, s_done, which stands for one day's partition: retention truncates (or
-- drops) it whole instead of deleting rows one by one.
-- @setup
@include _single.sql
CREATE TABLE s_done (LIKE s_instances INCLUDING DEFAULTS);
ALTER TABLE s_done ADD PRIMARY KEY (id);
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
    RETURNING i.id, i.fsm, i.fsm_version, i.step, 'done', ($5::jsonb[])[width_bucket(i.id, $1::int8[])], '{"ok": true}'::jsonb,
              i.awaits, i.await_deadline, i.queue, i.priority, i.partition_key,
              i.eligible_at, i.attempt, i.reaps, i.max_reaps, i.last_error, NULL::text,
              i.lease_epoch, NULL::timestamptz, i.parent_id, i.children_pending,
              i.unique_key, i.inserted_at, now(), now(), i.cancel_requested, i.gate,
              i.rate_limit, i.rate_key, i.rate_weight, i.rate_step),
m AS (INSERT INTO s_done SELECT * FROM d RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM m)
-- @gc
TRUNCATE s_done
-- @tables
s_instances, s_done
