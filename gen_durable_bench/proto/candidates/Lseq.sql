-- Lseq: the ceiling of a log queue, not a design. Ready entries are appended to p_log and
-- never updated; a claim takes the next range of them from a sequence (no lock, no write
-- per row) under an unlogged batch lease; a `done` that keeps no result deletes the
-- durable row; the log is reclaimed by TRUNCATE (a rotated segment), as PgQ, PgQue and awa
-- reclaim theirs. Single-step runs only: a range taken past the end of the log would lose
-- the entries appended into it later (Lw is the design that handles it).
-- @setup
@include _narrow.sql
CREATE SEQUENCE p_cursor_seq INCREMENT BY 100;
CREATE TABLE p_log (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id  bigint NOT NULL
);
CREATE TABLE p_cursor (
    queue      text   PRIMARY KEY,
    next_seq   bigint NOT NULL,
    last_batch bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 10);
INSERT INTO p_cursor (queue, next_seq) VALUES ('default', 1);
CREATE UNLOGGED TABLE p_batches (
    batch      bigint      PRIMARY KEY,
    worker     text        NOT NULL,
    lo         bigint      NOT NULL,
    hi         bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
-- @seed
WITH i AS (
    INSERT INTO p_instances (fsm, fsm_version, step, state, queue)
    SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
      FROM generate_series(1, $1) g
    RETURNING id)
INSERT INTO p_log (id) SELECT id FROM i ORDER BY id
-- @claim
-- No row write per claim: a sequence that counts in steps of the batch (100, the harness's
-- default `--batch`) hands each claim the next range of the log; the range's first seq is
-- the batch's key, never given twice. A range past the end of the log claims nothing.
-- (This cursor is the ceiling of the design, not a design: a range taken past the end is
-- lost for the entries appended into it later; a real log queue takes batches between
-- snapshots, as PgQ's ticks do.)
WITH c AS (SELECT nextval('p_cursor_seq') AS lo),
b AS (
    INSERT INTO p_batches (batch, worker, lo, hi, expires_at)
    SELECT c.lo, $1, c.lo, c.lo + $2, now() + interval '30 s' FROM c
    RETURNING batch, lo, hi)
SELECT l.id, b.batch AS epoch, i.step, i.state
  FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       b JOIN p_log l ON l.seq >= b.lo AND l.seq < b.hi
       -- A lookup per entry (the LIMIT keeps it one): as a join, the planner hashed the
       -- whole instance table for each batch.
       CROSS JOIN LATERAL (SELECT i.step, i.state FROM p_instances i
                            WHERE i.id = l.id LIMIT 1) i
-- @commit
-- The batch's lease is the fence: deleting it succeeds for the worker that holds it, and
-- only then are the outcomes applied. A `next` appends the row's next step to the log and
-- updates the durable row, which no index covers (HOT when its page has room).
WITH f AS (
    DELETE FROM p_batches WHERE batch = ($2::int8[])[1] AND worker = $3 RETURNING batch),
n AS (
    UPDATE p_instances i SET step = ($4::text[])[width_bucket(i.id, $1::int8[])], state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])], attempt = 0, updated_at = now()
     WHERE i.id = ANY ($1::int8[]) AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NOT NULL AND EXISTS (SELECT 1 FROM f)
    RETURNING i.id),
q AS (INSERT INTO p_log (id) SELECT id FROM n ORDER BY id),
d AS (
    DELETE FROM p_instances i
     WHERE i.id = ANY ($1::int8[]) AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL AND EXISTS (SELECT 1 FROM f)
    RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM d)
-- @gc
TRUNCATE p_log
-- @tables
p_instances, p_log, p_cursor, p_batches
-- @max_steps
1
