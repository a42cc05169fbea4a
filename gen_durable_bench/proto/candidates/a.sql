-- a: the queue entry and the lease in a narrow table, p_ready, beside the durable row; a
-- claim updates only the narrow row, a commit updates the durable row once. The durable
-- row keeps indexes on what a `done` changes (status, finished_at), as v1's does.
-- @setup
@include _narrow.sql
CREATE INDEX p_instances_status ON p_instances (queue, status);
CREATE INDEX p_instances_finished ON p_instances (finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE p_ready (
    id               bigint      PRIMARY KEY,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    eligible_at      timestamptz NOT NULL DEFAULT now(),
    locked_by        text,
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX p_ready_pick ON p_ready (queue, priority, eligible_at, id) WHERE locked_by IS NULL;
CREATE INDEX p_ready_lease ON p_ready (lease_expires_at) WHERE locked_by IS NOT NULL;
-- @seed
WITH i AS (
    INSERT INTO p_instances (fsm, fsm_version, step, state, queue)
    SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
      FROM generate_series(1, $1) g
    RETURNING id, queue, priority)
INSERT INTO p_ready (id, queue, priority) SELECT id, queue, priority FROM i
-- @claim
WITH c AS MATERIALIZED (
    SELECT id FROM p_ready
     WHERE queue = 'default' AND locked_by IS NULL AND eligible_at <= now()
     ORDER BY priority, eligible_at, id
     LIMIT $2
       FOR NO KEY UPDATE SKIP LOCKED),
r AS (
    UPDATE p_ready r
       SET locked_by = $1,
           lease_epoch = greatest(r.lease_epoch + 1,
                                  (extract(epoch FROM statement_timestamp()) * 1000000)::int8),
           lease_expires_at = now() + interval '30 s'
      FROM c
     WHERE r.id = c.id
    RETURNING r.id, r.lease_epoch)
SELECT r.id, r.lease_epoch AS epoch, i.step, i.state
  FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       r JOIN p_instances i ON i.id = r.id
-- @commit
-- Rows by primary key (`= ANY`), each outcome found by binary search in the sorted
-- ids (`width_bucket`): no join of the arrays with a table, whose plan could rescan them.
WITH n AS (
    UPDATE p_ready r SET locked_by = NULL, lease_expires_at = NULL, eligible_at = now()
     WHERE r.id = ANY ($1::int8[]) AND r.locked_by = $3 AND r.lease_epoch = ($2::int8[])[width_bucket(r.id, $1::int8[])] AND ($4::text[])[width_bucket(r.id, $1::int8[])] IS NOT NULL
    RETURNING r.id),
d AS (
    DELETE FROM p_ready r
     WHERE r.id = ANY ($1::int8[]) AND r.locked_by = $3 AND r.lease_epoch = ($2::int8[])[width_bucket(r.id, $1::int8[])] AND ($4::text[])[width_bucket(r.id, $1::int8[])] IS NULL
    RETURNING r.id),
u AS (
    UPDATE p_instances i
       SET step = coalesce(($4::text[])[width_bucket(i.id, $1::int8[])], i.step), state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])],
           status = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN 'done' ELSE i.status END,
           result = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN '{"ok": true}'::jsonb END,
           finished_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN now() END,
           attempt = 0, updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM n UNION ALL SELECT id FROM d))
    RETURNING i.id, ($4::text[])[width_bucket(i.id, $1::int8[])] AS s)
SELECT count(*) FROM u
-- @gc
WITH d AS (DELETE FROM p_instances WHERE id IN (
             SELECT id FROM p_instances WHERE finished_at <= now() ORDER BY finished_at
              LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM d
-- @tables
p_instances, p_ready
