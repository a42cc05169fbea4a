-- Lwd: Lw, but a `done` keeps its result: it moves the durable row into p_done (a delete and
-- an insert), which stands for one day's partition; retention truncates it and the log.
-- @setup
@include _narrow.sql
@include _log_fence.sql
CREATE TABLE p_log (
    seq bigint PRIMARY KEY DEFAULT nextval('p_log_seq'),
    id  bigint NOT NULL
);
@include _log.sql
CREATE TABLE p_done (LIKE p_instances INCLUDING DEFAULTS);
ALTER TABLE p_done ADD PRIMARY KEY (id);
-- @seed
@include _log_seed.sql
-- @claim
SELECT a.lo, a.hi FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       p_advance($1, $2) a
-- @read
SELECT * FROM p_read($1, $2)
-- @commit
@include _log_commit.sql
d AS (
    DELETE FROM p_instances i
     WHERE i.id = ANY ($1::int8[]) AND i.log_seq = ($2::int8[])[width_bucket(i.id, $1::int8[])] AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL
    RETURNING i.id, i.fsm, i.fsm_version, i.step, 'done', ($5::jsonb[])[width_bucket(i.id, $1::int8[])], '{"ok": true}'::jsonb,
              i.awaits, i.await_deadline, i.queue, i.priority, i.partition_key, i.attempt,
              i.reaps, i.max_reaps, i.last_error, i.parent_id, i.children_pending,
              i.unique_key, i.inserted_at, now(), now(), i.cancel_requested, i.gate,
              i.rate_limit, i.rate_key, i.rate_weight, i.rate_step, i.log_seq),
m AS (INSERT INTO p_done SELECT * FROM d RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM m)
-- @gc
TRUNCATE p_log, p_done
-- @tables
p_instances, p_log, p_cursor, p_batches, p_done
