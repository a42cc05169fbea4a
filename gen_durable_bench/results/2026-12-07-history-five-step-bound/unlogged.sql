-- The engine as built, its commit called through the same SQL wrapper in each variant,
-- with history level steps, as the engine passes it (the bench FSMs declare no level).
ALTER FUNCTION gd_commit_outcomes(text, int8[], int8[], text[], text[], jsonb[], jsonb[], text[], int8[], text[], int4[],
    bool[], int8[], int8[], text[], timestamptz, bool[], text[], text[], text[], text[], float8[],
    int2[], int8[]) RENAME TO gd_commit_outcomes_bench;
CREATE FUNCTION gd_commit_outcomes(p_node text, p_ids int8[], p_epochs int8[], p_kinds text[], p_steps text[], p_states jsonb[],
    p_results jsonb[], p_errors text[], p_delays int8[], p_awaits text[], p_children int4[],
    p_run_ahead bool[], p_consumed int8[], p_seen int8[], p_notify text[], p_now timestamptz,
    p_keyed bool[], p_keys text[], p_gates text[], p_rate_limits text[], p_rate_keys text[],
    p_rate_weights float8[], p_history int2[] DEFAULT NULL, p_ran_us int8[] DEFAULT NULL,
    OUT committed int8[], OUT continued int8[], OUT at timestamptz, OUT deferred int8[]
) LANGUAGE sql VOLATILE AS $$
    SELECT f.committed, f.continued, f.at, f.deferred
      FROM gd_commit_outcomes_bench(p_node, p_ids, p_epochs, p_kinds, p_steps, p_states,
               p_results, p_errors, p_delays, p_awaits, p_children, p_run_ahead, p_consumed,
               p_seen, p_notify, p_now, p_keyed, p_keys, p_gates, p_rate_limits, p_rate_keys,
               p_rate_weights, p_history, p_ran_us) f
$$;
DO $x$ DECLARE r record; BEGIN FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'gd_history'::regclass LOOP EXECUTE format('ALTER TABLE %I SET UNLOGGED', r.relname); END LOOP; END $x$;
