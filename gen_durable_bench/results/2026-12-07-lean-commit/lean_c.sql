-- Experiment (lean_b planned generically): a lean commit for a batch of plain `done` outcomes (no parent, no cancel,
-- no signals consumed): one statement locks, fences (against this node's batches, read once) and writes; then the inbox delete.
-- Anything else goes to the full function, renamed.
ALTER FUNCTION gd_commit_outcomes(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[],
    int8[], text[], int4[], bool[], int8[], int8[], text[], timestamptz, bool[], text[], text[],
    text[], text[], float8[]) RENAME TO gd_commit_outcomes_full;
CREATE FUNCTION gd_commit_outcomes(
    p_node text, p_ids int8[], p_epochs int8[], p_kinds text[], p_steps text[], p_states jsonb[],
    p_results jsonb[], p_errors text[], p_delays int8[], p_awaits text[], p_children int4[],
    p_run_ahead bool[], p_consumed int8[], p_seen int8[], p_notify text[], p_now timestamptz,
    p_keyed bool[], p_keys text[], p_gates text[], p_rate_limits text[], p_rate_keys text[],
    p_rate_weights float8[],
    OUT committed int8[], OUT continued int8[], OUT at timestamptz, OUT deferred int8[]
) LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    t timestamptz := coalesce(p_now, statement_timestamp());
BEGIN
    IF coalesce(cardinality(p_consumed), 0) = 0 AND 'done' = ALL (p_kinds) THEN
        WITH held AS MATERIALIZED (
            SELECT l.queue, l.fsm, l.priority, b.lo, b.hi
              FROM gd_batches b JOIN gd_lanes l ON l.lane = b.lane
             WHERE b.node = p_node
        ), l AS MATERIALIZED (
            SELECT i.id FROM gd_instances i
             WHERE i.id = ANY (p_ids)
               AND i.locked_by IS NULL AND i.status = 'runnable'
               AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
               AND NOT i.cancel_requested AND i.parent_id IS NULL
               AND EXISTS (SELECT 1 FROM held h
                            WHERE h.queue = i.queue AND h.fsm = i.fsm AND h.priority = i.priority
                              AND h.lo <= i.ready_seq AND h.hi > i.ready_seq)
             ORDER BY i.id
               FOR NO KEY UPDATE SKIP LOCKED
        ), u AS (
            UPDATE gd_instances i
               SET (step, state, result, last_error) = (
                       SELECT coalesce(p_steps[x.n], i.step), coalesce(p_states[x.n], i.state),
                              p_results[x.n], p_errors[x.n]
                         FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
                   status = 'done', awaits = '{}', await_deadline = NULL, updated_at = t,
                   ready_seq = NULL
             WHERE i.id IN (SELECT id FROM l)
               AND (SELECT count(*) FROM l) = cardinality(p_ids)
            RETURNING i.id
        )
        SELECT array_agg(id ORDER BY id) INTO committed FROM u;
        IF cardinality(committed) = cardinality(p_ids) THEN
            DELETE FROM gd_signals s WHERE s.target_id = ANY (committed);
            continued := '{}'; deferred := '{}'; at := t;
            RETURN;
        END IF;
    END IF;
    SELECT f.committed, f.continued, f.at, f.deferred INTO committed, continued, at, deferred
      FROM gd_commit_outcomes_full(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states, p_results,
                                   p_errors, p_delays, p_awaits, p_children, p_run_ahead,
                                   p_consumed, p_seen, p_notify, p_now, p_keyed, p_keys, p_gates,
                                   p_rate_limits, p_rate_keys, p_rate_weights) f;
END
$$;
