-- What nodes of the version before 0027 call, so that a rolling deploy keeps their gate
-- slots handed on (as 0013 did for the commit): `gd_handoff` and `gd_commit_handoff` with
-- their earlier arguments and results. Each calls the function of 0027 with no slot named
-- (NULL: each ended row's slot is read from the row, as before 0027) and returns the
-- columns it returned then. Without them such a node's hand-offs failed on a missing
-- function, and its commits went on without them after a warning each.

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
