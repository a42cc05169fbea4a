-- abcd: abc, but a `done` moves the durable row (a delete and an insert) into a table of
-- terminal rows, p_done, which stands for one day's partition: retention truncates (or
-- drops) it whole, and no log of terminal rows is needed.
-- @setup
@include _narrow.sql
@include _leases.sql
CREATE TABLE p_ready (
    id          bigint      PRIMARY KEY,
    queue       text        NOT NULL,
    priority    smallint    NOT NULL DEFAULT 0,
    eligible_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX p_ready_pick ON p_ready (queue, priority, eligible_at, id);
CREATE TABLE p_done (LIKE p_instances INCLUDING DEFAULTS);
ALTER TABLE p_done ADD PRIMARY KEY (id);
@include _ready_claim.sql
-- @seed
WITH i AS (
    INSERT INTO p_instances (fsm, fsm_version, step, state, queue)
    SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
      FROM generate_series(1, $1) g
    RETURNING id, queue, priority)
INSERT INTO p_ready (id, queue, priority) SELECT id, queue, priority FROM i
-- @claim
SELECT c.* FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       p_claim($1, $2) c
-- @commit
@include _ready_commit.sql
r AS (DELETE FROM p_ready r WHERE r.id = ANY (ARRAY(SELECT id FROM f WHERE s IS NULL))),
n AS (
    UPDATE p_instances i SET step = ($4::text[])[width_bucket(i.id, $1::int8[])], state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])], attempt = 0, updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM f WHERE s IS NOT NULL))
    RETURNING 1),
d AS (
    DELETE FROM p_instances i
     WHERE i.id = ANY (ARRAY(SELECT id FROM f WHERE s IS NULL))
    RETURNING i.id, i.fsm, i.fsm_version, i.step, 'done', ($5::jsonb[])[width_bucket(i.id, $1::int8[])], '{"ok": true}'::jsonb,
              i.awaits, i.await_deadline, i.queue, i.priority, i.partition_key, i.attempt,
              i.reaps, i.max_reaps, i.last_error, i.parent_id, i.children_pending,
              i.unique_key, i.inserted_at, now(), now(), i.cancel_requested, i.gate,
              i.rate_limit, i.rate_key, i.rate_weight, i.rate_step),
m AS (INSERT INTO p_done SELECT * FROM d RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM m)
-- @gc
TRUNCATE p_done
-- @tables
p_instances, p_ready, p_leases, p_done
