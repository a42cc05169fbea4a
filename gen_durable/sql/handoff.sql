-- The hand-off of a gate key's slots (`gen_durable::store::pg::handoff`, the committer in
-- `engine/committer.rs`): a commit that ends gated rows hands each slot an ended row held,
-- in the same transaction, to the next runnable row of the same queue, gate and key, claimed
-- into it for the node that committed (queues with `QueueConfig::gate_handoff`, the
-- default). Without it a freed slot stayed free until the node's next claim (3–4 ms later):
-- a slot of a hot key was busy ~14 ms a turn for a step of ~7.

-- The hand-off. It needs no lock on the gate: it reuses only slots this transaction freed,
-- which no other transaction can see free before it commits, and only those below the
-- gate's size now. A key hands on its freed slots only while none of its running rows holds
-- a slot at or above the gate's size (one probe of the slot index, empty but after a gate
-- was made smaller); until those rows end, the key's freed slots are left to the claim,
-- which counts. The unique index over the executing rows' slots stays the guarantee.
--
-- Rows are locked with SKIP LOCKED, so it never waits, and it takes only what a claim
-- would: runnable, due, of a version the node runs, of a queue not paused, and neither
-- paying nor holding tokens (left to the claims, which debit the bucket) — and no row is
-- handed a slot while a row of a higher priority that a claim would take waits in its
-- queue (`bar`, dropped by an anti-join). Within a priority, a freed slot goes to its own
-- key's next row first; each key's candidates are numbered inside the key's own scan
-- (`row_number()` over the few rows the `LATERAL` returns, through `gd_instances_gate_next`).
--
-- The caller passes each ended row's slot as its claim returned it (`p_slots`), and the
-- hand-off returns the slot of each row it claims (`gate_slot`), so the next commit passes
-- it in turn; a NULL slot (a row the gated claim took, which returns none) is read from the
-- row. A slot passed in is trusted: the engine passes only rows whose outcome this
-- transaction committed and that no longer run; were it wrong, the slot index would refuse
-- the claim into a slot still held, and the engine commits the batch again without the
-- hand-off. The handed rows' inboxes and children are read in one pass each.
CREATE OR REPLACE FUNCTION gd_handoff(
    p_names    text[],
    p_versions int4[],
    p_node     text,
    p_lease_ms int8,
    p_now      timestamptz,
    p_ids      int8[],
    p_queues   text[],
    p_gates    text[],
    p_keys     text[],
    p_slots    int2[])
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, queue text, gate_slot int2)
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
    -- this transaction committed; `p_gates`, `p_keys` and `p_slots` the gate key and slot
    -- each was claimed in). A slot the caller does not know (NULL: a row the claim took,
    -- which returns no slot) is read by primary key, and only from a row that ended.
    SELECT f.queue, f.gate, f.key,
           array_agg(coalesce(f.slot, (SELECT i.gate_slot FROM gd_instances i
                                        WHERE i.id = f.id AND i.status <> 'executing')))
               AS slots
      FROM unnest(p_ids, p_queues, p_gates, p_keys, p_slots) f(id, queue, gate, key, slot)
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
    -- The key's next rows, as many as its slots, in pick order, each given the slot of its
    -- rank among them (numbered here, per key, over the few rows the scan returns).
    SELECT n.id, n.priority, n.eligible_at, k.queue, k.gate, k.key, k.slots[n.rn] AS slot
      FROM freed k
     CROSS JOIN LATERAL (
        SELECT o.*, row_number() OVER (ORDER BY o.priority, o.eligible_at, o.id) AS rn
          FROM (SELECT i.id, i.priority, i.eligible_at
                  FROM gd_instances i
                 WHERE i.queue = k.queue AND i.gate = k.gate AND i.partition_key = k.key
                   AND i.status = 'runnable'
                   AND i.eligible_at <= coalesce(p_now, now())
                   AND (i.fsm, i.fsm_version) IN (SELECT * FROM unnest(p_names, p_versions))
                   -- A row that pays tokens, or holds a reservation, starts by a claim,
                   -- which sees its bucket (R4-1).
                   AND NOT (i.rate_limit IS NOT NULL AND (i.rate_paid OR i.rate_step = i.step))
                 ORDER BY i.priority, i.eligible_at, i.id
                 LIMIT cardinality(k.slots)
                   FOR NO KEY UPDATE SKIP LOCKED) o) n
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
    SELECT array_agg(p.id ORDER BY p.id) AS ids, array_agg(p.slot ORDER BY p.id) AS slots
      FROM picked p
     WHERE NOT EXISTS (SELECT 1 FROM bar b
                        WHERE b.queue = p.queue AND b.gate = p.gate AND b.key = p.key
                          AND p.priority > b.priority)
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = p_node, lease_epoch = gd_lease_epoch(i.lease_epoch),
           lease_expires_at = coalesce(p_now, now()) + p_lease_ms * interval '1 millisecond',
           updated_at = coalesce(p_now, now()),
           gate_slot = (SELECT slots FROM chosen)[width_bucket(i.id, (SELECT ids FROM chosen))],
           rate_paid = false
     WHERE i.id = ANY ((SELECT ids FROM chosen)::int8[])
    RETURNING i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits, i.lease_epoch,
              i.partition_key, i.gate, i.queue, i.gate_slot
)
SELECT c.id, c.fsm, c.fsm_version, c.step, c.state, c.attempt, c.awaits, c.lease_epoch,
       c.partition_key, c.gate,
       coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'),
       coalesce(p_now, now()), c.queue, c.gate_slot
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

-- What nodes of a version before the slots were passed call: the hand-off with no slot
-- named (each ended row's slot is read from the row), returning the columns it returned
-- then. Kept so that a rolling deploy keeps their gate slots handed on.
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
LANGUAGE sql VOLATILE AS $$
    SELECT h.id, h.fsm, h.fsm_version, h.step, h.state, h.attempt, h.awaits, h.lease_epoch,
           h.partition_key, h.gate, h.inbox, h.children, h.now, h.queue
      FROM gd_handoff(p_names, p_versions, p_node, p_lease_ms, p_now, p_ids, p_queues,
                      p_gates, p_keys, array_fill(NULL::int2, ARRAY[cardinality(p_ids)])) h
$$;

-- A group commit that ends rows of a gate key, in one call that commits by itself: the
-- apply (`gd_commit_outcomes`), then the hand-off of the slots of the rows it ended, with
-- the same arguments the engine gives each. As BEGIN, apply, hand-off, COMMIT it was four
-- round trips, each paid by every row of a hot key waiting on that commit.
--
-- The rows the engine lists (`p_gated_ids`, each with the queue, gate, key and slot it was
-- claimed in) are all the batch's gated rows; a slot is handed on only for those whose
-- outcome the apply wrote (`committed`) and that do not run ahead (`continued`). Both run
-- under this statement's transaction: a failure of either rolls back both, and the engine
-- commits the batch again without the hand-off. Result: the apply's row first (its four
-- columns; the claim's columns NULL), then one row per row handed a slot (the apply's
-- columns NULL), as `gd_handoff` returns them.
CREATE FUNCTION gd_commit_handoff(
    p_node         text,
    p_ids          int8[],
    p_epochs       int8[],
    p_kinds        text[],
    p_steps        text[],
    p_states       jsonb[],
    p_results      jsonb[],
    p_errors       text[],
    p_delays       int8[],
    p_awaits       text[],
    p_children     int4[],
    p_run_ahead    bool[],
    p_consumed     int8[],
    p_seen         int8[],
    p_notify       text[],
    p_now          timestamptz,
    p_keyed        bool[],
    p_keys         text[],
    p_gates        text[],
    p_rate_limits  text[],
    p_rate_keys    text[],
    p_rate_weights float8[],
    p_names        text[],
    p_versions     int4[],
    p_lease_ms     int8,
    p_gated_ids    int8[],
    p_gated_queues text[],
    p_gated_gates  text[],
    p_gated_keys   text[],
    p_gated_slots  int2[],
    p_history      int2[] DEFAULT NULL,
    p_ran_us       int8[] DEFAULT NULL)
RETURNS TABLE (committed int8[], continued int8[], at timestamptz, deferred int8[],
    id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, queue text, gate_slot int2)
LANGUAGE plpgsql
AS $commit$
DECLARE
    a record;
    e record;
BEGIN
    SELECT o.committed, o.continued, o.at, o.deferred INTO a
      FROM gd_commit_outcomes(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states, p_results,
                              p_errors, p_delays, p_awaits, p_children, p_run_ahead,
                              p_consumed, p_seen, p_notify, p_now, p_keyed, p_keys, p_gates,
                              p_rate_limits, p_rate_keys, p_rate_weights, p_history,
                              p_ran_us) o;
    committed := a.committed;
    continued := a.continued;
    at := a.at;
    deferred := a.deferred;
    RETURN NEXT;
    committed := NULL;
    continued := NULL;
    at := NULL;
    deferred := NULL;
    SELECT array_agg(f.id) AS ids, array_agg(f.queue) AS queues, array_agg(f.gate) AS gates,
           array_agg(f.key) AS keys, array_agg(f.slot) AS slots INTO e
      FROM unnest(p_gated_ids, p_gated_queues, p_gated_gates, p_gated_keys, p_gated_slots)
           f(id, queue, gate, key, slot)
     WHERE f.id = ANY (a.committed) AND NOT f.id = ANY (a.continued);
    IF e.ids IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::int8[], NULL::int8[], NULL::timestamptz, NULL::int8[], h.*
          FROM gd_handoff(p_names, p_versions, p_node, p_lease_ms, p_now,
                          e.ids, e.queues, e.gates, e.keys, e.slots) h;
    END IF;
END
$commit$;

-- What nodes of a version before the slots were passed call (29 arguments), as for
-- `gd_handoff` above.
CREATE FUNCTION gd_commit_handoff(
    p_node         text,
    p_ids          int8[],
    p_epochs       int8[],
    p_kinds        text[],
    p_steps        text[],
    p_states       jsonb[],
    p_results      jsonb[],
    p_errors       text[],
    p_delays       int8[],
    p_awaits       text[],
    p_children     int4[],
    p_run_ahead    bool[],
    p_consumed     int8[],
    p_seen         int8[],
    p_notify       text[],
    p_now          timestamptz,
    p_keyed        bool[],
    p_keys         text[],
    p_gates        text[],
    p_rate_limits  text[],
    p_rate_keys    text[],
    p_rate_weights float8[],
    p_names        text[],
    p_versions     int4[],
    p_lease_ms     int8,
    p_gated_ids    int8[],
    p_gated_queues text[],
    p_gated_gates  text[],
    p_gated_keys   text[])
RETURNS TABLE (committed int8[], continued int8[], at timestamptz, deferred int8[],
    id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, queue text)
LANGUAGE sql VOLATILE AS $$
    SELECT c.committed, c.continued, c.at, c.deferred, c.id, c.fsm, c.fsm_version, c.step,
           c.state, c.attempt, c.awaits, c.lease_epoch, c.partition_key, c.gate, c.inbox,
           c.children, c.now, c.queue
      FROM gd_commit_handoff(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states, p_results,
                             p_errors, p_delays, p_awaits, p_children, p_run_ahead,
                             p_consumed, p_seen, p_notify, p_now, p_keyed, p_keys, p_gates,
                             p_rate_limits, p_rate_keys, p_rate_weights, p_names, p_versions,
                             p_lease_ms, p_gated_ids, p_gated_queues, p_gated_gates,
                             p_gated_keys,
                             array_fill(NULL::int2, ARRAY[cardinality(p_gated_ids)])) c
$$;
