-- The claim as two functions, so that PostgreSQL plans it once per connection instead of
-- on every call (PERFORMANCE.md, "Where the time goes").
--
-- Sent as a prepared statement, the claim was still planned on every call: PostgreSQL
-- keeps planning a statement anew while its generic plan looks costlier than the plans
-- made for the values, and a `LIMIT $4` looks costly without its value. Planning took
-- 2.4-2.7 ms of a claim with gates and rate limits (0.4-0.5 ms without, `gd_claim_plain`),
-- about 10 us of server CPU per step. The `SET` of each function makes PostgreSQL reuse
-- one plan per connection for the statement inside, for the function's call only: no
-- session state, so it works the same through PgBouncer in transaction mode.
--
-- A plan made once must stay right as the table grows from empty to millions of rows,
-- between two ANALYZEs. `enable_seqscan = off` keeps every read of the claim on its index
-- whatever the statistics said when the plan was made (each read has one; a plan of an
-- empty table would otherwise read it whole). The plans are made again after each ANALYZE
-- of a table they read.
--
-- The statements are the claim's of `gen_durable::store::pg::claim`, whose comments explain
-- them; its tests prepare the text between `RETURN QUERY` and the `;` that ends it, and
-- check the plan PostgreSQL reuses.

CREATE FUNCTION gd_claim(text, text[], int4[], int8, text, int8, timestamptz)
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    contended json, throttled json, next_due timestamptz, now timestamptz, flow boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $claim$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH picked AS MATERIALIZED (
    SELECT i.id, i.fsm, i.partition_key, i.gate, i.priority, i.eligible_at,
           i.rate_limit, i.rate_key, i.rate_weight,
           i.rate_limit IS NOT NULL AND i.rate_step = i.step AND NOT i.rate_paid AS rate_due
      FROM gd_instances i
     WHERE i.queue = $1
       AND i.status = 'runnable'
       AND i.eligible_at <= coalesce($7, now())
       AND NOT EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = $1)
       AND (i.fsm, i.fsm_version) IN (SELECT * FROM unnest($2::text[], $3::int4[]))
       AND NOT EXISTS (SELECT 1 FROM gd_instances e
                        WHERE e.partition_key = i.partition_key AND e.status = 'executing'
                          AND e.gate IS NULL AND i.gate IS NULL)
       AND coalesce(i.gate || chr(31) || i.partition_key <> ALL (ARRAY(
               SELECT e.gate || chr(31) || e.partition_key
                 FROM gd_instances e
                 JOIN gd_gates g ON g.name = e.gate
                WHERE e.status = 'executing' AND e.gate IS NOT NULL
                GROUP BY e.gate, e.partition_key, g.size
               HAVING count(*) >= g.size)), true)
     ORDER BY i.priority, i.eligible_at, i.id
     LIMIT $4
       FOR NO KEY UPDATE SKIP LOCKED
), ranked AS (
    SELECT id, partition_key, gate,
           row_number() OVER (PARTITION BY gate, partition_key
                              ORDER BY priority, eligible_at, id) AS rn
      FROM picked
), free AS (
    SELECT k.gate, k.partition_key, g.size - u.n AS room,
           ARRAY(SELECT f.slot
                   FROM (SELECT s.slot::int2 AS slot FROM generate_series(0, g.size - 1) s(slot)
                         EXCEPT ALL
                         SELECT e.gate_slot FROM gd_instances e
                          WHERE e.status = 'executing' AND e.gate = k.gate
                            AND e.partition_key = k.partition_key) f
                  ORDER BY (f.slot + abs(hashtext($5)::int8)) % g.size) AS slots
      FROM (SELECT DISTINCT gate, partition_key FROM picked WHERE gate IS NOT NULL) k
      JOIN gd_gates g ON g.name = k.gate
     CROSS JOIN LATERAL (SELECT count(*) AS n FROM gd_instances e
                          WHERE e.status = 'executing' AND e.gate = k.gate
                            AND e.partition_key = k.partition_key) u
), chosen AS (
    SELECT r.id, f.slots[r.rn] AS slot
      FROM ranked r
      LEFT JOIN free f ON f.gate = r.gate AND f.partition_key = r.partition_key
     WHERE CASE WHEN r.gate IS NULL THEN r.partition_key IS NULL OR r.rn = 1
                ELSE r.rn <= least(f.room, cardinality(f.slots)) END
), wants AS (
    SELECT p.id, p.rate_limit, p.rate_key,
           sum(p.rate_weight) OVER (PARTITION BY p.rate_limit, p.rate_key
                                    ORDER BY p.priority, p.eligible_at, p.id) AS upto
      FROM chosen c JOIN picked p ON p.id = c.id
     WHERE p.rate_due
), stored AS MATERIALIZED (
    SELECT b.name, b.key, b.tokens, b.at
      FROM gd_buckets b
     WHERE (b.name, b.key) IN (SELECT rate_limit, rate_key FROM wants)
     ORDER BY b.name, b.key
       FOR NO KEY UPDATE
), buckets AS MATERIALIZED (
    SELECT k.name, k.key, k.total, k.wanted, l.per_second, s.name IS NOT NULL AS stored,
           CASE WHEN s.name IS NULL THEN l.burst
                ELSE least(l.burst, s.tokens + extract(epoch FROM coalesce($7, now()) - s.at)
                                               * l.per_second) END AS avail
      FROM (SELECT rate_limit AS name, rate_key AS key, max(upto) AS total, count(*) AS wanted
              FROM wants GROUP BY 1, 2) k
      JOIN gd_rate_limits l ON l.name = k.name
      LEFT JOIN stored s ON s.name = k.name AND s.key = k.key
), owed AS (
    SELECT w.id, w.rate_limit, w.rate_key,
           coalesce($7, now()) + (w.upto - b.avail) / b.per_second * interval '1 second' AS due
      FROM wants w JOIN buckets b ON b.name = w.rate_limit AND b.key = w.rate_key
     WHERE w.upto > b.avail
), debited AS (
    UPDATE gd_buckets g SET tokens = b.avail - b.total, at = coalesce($7, now())
      FROM buckets b
     WHERE b.stored AND g.name = b.name AND g.key = b.key
    RETURNING g.name
), minted AS (
    INSERT INTO gd_buckets (name, key, tokens, at)
    SELECT b.name, b.key, b.avail - b.total, coalesce($7, now()) FROM buckets b WHERE NOT b.stored
    RETURNING name
), deferred AS (
    UPDATE gd_instances i
       SET eligible_at = o.due, rate_paid = true, updated_at = coalesce($7, now())
      FROM owed o
     WHERE i.id = o.id
    RETURNING i.id
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = $5, lease_epoch = i.lease_epoch + 1,
           lease_expires_at = coalesce($7, now()) + $6 * interval '1 millisecond',
           updated_at = coalesce($7, now()), gate_slot = c.slot, rate_paid = false
      FROM chosen c
     WHERE i.id = c.id AND NOT EXISTS (SELECT 1 FROM owed o WHERE o.id = c.id)
    RETURNING i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits, i.lease_epoch,
              i.partition_key, i.gate
), pick AS (
    SELECT coalesce($7, now()) AS now,
           EXISTS (SELECT 1 FROM gd_gates) OR EXISTS (SELECT 1 FROM gd_rate_limits) AS flow,
           least((SELECT min(due) FROM owed),
                 (SELECT min(r.eligible_at) FROM gd_instances r
                   WHERE r.queue = $1 AND r.status = 'runnable' AND r.rate_paid
                     AND r.eligible_at > coalesce($7, now()))) AS next_due,
           (SELECT coalesce(json_agg(json_build_object(
                       'limit', b.name, 'key', b.key, 'wanted', b.wanted,
                       'deferred', (SELECT count(*) FROM owed o
                                     WHERE o.rate_limit = b.name AND o.rate_key = b.key))), '[]')
              FROM buckets b) AS throttled,
           (SELECT coalesce(json_agg(json_build_object(
                       'id', p.id, 'fsm', p.fsm, 'partition_key', p.partition_key, 'gate', p.gate)
                       ORDER BY p.id), '[]')
              FROM picked p WHERE NOT EXISTS (SELECT 1 FROM chosen c WHERE c.id = p.id))
               AS contended
)
SELECT c.id, c.fsm, c.fsm_version, c.step, c.state, c.attempt, c.awaits, c.lease_epoch,
       c.partition_key, c.gate,
       (SELECT coalesce(json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id), '[]')
          FROM gd_signals s WHERE s.target_id = c.id) AS inbox,
       (SELECT coalesce(json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id), '[]')
          FROM gd_instances ch WHERE ch.parent_id = c.id) AS children,
       k.contended, k.throttled, k.next_due, k.now, k.flow
  FROM pick k
  LEFT JOIN claimed c ON true
 WHERE c.id IS NOT NULL OR k.next_due IS NOT NULL OR NOT k.flow
 ORDER BY c.id;
END
$claim$;

CREATE FUNCTION gd_claim_plain(text, text[], int4[], int8, text, int8, timestamptz)
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    contended json, throttled json, next_due timestamptz, now timestamptz, flow boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $claim$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH picked AS MATERIALIZED (
    SELECT i.id, i.fsm, i.partition_key, i.priority, i.eligible_at
      FROM gd_instances i
     WHERE i.queue = $1
       AND i.status = 'runnable'
       AND i.eligible_at <= coalesce($7, now())
       AND NOT EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = $1)
       AND (i.fsm, i.fsm_version) IN (SELECT * FROM unnest($2::text[], $3::int4[]))
       AND NOT EXISTS (SELECT 1 FROM gd_instances e
                        WHERE e.partition_key = i.partition_key AND e.status = 'executing'
                          AND e.gate IS NULL)
       AND i.gate IS NULL AND i.rate_limit IS NULL
     ORDER BY i.priority, i.eligible_at, i.id
     LIMIT $4
       FOR NO KEY UPDATE SKIP LOCKED
), chosen AS (
    SELECT r.id
      FROM (SELECT id, partition_key,
                   row_number() OVER (PARTITION BY partition_key
                                      ORDER BY priority, eligible_at, id) AS rn
              FROM picked) r
     WHERE r.partition_key IS NULL OR r.rn = 1
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = $5, lease_epoch = i.lease_epoch + 1,
           lease_expires_at = coalesce($7, now()) + $6 * interval '1 millisecond',
           updated_at = coalesce($7, now())
      FROM chosen c
     WHERE i.id = c.id
    RETURNING i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits, i.lease_epoch,
              i.partition_key, i.gate
), pick AS (
    SELECT coalesce($7, now()) AS now,
           EXISTS (SELECT 1 FROM gd_gates) OR EXISTS (SELECT 1 FROM gd_rate_limits) AS flow,
           (SELECT coalesce(json_agg(json_build_object(
                       'id', p.id, 'fsm', p.fsm, 'partition_key', p.partition_key)
                       ORDER BY p.id), '[]')
              FROM picked p WHERE NOT EXISTS (SELECT 1 FROM chosen c WHERE c.id = p.id))
               AS contended
)
SELECT c.id, c.fsm, c.fsm_version, c.step, c.state, c.attempt, c.awaits, c.lease_epoch,
       c.partition_key, c.gate,
       (SELECT coalesce(json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id), '[]')
          FROM gd_signals s WHERE s.target_id = c.id) AS inbox,
       (SELECT coalesce(json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id), '[]')
          FROM gd_instances ch WHERE ch.parent_id = c.id) AS children,
       k.contended, '[]'::json AS throttled, NULL::timestamptz AS next_due, k.now, k.flow
  FROM pick k
  LEFT JOIN claimed c ON true
 WHERE c.id IS NOT NULL OR k.flow
 ORDER BY c.id;
END
$claim$;
