-- Lwdp: Lwd with the log in real partitions (segments of 50,000 entries): what routing an
-- append and reading a range through a partitioned table cost. Up to 1,000,000 entries.
-- @setup
@include _narrow.sql
@include _log_fence.sql
CREATE TABLE p_log (
    seq bigint PRIMARY KEY DEFAULT nextval('p_log_seq'),
    id  bigint NOT NULL
) PARTITION BY RANGE (seq);
-- Segments of 50,000 entries, made ahead (a service would keep a few ready), enough for
-- 1,000,000 entries; retention truncates or drops a segment once the cursor and every
-- batch in flight are past it.
DO $segments$
BEGIN
    FOR k IN 0..19 LOOP
        EXECUTE format('CREATE TABLE p_log_%s PARTITION OF p_log FOR VALUES FROM (%s) TO (%s)',
                       k, k * 50000, (k + 1) * 50000);
    END LOOP;
END
$segments$;
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
p_instances, p_log_0, p_log_1, p_log_2, p_log_3, p_log_4, p_log_5, p_log_6, p_cursor, p_batches, p_done
