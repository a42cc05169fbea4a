-- A group commit that ends rows of a gate key, in one statement (PERFORMANCE.md, "Flow
-- control"; the committer in `gen_durable::engine::committer`, the statement in
-- `gen_durable::store::pg::outcome`).
--
-- Such a commit was a transaction of four round trips: BEGIN, the apply
-- (`gd_commit_outcomes`), the hand-off (`gd_handoff`, 0019/0020) and COMMIT. Every row of
-- a hot gate key waits for that commit, and the key's freed slots stay unused until it
-- ends, so each round trip was paid by the whole key. `gd_commit_handoff` runs the two
-- statements in one call, which commits by itself: the apply, then the hand-off of the
-- slots of the rows it ended, with the same arguments the engine gave each.
--
-- The rows the engine lists (`p_gated_ids`, each with the queue, gate and key it was
-- claimed in) are all the batch's gated rows; a slot is handed on only for those whose
-- outcome the apply wrote (`committed`) and that do not run ahead (`continued`): the
-- engine's rule, so the hand-off reads the same rows it did. Both run under this
-- statement's transaction, as before: a failure of either rolls back both, and the
-- engine commits the batch again without the hand-off.
--
-- Result: the apply's row first (its four columns; the claim's columns NULL), then one row
-- per row handed a slot (the apply's columns NULL), as `gd_handoff` returns them.

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
                              p_rate_limits, p_rate_keys, p_rate_weights) o;
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
           array_agg(f.key) AS keys INTO e
      FROM unnest(p_gated_ids, p_gated_queues, p_gated_gates, p_gated_keys)
           f(id, queue, gate, key)
     WHERE f.id = ANY (a.committed) AND NOT f.id = ANY (a.continued);
    IF e.ids IS NOT NULL THEN
        RETURN QUERY
        SELECT NULL::int8[], NULL::int8[], NULL::timestamptz, NULL::int8[], h.*
          FROM gd_handoff(p_names, p_versions, p_node, p_lease_ms, p_now,
                          e.ids, e.queues, e.gates, e.keys) h;
    END IF;
END
$commit$;
