-- abc: a's narrow queue entry, but never updated (a `next` keeps its place; a `done`
-- deletes it); b's unlogged leases; and a durable row with no index on anything a step
-- changes, so each of its updates can be HOT. Terminal rows are found for retention
-- through an append-only log of (finished_at, id).
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
CREATE TABLE p_finished (
    finished_at timestamptz NOT NULL,
    id          bigint      NOT NULL,
    PRIMARY KEY (finished_at, id)
);
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
u AS (
    UPDATE p_instances i
       SET step = coalesce(($4::text[])[width_bucket(i.id, $1::int8[])], i.step), state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])],
           status = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN 'done' ELSE i.status END,
           result = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN '{"ok": true}'::jsonb END,
           finished_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN now() END,
           attempt = 0, updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM f))
    RETURNING i.id, ($4::text[])[width_bucket(i.id, $1::int8[])] AS s),
g AS (INSERT INTO p_finished SELECT now(), id FROM u WHERE s IS NULL)
SELECT count(*) FROM u
-- @gc
WITH f AS (DELETE FROM p_finished WHERE (finished_at, id) IN (
             SELECT finished_at, id FROM p_finished WHERE finished_at <= now()
              ORDER BY finished_at, id LIMIT 5000) RETURNING id),
     d AS (DELETE FROM p_instances i USING f WHERE i.id = f.id RETURNING 1)
SELECT count(*) FROM d
-- @tables
p_instances, p_ready, p_leases, p_finished
