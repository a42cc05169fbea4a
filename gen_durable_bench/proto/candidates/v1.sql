-- v1: the schema as it is (gen_durable's migrations), its plain claim (`gd_claim_plain`)
-- and its group commit (`gd_commit_outcomes`), called as the engine calls them. One wide
-- row with 12 indexes is queue entry, lease, state and result; a claim and a commit each
-- write the row again; `gc` deletes terminal rows later. Since storage v2 a plain row
-- runs from the ready log and only a row claimed by itself (a K = 1 key, a gate, a rate
-- limit) takes this claim: each row has a key of its own, as the v1 claim's unit tests do.
-- @setup
@gen_durable_schema
-- @seed
INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default', 'u' || g
  FROM generate_series(1, $1) g
-- @claim
SELECT c.id, c.lease_epoch AS epoch, c.step, c.state
  FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       gd_claim_plain('default', ARRAY['proto'], ARRAY[1], $2, $1, 30000, NULL) c
 WHERE c.id IS NOT NULL
-- @commit
SELECT coalesce(cardinality(f.committed), 0)::int8 AS written, f.deferred
  FROM (SELECT array_agg(CASE WHEN s IS NULL THEN 'done' ELSE 'next' END ORDER BY n) AS kinds,
               array_agg(CASE WHEN s IS NULL THEN '{"ok": true}'::jsonb END ORDER BY n) AS results,
               array_agg(NULL::text ORDER BY n) AS texts,
               array_agg(NULL::int8 ORDER BY n) AS delays,
               array_agg(0 ORDER BY n) AS children,
               array_agg(false ORDER BY n) AS ahead
          FROM unnest($4::text[]) WITH ORDINALITY u(s, n)) a,
       gd_commit_outcomes($3, $1, $2, a.kinds, $4, $5, a.results, a.texts, a.delays, a.texts,
                          a.children, a.ahead, '{}', '{}', '{}', NULL) f
-- @gc
WITH d AS (DELETE FROM gd_instances WHERE id IN (
             SELECT id FROM gd_instances WHERE finished_at <= now() ORDER BY finished_at
              LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1)
SELECT count(*) FROM d
-- @tables
gd_instances
