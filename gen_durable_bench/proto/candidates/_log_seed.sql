WITH i AS (
    INSERT INTO p_instances (fsm, fsm_version, step, state, queue, log_seq)
    SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default', nextval('p_log_seq')
      FROM generate_series(1, $1) g
    RETURNING id, log_seq)
INSERT INTO p_log (seq, id) SELECT log_seq, id FROM i ORDER BY log_seq
