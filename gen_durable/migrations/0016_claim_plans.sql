-- The claim's functions again, for two plans 0015 left to chance (PERFORMANCE.md, "Gates",
-- and `gen_durable::store::pg::claim`).
--
-- 1. Rows a claim updates are found by primary key, one probe each: `i.id = ANY (ids)`
--    (and each row's slot or due instant by binary search in the sorted ids, as the
--    commit does), not a join with the batch. A plan made while the table was empty,
--    reused once it had filled, walked the whole primary key on every claim and matched
--    each entry against the batch: 0.3-0.7 s per claim in a fan-out of 10,000 children
--    started on an empty table. The same for the buckets a claim debits: found one probe
--    per key, updated by their tuple ids.
-- 2. `gd_claim` locks no more rows than the gates have room for. In 0015 it locked the
--    first $4 runnable rows and then claimed, of a gate's key, only as many as the key had
--    free slots: with one hot key and a demand above its room, most rows of each claim
--    were locked only to be handed back, and locked again by the next claim (5.3 row
--    locks, a WAL record each, per step claimed; a claim three times as long per row as
--    without a gate). Now `head` first reads those rows without locking them (only while
--    a gate is declared), and `bound` counts what can be claimed of them: every row
--    without a gate, and of each gate key at most its room. A key that is full counts its
--    rows too: `picked` skips them and reads on past them, to rows `head` did not see.
--    `picked` locks at most that many.
--
-- 3. Two nodes claiming one gate key at once no longer race for its free slots. Both
--    counted the same free slots from their snapshots and chose the same ones (each wants
--    all the room), so one claim failed on the slot index each time, and was retried up
--    to five times: with one hot key, 2 processes drained 518/s and 4 drained 175/s where
--    one drained 19,300/s. Now `gd_claim` first locks the gates of the head of the queue
--    (`FOR NO KEY UPDATE` of their `gd_gates` rows, in name order) and counts the free
--    slots in a second statement, whose snapshot sees the claim that went before.
--
-- The rest of each statement is 0015's.

CREATE OR REPLACE FUNCTION gd_claim(text, text[], int4[], int8, text, int8, timestamptz)
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    contended json, throttled json, next_due timestamptz, now timestamptz, flow boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $claim$
#variable_conflict use_column
BEGIN
-- Claims of a gate's keys take turns, across nodes: each first locks the gates of the rows
-- at the head of the queue, and only then, in a statement of its own (with a snapshot
-- taken after the lock, so it sees what the claim before it took), counts the free slots.
PERFORM 1 FROM gd_gates g
 WHERE g.name IN (SELECT hd.gate FROM gd_instances hd
                   WHERE hd.queue = $1
                     AND hd.status = 'runnable'
                     AND hd.eligible_at <= coalesce($7, now())
                     AND EXISTS (SELECT 1 FROM gd_gates)
                     AND (hd.fsm, hd.fsm_version) IN (SELECT * FROM unnest($2::text[], $3::int4[]))
                   ORDER BY hd.priority, hd.eligible_at, hd.id
                   LIMIT $4)
 ORDER BY g.name
   FOR NO KEY UPDATE OF g;
RETURN QUERY
WITH head AS MATERIALIZED (
    SELECT hd.gate, hd.partition_key
      FROM gd_instances hd
     WHERE hd.queue = $1
       AND hd.status = 'runnable'
       AND hd.eligible_at <= coalesce($7, now())
       AND EXISTS (SELECT 1 FROM gd_gates)
       AND (hd.fsm, hd.fsm_version) IN (SELECT * FROM unnest($2::text[], $3::int4[]))
     ORDER BY hd.priority, hd.eligible_at, hd.id
     LIMIT $4
), bound AS (
    SELECT CASE WHEN count(*) = 0 THEN $4
                ELSE sum(CASE WHEN r.gate IS NULL OR r.room <= 0 THEN r.n
                              ELSE least(r.n, r.room) END)::int8 END AS rows
      FROM (SELECT h.gate, h.partition_key, count(*) AS n,
                   min(g.size) - (SELECT count(*) FROM gd_instances e
                                   WHERE e.status = 'executing' AND e.gate = h.gate
                                     AND e.partition_key = h.partition_key) AS room
              FROM head h
              LEFT JOIN gd_gates g ON g.name = h.gate
             GROUP BY h.gate, h.partition_key) r
), picked AS MATERIALIZED (
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
     LIMIT (SELECT rows FROM bound)
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
    SELECT b.tid, b.name, b.key, b.tokens, b.at
      FROM (SELECT DISTINCT rate_limit, rate_key FROM wants ORDER BY 1, 2) w
     CROSS JOIN LATERAL (SELECT g.ctid AS tid, g.name, g.key, g.tokens, g.at
                           FROM gd_buckets g
                          WHERE g.name = w.rate_limit AND g.key = w.rate_key
                            FOR NO KEY UPDATE) b
), buckets AS MATERIALIZED (
    SELECT k.name, k.key, k.total, k.wanted, l.per_second, s.name IS NOT NULL AS stored, s.tid,
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
    UPDATE gd_buckets g
       SET tokens = (SELECT b.avail - b.total FROM buckets b WHERE b.tid = g.ctid),
           at = coalesce($7, now())
     WHERE g.ctid = ANY (ARRAY(SELECT tid FROM buckets WHERE stored))
    RETURNING g.name
), minted AS (
    INSERT INTO gd_buckets (name, key, tokens, at)
    SELECT b.name, b.key, b.avail - b.total, coalesce($7, now()) FROM buckets b WHERE NOT b.stored
    RETURNING name
), late AS (
    SELECT array_agg(o.id ORDER BY o.id) AS ids, array_agg(o.due ORDER BY o.id) AS dues
      FROM owed o
), deferred AS (
    UPDATE gd_instances i
       SET eligible_at = (SELECT dues FROM late)[width_bucket(i.id, (SELECT ids FROM late))],
           rate_paid = true, updated_at = coalesce($7, now())
     WHERE i.id = ANY ((SELECT ids FROM late)::int8[])
    RETURNING i.id
), admitted AS (
    SELECT array_agg(c.id ORDER BY c.id) AS ids, array_agg(c.slot ORDER BY c.id) AS slots
      FROM chosen c
     WHERE NOT EXISTS (SELECT 1 FROM owed o WHERE o.id = c.id)
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = $5, lease_epoch = i.lease_epoch + 1,
           lease_expires_at = coalesce($7, now()) + $6 * interval '1 millisecond',
           updated_at = coalesce($7, now()),
           gate_slot = (SELECT slots FROM admitted)[width_bucket(i.id, (SELECT ids FROM admitted))],
           rate_paid = false
     WHERE i.id = ANY ((SELECT ids FROM admitted)::int8[])
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

CREATE OR REPLACE FUNCTION gd_claim_plain(text, text[], int4[], int8, text, int8, timestamptz)
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
     WHERE i.id = ANY (ARRAY(SELECT id FROM chosen))
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
