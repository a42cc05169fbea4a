-- b: s's single row, but a claim writes no WAL for the lease: the lease is a row of the
-- unlogged p_leases, the instance stays `runnable` while it runs (the pick skips rows
-- with a live lease), and a `next` changes no indexed column, so its update is HOT.
-- @setup
@include _single.sql
@include _leases.sql
-- @seed
INSERT INTO s_instances (fsm, fsm_version, step, state, queue)
SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
  FROM generate_series(1, $1) g
-- @claim
-- The lease probe has a LIMIT so that it stays a probe of p_leases' key per row: as an
-- anti-join the planner materialized every lease and compared each row with all of them.
WITH c AS MATERIALIZED (
    SELECT i.id FROM s_instances i
     WHERE i.queue = 'default' AND i.status = 'runnable' AND i.eligible_at <= now()
       AND NOT EXISTS (SELECT 1 FROM p_leases l WHERE l.id = i.id AND l.expires_at > now() LIMIT 1)
     ORDER BY i.priority, i.eligible_at, i.id
     LIMIT $2
       FOR NO KEY UPDATE SKIP LOCKED),
l AS (
    INSERT INTO p_leases AS p (id, epoch, locked_by, expires_at)
    SELECT id, (extract(epoch FROM clock_timestamp()) * 1000000)::int8, $1,
           now() + interval '30 s'
      FROM c
    ON CONFLICT (id) DO UPDATE
       SET epoch = greatest(p.epoch + 1, excluded.epoch), locked_by = excluded.locked_by,
           expires_at = excluded.expires_at
     WHERE p.expires_at <= now()
    RETURNING id, epoch)
SELECT l.id, l.epoch, i.step, i.state
  FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       l JOIN s_instances i ON i.id = l.id
-- @commit
-- Rows by primary key (`= ANY`), each outcome found by binary search in the sorted
-- ids (`width_bucket`): no join of the arrays with a table, whose plan could rescan them.
-- The rows first, then the leases: a claim holds a row it locked while it takes the
-- lease, so the other order deadlocks.
WITH k AS MATERIALIZED (
    SELECT i.id FROM s_instances i WHERE i.id = ANY ($1::int8[]) ORDER BY i.id
       FOR NO KEY UPDATE),
f AS (
    DELETE FROM p_leases l
     WHERE l.id = ANY ($1::int8[]) AND l.locked_by = $3 AND l.epoch = ($2::int8[])[width_bucket(l.id, $1::int8[])]
       AND l.id IN (SELECT id FROM k)
    RETURNING l.id),
u AS (
    UPDATE s_instances i
       SET step = coalesce(($4::text[])[width_bucket(i.id, $1::int8[])], i.step), state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])],
           status = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN 'done' ELSE i.status END,
           result = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN '{"ok": true}'::jsonb END,
           finished_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN now() END,
           attempt = 0, updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM f))
    RETURNING 1)
SELECT count(*) FROM u
-- @gc
WITH d AS (DELETE FROM s_instances WHERE id IN (
             SELECT id FROM s_instances WHERE finished_at <= now() ORDER BY finished_at
              LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM d
-- @tables
s_instances, p_leases
