-- The hand-off of a gate key's slots (PERFORMANCE.md, "Flow control"; the committer in
-- `gen_durable::engine::committer`, the statement in `gen_durable::store::pg::handoff`).
--
-- A commit that ends gated rows (a group commit, or a step's own transaction) calls
-- `gd_handoff` in its transaction, after the outcomes: each slot an ended row held goes at
-- once to the next runnable row of the same queue, gate and key, which is claimed into it
-- for the node that committed (on queues with `QueueConfig::gate_handoff`, the default). Without it a
-- freed slot stayed free until the node's next claim, which started after the commit and
-- took 3-4 ms: a slot of a hot key was busy ~14 ms a turn for a step of ~7, and one hot
-- gate of K = 256 drained at 0.60x the ungated rate.
--
-- It needs no lock on the gate: it reuses only slots this transaction freed, which no
-- other transaction can see free before it commits, and only those below the gate's size
-- now, within the key's room (a gate made smaller admits nothing until fewer than its new
-- size run). The unique index over the executing rows' slots stays the guarantee. Rows
-- are locked with SKIP LOCKED, so the hand-off never waits, and it takes only what a
-- claim would: runnable, due, of a
-- version the node runs, of a queue not paused, and owing no tokens (a row whose rate
-- limit must still be paid is left to the claim, which debits its bucket) — and no row
-- is handed a slot while a row of a higher priority that a claim would take waits in its
-- queue. Within a priority, a freed slot goes to its own key's next row first.

-- The runnable rows of each gate key, in pick order: the hand-off reads the next rows of
-- one key without reading past the rest of its queue. Gated rows only.
CREATE INDEX gd_instances_gate_next ON gd_instances (queue, gate, partition_key, priority, eligible_at, id)
    WHERE status = 'runnable' AND gate IS NOT NULL;

CREATE FUNCTION gd_handoff(
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
    -- Per key of a queue not paused, those below the gate's size now, and no more than
    -- the key's room: after a gate was made smaller, no row is admitted until fewer than
    -- its new size run (the claim's rule).
    SELECT e.queue, e.gate, e.key,
           (ARRAY(SELECT s FROM unnest(e.slots) s WHERE s < g.size ORDER BY s))
               [1:g.size - (SELECT count(*) FROM gd_instances x
                             WHERE x.status = 'executing' AND x.gate = e.gate
                               AND x.partition_key = e.key)] AS slots
      FROM ended e
      JOIN gd_gates g ON g.name = e.gate
     WHERE NOT EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = e.queue)
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
       (SELECT coalesce(json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id), '[]')
          FROM gd_signals s WHERE s.target_id = c.id) AS inbox,
       (SELECT coalesce(json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id), '[]')
          FROM gd_instances ch WHERE ch.parent_id = c.id) AS children,
       coalesce(p_now, now()), c.queue
  FROM claimed c
 ORDER BY c.id;
END
$handoff$;
