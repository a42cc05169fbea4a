-- The hand-off of 0019 and the claim of 0016, each cheaper per row (PERFORMANCE.md, "Flow
-- control"). Same arguments, same results.
--
-- `gd_handoff`:
-- 1. A key's room is no longer counted. 0019 counted the key's executing rows on every
--    hand-off (with one hot key of K = 256, ~550 index entries and heap visits per call,
--    ~7 per row handed on) to hand on no more slots than the key has room for after a
--    gate was made smaller. Now a key hands on its freed slots below the gate's size only
--    while none of its running rows holds a slot at or above that size: then every row
--    running holds a distinct slot below it, and so will every row handed one. That is one
--    probe of the slot index, empty but after a gate was made smaller; until the rows
--    above its new size end, the key's freed slots are left to the claim, which counts.
-- 2. The handed rows' inboxes and children are read in one pass each over the rows handed
--    on, not by a subquery per row.
--
-- `gd_claim` (the claim while a gate or a rate limit is declared) and the new
-- `gd_claim_rated`:
-- 3. The rate-limit fields of the chosen rows come along with them, not by joining the
--    chosen rows back to the picked ones.
-- 4. A bucket's tokens wanted are summed per bucket; the running sum in pick order, which
--    says which rows are past what the bucket holds, is computed only for buckets short
--    of tokens (none while tokens are plentiful).
-- 5. While rate limits are declared and no gate is, `gd_claim` hands the claim to
--    `gd_claim_rated`: `gd_claim_plain` with the rate-limit CTEs of `gd_claim` (3 and 4),
--    without the gates' (the head of the queue read twice, the room of each key, the full
--    keys, the free slots, the lock of the gates). Rows that name a gate are left to
--    `gd_claim`, as `gd_claim_plain` leaves them: a gate declared between the check and the
--    claim has its rows claimed from the next pick on. The gates' work cost a drain of
--    rate-limited rows ~7% of its rate (PERFORMANCE.md).
-- Both keep 0018's `jit = off` (CREATE OR REPLACE resets a function's settings).

CREATE OR REPLACE FUNCTION gd_handoff(
    p_names    text[],
    p_versions int4[],
    p_node     text,
    p_lease_ms int8,
    p_now      timestamptz,
    p_ids      int8[],
    p_queues   text[],
    p_gates    text[],
    p_keys     text[])
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, queue text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $handoff$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH ended AS (
    -- The slots the caller's rows held and no longer hold (`p_ids` are rows whose outcome
    -- this transaction committed; `p_gates` and `p_keys` the gate key each was claimed in),
    -- by primary key.
    SELECT f.queue, f.gate, f.key, array_agg(i.gate_slot) AS slots
      FROM unnest(p_ids, p_queues, p_gates, p_keys) f(id, queue, gate, key)
      JOIN gd_instances i ON i.id = f.id
     WHERE i.status <> 'executing'
     GROUP BY f.queue, f.gate, f.key
), freed AS MATERIALIZED (
    -- Per key of a queue not paused, those below the gate's size now, while no running
    -- row of the key holds a slot at or above it (see 1 above).
    SELECT e.queue, e.gate, e.key,
           ARRAY(SELECT s FROM unnest(e.slots) s WHERE s < g.size ORDER BY s) AS slots
      FROM ended e
      JOIN gd_gates g ON g.name = e.gate
     WHERE NOT EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = e.queue)
       AND NOT EXISTS (SELECT 1 FROM gd_instances x
                        WHERE x.status = 'executing' AND x.gate = e.gate
                          AND x.partition_key = e.key AND x.gate_slot >= g.size)
), picked AS MATERIALIZED (
    -- The key's next rows, as many as its slots, in pick order.
    SELECT n.id, n.priority, n.eligible_at, k.queue, k.gate, k.key, k.slots,
           row_number() OVER (PARTITION BY k.queue, k.gate, k.key
                              ORDER BY n.priority, n.eligible_at, n.id) AS rn
      FROM freed k
     CROSS JOIN LATERAL (
        SELECT i.id, i.priority, i.eligible_at
          FROM gd_instances i
         WHERE i.queue = k.queue AND i.gate = k.gate AND i.partition_key = k.key
           AND i.status = 'runnable'
           AND i.eligible_at <= coalesce(p_now, now())
           AND (i.fsm, i.fsm_version) IN (SELECT * FROM unnest(p_names, p_versions))
           AND NOT (i.rate_limit IS NOT NULL AND i.rate_step = i.step AND NOT i.rate_paid)
         ORDER BY i.priority, i.eligible_at, i.id
         LIMIT cardinality(k.slots)
           FOR NO KEY UPDATE SKIP LOCKED) n
), bar AS (
    -- Priorities first: the highest-priority row of the queue, above the key's candidates,
    -- that a claim would take (due, of a version the node runs, not of a K = 1 key running
    -- now, not of a full gate key). Only candidates of its priority or higher are handed
    -- their slots; the others are left to the picker's claim, which takes that row first.
    -- Within a priority a freed slot goes to its own key's next row. (Only rows of a
    -- higher priority are read, none in the usual case of one priority.)
    SELECT l.queue, l.gate, l.key, b.priority
      FROM (SELECT p.queue, p.gate, p.key, max(p.priority) AS priority
              FROM picked p GROUP BY p.queue, p.gate, p.key) l
     CROSS JOIN LATERAL (
        SELECT h.priority
          FROM gd_instances h
         WHERE h.queue = l.queue
           AND h.status = 'runnable'
           AND h.priority < l.priority
           AND h.eligible_at <= coalesce(p_now, now())
           AND (h.fsm, h.fsm_version) IN (SELECT * FROM unnest(p_names, p_versions))
           AND NOT EXISTS (SELECT 1 FROM gd_instances e
                            WHERE e.partition_key = h.partition_key AND e.status = 'executing'
                              AND e.gate IS NULL AND h.gate IS NULL)
           AND NOT coalesce((SELECT count(*) FROM gd_instances e
                              WHERE e.status = 'executing' AND e.gate = h.gate
                                AND e.partition_key = h.partition_key)
                            >= (SELECT g.size FROM gd_gates g WHERE g.name = h.gate), false)
         ORDER BY h.priority, h.eligible_at, h.id
         LIMIT 1) b
), chosen AS (
    SELECT array_agg(p.id ORDER BY p.id) AS ids, array_agg(p.slots[p.rn] ORDER BY p.id) AS slots
      FROM picked p
      LEFT JOIN bar b ON b.queue = p.queue AND b.gate = p.gate AND b.key = p.key
     WHERE b.priority IS NULL OR p.priority <= b.priority
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = p_node, lease_epoch = i.lease_epoch + 1,
           lease_expires_at = coalesce(p_now, now()) + p_lease_ms * interval '1 millisecond',
           updated_at = coalesce(p_now, now()),
           gate_slot = (SELECT slots FROM chosen)[width_bucket(i.id, (SELECT ids FROM chosen))],
           rate_paid = false
     WHERE i.id = ANY ((SELECT ids FROM chosen)::int8[])
    RETURNING i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits, i.lease_epoch,
              i.partition_key, i.gate, i.queue
)
SELECT c.id, c.fsm, c.fsm_version, c.step, c.state, c.attempt, c.awaits, c.lease_epoch,
       c.partition_key, c.gate,
       coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'),
       coalesce(p_now, now()), c.queue
  FROM claimed c
  LEFT JOIN (SELECT s.target_id, json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id) AS inbox
               FROM gd_signals s WHERE s.target_id = ANY ((SELECT ids FROM chosen)::int8[])
              GROUP BY s.target_id) sg ON sg.target_id = c.id
  LEFT JOIN (SELECT ch.parent_id, json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id) AS children
               FROM gd_instances ch WHERE ch.parent_id = ANY ((SELECT ids FROM chosen)::int8[])
              GROUP BY ch.parent_id) kid ON kid.parent_id = c.id
 ORDER BY c.id;
END
$handoff$;

CREATE FUNCTION gd_claim_rated(text, text[], int4[], int8, text, int8, timestamptz)
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    contended json, throttled json, next_due timestamptz, now timestamptz, flow boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
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
                          AND e.gate IS NULL)
       AND i.gate IS NULL
     ORDER BY i.priority, i.eligible_at, i.id
     LIMIT $4
       FOR NO KEY UPDATE SKIP LOCKED
), chosen AS (
    -- The first row of each K = 1 key.
    SELECT r.id, r.priority, r.eligible_at, r.rate_limit, r.rate_key, r.rate_weight, r.rate_due
      FROM (SELECT p.*, row_number() OVER (PARTITION BY p.partition_key
                                           ORDER BY p.priority, p.eligible_at, p.id) AS rn
              FROM picked p) r
     WHERE r.partition_key IS NULL OR r.rn = 1
), wants AS (
    -- The chosen rows that owe tokens.
    SELECT c.id, c.rate_limit, c.rate_key, c.rate_weight, c.priority, c.eligible_at
      FROM chosen c
     WHERE c.rate_due
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
      FROM (SELECT rate_limit AS name, rate_key AS key, sum(rate_weight) AS total,
                   count(*) AS wanted
              FROM wants GROUP BY 1, 2) k
      JOIN gd_rate_limits l ON l.name = k.name
      LEFT JOIN stored s ON s.name = k.name AND s.key = k.key
), owed AS (
    -- Of the buckets short of tokens only (none while tokens are plentiful), the rows past
    -- what the bucket holds, in pick order.
    SELECT o.id, o.rate_limit, o.rate_key,
           coalesce($7, now()) + (o.upto - o.avail) / o.per_second * interval '1 second' AS due
      FROM (SELECT w.id, w.rate_limit, w.rate_key, b.avail, b.per_second,
                   sum(w.rate_weight) OVER (PARTITION BY w.rate_limit, w.rate_key
                                            ORDER BY w.priority, w.eligible_at, w.id) AS upto
              FROM wants w JOIN buckets b ON b.name = w.rate_limit AND b.key = w.rate_key
             WHERE b.total > b.avail) o
     WHERE o.upto > o.avail
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
    SELECT array_agg(c.id ORDER BY c.id) AS ids
      FROM chosen c
     WHERE NOT EXISTS (SELECT 1 FROM owed o WHERE o.id = c.id)
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = $5, lease_epoch = i.lease_epoch + 1,
           lease_expires_at = coalesce($7, now()) + $6 * interval '1 millisecond',
           updated_at = coalesce($7, now()),
           gate_slot = NULL,
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

CREATE OR REPLACE FUNCTION gd_claim(text, text[], int4[], int8, text, int8, timestamptz)
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    contended json, throttled json, next_due timestamptz, now timestamptz, flow boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $claim$
#variable_conflict use_column
BEGIN
-- While no gate is declared, the claim without the gates' work (5 in the header).
IF NOT EXISTS (SELECT 1 FROM gd_gates) THEN
    RETURN QUERY SELECT * FROM gd_claim_rated($1, $2, $3, $4, $5, $6, $7);
    RETURN;
END IF;
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
    SELECT id, partition_key, gate, priority, eligible_at, rate_limit, rate_key, rate_weight,
           rate_due,
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
    SELECT r.id, f.slots[r.rn] AS slot, r.priority, r.eligible_at, r.rate_limit, r.rate_key,
           r.rate_weight, r.rate_due
      FROM ranked r
      LEFT JOIN free f ON f.gate = r.gate AND f.partition_key = r.partition_key
     WHERE CASE WHEN r.gate IS NULL THEN r.partition_key IS NULL OR r.rn = 1
                ELSE r.rn <= least(f.room, cardinality(f.slots)) END
), wants AS (
    -- The chosen rows that owe tokens.
    SELECT c.id, c.rate_limit, c.rate_key, c.rate_weight, c.priority, c.eligible_at
      FROM chosen c
     WHERE c.rate_due
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
      FROM (SELECT rate_limit AS name, rate_key AS key, sum(rate_weight) AS total,
                   count(*) AS wanted
              FROM wants GROUP BY 1, 2) k
      JOIN gd_rate_limits l ON l.name = k.name
      LEFT JOIN stored s ON s.name = k.name AND s.key = k.key
), owed AS (
    -- Of the buckets short of tokens only (none while tokens are plentiful), the rows past
    -- what the bucket holds, in pick order.
    SELECT o.id, o.rate_limit, o.rate_key,
           coalesce($7, now()) + (o.upto - o.avail) / o.per_second * interval '1 second' AS due
      FROM (SELECT w.id, w.rate_limit, w.rate_key, b.avail, b.per_second,
                   sum(w.rate_weight) OVER (PARTITION BY w.rate_limit, w.rate_key
                                            ORDER BY w.priority, w.eligible_at, w.id) AS upto
              FROM wants w JOIN buckets b ON b.name = w.rate_limit AND b.key = w.rate_key
             WHERE b.total > b.avail) o
     WHERE o.upto > o.avail
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
