-- Lw: L made correct for steps that follow one another: a claim takes a range only below
-- a watermark that no running transaction can still append under (PgQ's tick, kept in the
-- cursor's row); the fence is per row, the entry that scheduled the row's step; a `done`
-- that keeps no result deletes the durable row; the log is reclaimed by TRUNCATE.
-- @setup
@include _narrow.sql
@include _log_fence.sql
CREATE TABLE p_log (
    seq bigint PRIMARY KEY DEFAULT nextval('p_log_seq'),
    id  bigint NOT NULL
);
@include _log.sql
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
    RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM d)
-- @gc
TRUNCATE p_log
-- @tables
p_instances, p_log, p_cursor, p_batches
