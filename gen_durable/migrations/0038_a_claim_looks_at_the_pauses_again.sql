-- A claim of the log looks at the queue's pauses again once it holds its lanes. It looked
-- only as it began, and its watermark waits for the lanes' appenders in flight: a claim
-- that began before a pause and waited for a step's commit then took the entry that commit
-- appended, after the pause, and a step ran in a paused queue (R4-3, seen in CI; the test
-- `schema_log::a_claim_that_waited_for_an_appender_takes_nothing_once_its_queue_is_paused`).

CREATE OR REPLACE FUNCTION gd_advance(p_queue text, p_names text[], p_demand int8, p_node text,
                           p_lease_ms int8, p_now timestamptz)
RETURNS TABLE (lane integer, batch bigint, lo bigint, hi bigint, keyed boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    t      timestamptz := coalesce(p_now, statement_timestamp());
    want   int8 := p_demand;
    due    int8[];
    ticks  int4[];
    top    int8;
    c      record;
    n      int8;
    h      int8;
    b      int8;
BEGIN
    IF p_demand <= 0 OR EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = p_queue) THEN
        RETURN;
    END IF;
    -- Rows of the queue claimed by themselves are due too (one probe of the pick index),
    -- or wait for tokens they reserved (their claim says when they are due): half the
    -- demand is left to their claim, which the engine runs only then.
    IF EXISTS (SELECT 1 FROM gd_instances i
                WHERE i.queue = p_queue AND i.status = 'runnable'
                  AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL
                       OR i.rate_limit IS NOT NULL)
                  AND (i.eligible_at <= t OR i.rate_paid) AND i.fsm = ANY (p_names)) THEN
        want := greatest(p_demand / 2, 1);
        lane := NULL; batch := NULL; lo := NULL; hi := NULL; keyed := true;
        RETURN NEXT;
    END IF;
    keyed := false;
    WITH d AS (
        DELETE FROM gd_due d
         WHERE d.queue = p_queue AND d.at <= t
           AND d.id IN (SELECT i.id FROM gd_instances i WHERE i.id = d.id AND i.fsm = ANY (p_names))
        RETURNING d.id
    )
    SELECT array_agg(DISTINCT d.id) INTO due FROM d;
    IF due IS NOT NULL THEN
        INSERT INTO gd_lanes (queue, fsm, priority)
        SELECT DISTINCT i.queue, i.fsm, i.priority FROM gd_instances i
         WHERE i.id = ANY (due)
           AND NOT EXISTS (SELECT 1 FROM gd_lanes l WHERE l.queue = i.queue AND l.fsm = i.fsm
                              AND l.priority = i.priority)
        ON CONFLICT DO NOTHING;
    END IF;
    -- The lanes to tick: those whose settled range is used up, and those of the due rows.
    SELECT coalesce(array_agg(l.lane ORDER BY l.lane)
                        FILTER (WHERE l.next_seq >= l.safe_hi OR l.lane = ANY (x.due_lanes)), '{}')
      INTO ticks
      FROM (SELECT l.lane, l.next_seq, l.safe_hi FROM gd_lanes l
             WHERE l.queue = p_queue AND l.fsm = ANY (p_names)
             ORDER BY l.lane
               FOR NO KEY UPDATE) l,
           (SELECT ARRAY(SELECT l.lane FROM gd_instances i
                           JOIN gd_lanes l ON l.queue = i.queue AND l.fsm = i.fsm
                                          AND l.priority = i.priority
                          WHERE i.id = ANY (due)) AS due_lanes) x;
    IF cardinality(ticks) > 0 THEN
        PERFORM pg_advisory_xact_lock(1734631276, k) FROM unnest(ticks) k;
        IF due IS NOT NULL THEN
            PERFORM gd_append(due, p_now, true);
        END IF;
        SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
          INTO top FROM gd_ready_seq s;
        UPDATE gd_lanes l SET safe_hi = top WHERE l.lane = ANY (ticks);
    END IF;
    -- The lanes are held now, and this claim may have waited for their appenders (or for
    -- another claim): a pause committed meanwhile holds what they appended too (R4-3).
    IF EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = p_queue) THEN
        RETURN;
    END IF;
    FOR c IN SELECT l.lane, l.next_seq, l.safe_hi, l.last_batch FROM gd_lanes l
              WHERE l.queue = p_queue AND l.fsm = ANY (p_names) AND l.next_seq < l.safe_hi
              ORDER BY l.priority, l.next_seq
    LOOP
        SELECT count(*), max(r.seq) INTO n, h FROM (
            SELECT r.seq FROM gd_ready r
             WHERE r.lane = c.lane AND r.seq >= c.next_seq AND r.seq < c.safe_hi
             ORDER BY r.seq
             LIMIT want) r;
        -- Up to the watermark when the lane's settled entries are all taken.
        h := CASE WHEN n < want THEN c.safe_hi ELSE h + 1 END;
        IF n = 0 THEN
            UPDATE gd_lanes l SET next_seq = h WHERE l.lane = c.lane;
            CONTINUE;
        END IF;
        b := greatest(c.last_batch + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::int8);
        UPDATE gd_lanes l SET next_seq = h, last_batch = b WHERE l.lane = c.lane;
        INSERT INTO gd_batches (lane, batch, lo, hi, node, expires_at)
        VALUES (c.lane, b, c.next_seq, h, p_node, t + p_lease_ms * interval '1 millisecond');
        lane := c.lane; batch := b; lo := c.next_seq; hi := h;
        RETURN NEXT;
        want := want - n;
        EXIT WHEN want <= 0;
    END LOOP;
END
$$;
