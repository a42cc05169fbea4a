-- Storage v2, step one: plain rows (no K = 1 key, no gate, no rate limit) move to the
-- ready log (docs/design/storage-v2.md; gen_durable/sql/log.sql says what each part is).
-- A claim takes ranges of their entries and writes nothing per row; a step's outcome
-- writes the row once, fenced by its entry (`ready_seq`). Rows with a key, a gate or a
-- limit stay on the row-by-row claims, whose pick index now holds only them.
--
-- Deploy: stop every node of an earlier version before this migration runs (an earlier
-- node would claim no plain row: its claim functions are replaced here), then start the
-- new ones. A row executing on an earlier node when it stopped is reaped as before and
-- then gets its entry. The runnable plain rows get their entries here, in pick order.
-- The migration refuses to run while a node was seen in the last minute (`gd_nodes`, the
-- window the dashboard calls live): every node announced then is of an earlier version.

DO $refuse$
DECLARE
    live text;
BEGIN
    SELECT string_agg(node_id, ', ' ORDER BY node_id) INTO live FROM gd_nodes
     WHERE last_seen_at > now() - interval '60 seconds';
    IF live IS NOT NULL THEN
        RAISE EXCEPTION 'gen_durable schema migration 32 (the ready log) needs every node of the earlier version stopped first; live in the last minute: %', live
            USING HINT = 'Stop those nodes (a node stopped gracefully leaves gd_nodes at once; one that crashed stops counting a minute after it was last seen), then migrate again.';
    END IF;
END
$refuse$;

ALTER TABLE gd_instances ADD COLUMN ready_seq bigint;

DROP INDEX gd_instances_pick;
CREATE INDEX gd_instances_pick ON gd_instances (queue, priority, eligible_at, id)
    WHERE status = 'runnable'
      AND (partition_key IS NOT NULL OR gate IS NOT NULL OR rate_limit IS NOT NULL);

CREATE SEQUENCE gd_ready_seq;

-- A lane: the entries of one (queue, FSM, priority). A node claims only the lanes of the
-- FSMs it runs; a claim serves the most urgent priority first. The row is the lane's
-- cursor: entries below `next_seq` are taken, entries below `safe_hi` are settled (every
-- transaction that took a seq below it has ended; see `gd_advance`). Updated once per
-- claim of the lane, so its pages are left mostly free.
CREATE TABLE gd_lanes (
    lane       integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text        NOT NULL,
    fsm        text        NOT NULL,
    priority   smallint    NOT NULL,
    next_seq   bigint      NOT NULL DEFAULT 1,
    safe_hi    bigint      NOT NULL DEFAULT 1,
    last_batch bigint      NOT NULL DEFAULT 0,
    CONSTRAINT gd_lanes_key UNIQUE (queue, fsm, priority)
) WITH (fillfactor = 10);

-- The log: one entry per time a row became ready. Nothing updates an entry; a row that
-- moved on (its step committed, it was cancelled, reaped and appended again) leaves its
-- old entry behind, which a read skips (`ready_seq` differs). Reclaimed by whole ranges of
-- seq (partitions), never by DELETE.
CREATE TABLE gd_ready (
    lane integer NOT NULL,
    seq  bigint  NOT NULL,
    id   bigint  NOT NULL
) PARTITION BY RANGE (seq);

CREATE TABLE gd_ready_default PARTITION OF gd_ready DEFAULT;

-- A claim counts a lane's entries in a range, a read joins them to their rows.
CREATE INDEX gd_ready_lane_seq ON gd_ready (lane, seq) INCLUDE (id);

-- One lease per claim, not per row: the range [lo, hi) of a lane that `node` runs, until
-- `expires_at` (a heartbeat moves it on). Logged: after a crash the reaper finds here the
-- ranges that were in flight. `batch` is at least the claim's time in microseconds (as a
-- lease epoch is), so a claim that a server crash forgot is never given again: the
-- commit's fence asks that its batch exist.
CREATE TABLE gd_batches (
    lane       integer     NOT NULL,
    batch      bigint      NOT NULL,
    lo         bigint      NOT NULL,
    hi         bigint      NOT NULL,
    node       text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (lane, batch)
);

-- The reaper reads expired batches by expiry; a heartbeat and a drain, by node.
CREATE INDEX gd_batches_expires ON gd_batches (expires_at);
-- The batch that covers an entry: a lane's batches are disjoint ranges, so it is the one
-- with the greatest `lo` at most the entry's seq (one probe, however many are live).
CREATE INDEX gd_batches_range ON gd_batches (lane, lo);
CREATE INDEX gd_batches_node ON gd_batches (node);

-- Rows that are ready later (a delay, a backoff, a `run_at`), by queue and when: a claim
-- of the queue appends them once due. A row may be here more than once (delayed twice);
-- only a row that still waits for an entry is appended.
CREATE TABLE gd_due (
    id    bigint      NOT NULL,
    queue text        NOT NULL,
    at    timestamptz NOT NULL
);

-- A claim of a queue promotes that queue's due rows (`gd_advance`).
CREATE INDEX gd_due_queue_at ON gd_due (queue, at);

-- A lane's append lock is the advisory lock (1734631276, lane) ('gd_l'): every transaction
-- that appends to a lane holds it shared, from before it takes its first seq until it
-- ends; a claim that moves the lane's watermark takes it exclusive (`gd_advance`).
-- Applications must not use advisory locks with this first key.

-- Appends an entry for each row of `p_ids` that waits for one: `runnable`, no entry
-- (`ready_seq` NULL, or 0: inserted, its append pending, `gd_appends`), no K = 1 key, gate
-- or rate limit. A row due later is put in `gd_due` instead. Sets the row's `ready_seq`,
-- the fence of its next step. Returns the queues it appended to (for their wake-up). Its
-- transaction must end soon after: it holds the lanes' append locks, which a claim that
-- moves their watermark waits for. `p_held`: the caller holds the rows' lanes' append
-- locks exclusive already (a claim promoting due rows). `p_by_row`: a row is due if it
-- was at the clock of the write that made it ready (`updated_at`), not at `p_now`.
--
-- Rows are read and written by primary key (`= ANY`), each one's seq found by binary
-- search in the sorted ids: a join of the rows with the seqs was planned as a scan of
-- the whole table once it had grown.
CREATE FUNCTION gd_append(p_ids int8[], p_now timestamptz, p_held boolean DEFAULT false,
                          p_by_row boolean DEFAULT false)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t     timestamptz := coalesce(p_now, statement_timestamp());
    rows_ int8[];
    ready int8[];
    ids   int8[];
    seqs  int8[];
    lanes int4[];
BEGIN
    SELECT coalesce(array_agg(x.id), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE x.due), '{}')
      INTO rows_, ready
      FROM (SELECT i.id,
                   i.eligible_at <= CASE WHEN p_by_row THEN i.updated_at ELSE t END AS due
              FROM gd_instances i
             WHERE i.id = ANY (p_ids) AND i.status = 'runnable'
               AND coalesce(i.ready_seq, 0) = 0
               AND i.partition_key IS NULL AND i.gate IS NULL AND i.rate_limit IS NULL
             ORDER BY i.id
               FOR NO KEY UPDATE) x;
    -- A row due later waits with `ready_seq` NULL, so that a write that makes it due
    -- sooner (its `eligible_at`) comes here again (`gd_instances_enqueue`). Only a 0 is
    -- written: writing a NULL again would queue this function again at commit, for ever.
    IF cardinality(rows_) > cardinality(ready) THEN
        INSERT INTO gd_due (id, queue, at)
        SELECT i.id, i.queue, i.eligible_at FROM gd_instances i
         WHERE i.id = ANY (rows_) AND i.id <> ALL (ready);
        UPDATE gd_instances i SET ready_seq = NULL
         WHERE i.id = ANY (rows_) AND i.id <> ALL (ready) AND i.ready_seq = 0;
    END IF;
    IF cardinality(ready) = 0 THEN
        RETURN;
    END IF;
    -- New lanes only: a lane's row is updated by every claim of it, and under REPEATABLE
    -- READ an `ON CONFLICT` that meets a version newer than the snapshot fails to serialize.
    INSERT INTO gd_lanes (queue, fsm, priority)
    SELECT DISTINCT i.queue, i.fsm, i.priority FROM gd_instances i
     WHERE i.id = ANY (ready)
       AND NOT EXISTS (SELECT 1 FROM gd_lanes l WHERE l.queue = i.queue AND l.fsm = i.fsm
                          AND l.priority = i.priority)
    ON CONFLICT DO NOTHING;
    -- The append locks, in lane order, as a claim's ticks take theirs, before any seq.
    IF NOT p_held THEN
        PERFORM pg_advisory_xact_lock_shared(1734631276, x.lane) FROM (
            SELECT DISTINCT l.lane FROM gd_instances i
              JOIN gd_lanes l ON l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
             WHERE i.id = ANY (ready)
             ORDER BY l.lane) x;
    END IF;
    -- Seqs in pick order, so a lane serves its rows first in, first out.
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.seq ORDER BY x.id),
           array_agg(x.lane ORDER BY x.id)
      INTO ids, seqs, lanes
      FROM (SELECT y.id, y.lane, nextval('gd_ready_seq') AS seq FROM (
                SELECT i.id, l.lane FROM gd_instances i
                  JOIN gd_lanes l ON l.queue = i.queue AND l.fsm = i.fsm
                                 AND l.priority = i.priority
                 WHERE i.id = ANY (ready)
                 ORDER BY i.priority, i.eligible_at, i.id) y) x;
    INSERT INTO gd_ready (lane, seq, id) SELECT * FROM unnest(lanes, seqs, ids);
    RETURN QUERY
    WITH a AS (
        UPDATE gd_instances i SET ready_seq = seqs[width_bucket(i.id, ids)]
         WHERE i.id = ANY (ids)
        RETURNING i.queue
    )
    SELECT DISTINCT a.queue FROM a;
END
$$;

-- A claim of up to `p_demand` entries of queue `p_queue`'s lanes of FSMs `p_names`, the
-- most urgent priority first, and within one the lane whose cursor is furthest behind.
-- Each lane it takes from gets one batch, the range [lo, hi) of its entries; nothing is
-- written per row. Runs in a short transaction of its own (the lanes' rows are locked
-- until it ends); the rows are read after it commits (`gd_read`). Takes nothing from a
-- paused queue.
--
-- The watermark (PgQ's tick): a lane whose settled range is used up takes its append lock
-- exclusive, which waits for the appenders in flight and holds back new ones until this
-- claim ends. Every seq handed out before is then committed or rolled back, so the end of
-- the sequence is safe. A snapshot cannot say it: its `xmax` is one past the last
-- *completed* transaction, so a running appender newer than every completed one is
-- neither below it nor in its in-progress list (gd_proto found entries lost that way).
-- Locks are taken in lane order, as appenders take theirs, so the two cannot deadlock.
--
-- A row with `keyed` true (and no range) says that rows of the queue that are claimed by
-- themselves (a K = 1 key, a gate, a limit) are due: the engine claims those too, and
-- this claim takes at most half the demand.
--
-- First, it appends the queue's due rows (`gd_due`) for the FSMs it claims: it holds
-- their lanes' locks exclusive then, so it appends as the lanes' only appender. A delay
-- is over when a claim of its queue comes, at the latest the engine's next poll.
--
-- Its statements keep one plan each (`force_generic_plan`): with no due rows, the lanes'
-- statement was planned again at every call (0.33 ms, 4% of a drain's server time).
CREATE FUNCTION gd_advance(p_queue text, p_names text[], p_demand int8, p_node text,
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

-- The rows of batches `p_batches` (pairs: lane, batch, ...) that still wait at their
-- entry, with what a step needs (as a claim of claim.sql returns it): inbox, children.
-- `lease_epoch` is the entry's seq, the fence of the row's outcome. A row that moved on
-- (its entry redelivered, the row cancelled) is skipped. A row at a version this node
-- cannot run is given back: ready again in a second, for a node that can (`gd_due`, by
-- `gd_instances_enqueue` at this statement's commit).
--
-- PL/pgSQL keeps the plan, and `enable_seqscan = off` keeps it on the indexes: a segment
-- made empty and analyzed empty was read by a sequential scan once it had filled
-- (gd_proto, `Lwdp`). The inboxes and the children are each read once (`MATERIALIZED`):
-- joined as subqueries, the children's were read again for every row (14 ms a claim of
-- 256 rows, most of a drain's time).
CREATE FUNCTION gd_read(p_batches int8[], p_names text[], p_versions int4[], p_now timestamptz)
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, lane integer, batch bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $read$
#variable_conflict use_column
DECLARE
    t timestamptz := coalesce(p_now, statement_timestamp());
BEGIN
    RETURN QUERY
    WITH b AS (
        SELECT p_batches[2 * k - 1]::int4 AS lane, p_batches[2 * k] AS batch
          FROM generate_series(1, cardinality(p_batches) / 2) k
    ), e AS MATERIALIZED (
        SELECT i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits, r.seq,
               gb.lane, gb.batch, (i.fsm, i.fsm_version) IN (SELECT * FROM unnest(p_names, p_versions)) AS runs
          FROM b
          JOIN gd_batches gb ON gb.lane = b.lane AND gb.batch = b.batch
          JOIN gd_ready r ON r.lane = gb.lane AND r.seq >= gb.lo AND r.seq < gb.hi
          CROSS JOIN LATERAL (
              SELECT i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits,
                     i.ready_seq, i.status
                FROM gd_instances i WHERE i.id = r.id LIMIT 1) i
         WHERE i.ready_seq = r.seq AND i.status = 'runnable'
    ), back AS (
        UPDATE gd_instances i SET ready_seq = NULL, eligible_at = t + interval '1 second'
         WHERE i.id = ANY (ARRAY(SELECT e.id FROM e WHERE NOT e.runs))
           AND i.ready_seq IS NOT NULL
        RETURNING i.id
    ), sg AS MATERIALIZED (
        SELECT s.target_id, json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id) AS inbox
          FROM gd_signals s WHERE s.target_id = ANY (ARRAY(SELECT e.id FROM e WHERE e.runs))
         GROUP BY s.target_id
    ), kid AS MATERIALIZED (
        SELECT ch.parent_id, json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id) AS children
          FROM gd_instances ch WHERE ch.parent_id = ANY (ARRAY(SELECT e.id FROM e WHERE e.runs))
         GROUP BY ch.parent_id
    )
    SELECT e.id, e.fsm, e.fsm_version, e.step, e.state, e.attempt, e.awaits, e.seq,
           NULL::text, NULL::text,
           coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'), t, e.lane, e.batch
      FROM e
      LEFT JOIN sg ON sg.target_id = e.id
      LEFT JOIN kid ON kid.parent_id = e.id
     WHERE e.runs
     ORDER BY e.seq;
END
$read$;

-- The reaper of batches: a batch whose lease ran out gives back the rows still at their
-- entry in it. Each goes to the end of its lane with `attempt + 1` and `reaps + 1`, or
-- fails once `reaps` reaches `max_reaps` (or a cancel was requested), as `gd_reap` does
-- for a row's lease (lease.sql), a restart's leases spared likewise (a batch's id is its
-- claim's time). The row's fence moves with `ready_seq`, so the worker that held the
-- batch can commit nothing of it. A batch one of whose rows (or a failing row's parent)
-- someone holds is left whole for the next pass: its worker may be committing it.
-- Returns each row it gave back or failed.
CREATE FUNCTION gd_reap_batches(p_limit int8, p_now timestamptz, p_lease_ms int8)
RETURNS TABLE (id int8, failed bool) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(p_now, statement_timestamp());
    started timestamptz := CASE WHEN p_now IS NULL THEN pg_postmaster_start_time()
                                ELSE '-infinity' END;
    g       record;
    want    int8[];
    got     int8[];
    fail    int8[];
    parents int8[];
    back    int8[] := '{}';
    fails   int8[] := '{}';
    ended   int8[] := '{}';
    counts  bool;
BEGIN
    FOR g IN SELECT b.lane, b.batch, b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
              WHERE b.expires_at < t ORDER BY b.expires_at LIMIT p_limit
                FOR UPDATE SKIP LOCKED
    LOOP
        SELECT coalesce(array_agg(r.id), '{}') INTO want FROM gd_ready r
          JOIN gd_instances i ON i.id = r.id AND i.ready_seq = r.seq AND i.status = 'runnable'
         WHERE r.lane = g.lane AND r.seq >= g.lo AND r.seq < g.hi;
        SELECT coalesce(array_agg(x.id), '{}') INTO got FROM (
            SELECT i.id FROM gd_instances i WHERE i.id = ANY (want)
             ORDER BY i.id FOR NO KEY UPDATE SKIP LOCKED) x;
        CONTINUE WHEN cardinality(got) < cardinality(want);
        -- As locked: still at their entry in this batch.
        SELECT coalesce(array_agg(i.id), '{}') INTO got FROM gd_instances i
         WHERE i.id = ANY (got) AND i.status = 'runnable'
           AND EXISTS (SELECT 1 FROM gd_ready r WHERE r.lane = g.lane AND r.seq = i.ready_seq
                          AND r.seq >= g.lo AND r.seq < g.hi);
        -- Not counted: a lease that ran out because the database was down.
        counts := NOT (to_timestamp(g.batch / 1000000.0) < started
                       AND g.expires_at < started + coalesce(p_lease_ms, 0) * interval '1 millisecond');
        SELECT coalesce(array_agg(i.id), '{}') INTO fail FROM gd_instances i
         WHERE i.id = ANY (got) AND (i.cancel_requested OR (counts AND i.reaps + 1 >= i.max_reaps));
        SELECT coalesce(array_agg(x.id), '{}') INTO parents FROM (
            SELECT p.id FROM gd_instances p
             WHERE p.id IN (SELECT i.parent_id FROM gd_instances i WHERE i.id = ANY (fail))
             ORDER BY p.id FOR NO KEY UPDATE SKIP LOCKED) x;
        CONTINUE WHEN cardinality(parents) < (SELECT count(DISTINCT i.parent_id) FROM gd_instances i
                                              WHERE i.id = ANY (fail));
        UPDATE gd_instances i
           SET status = (CASE WHEN i.id = ANY (fail) THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE
                   WHEN i.cancel_requested THEN 'cancelled'
                   WHEN NOT counts
                   THEN format('lease ran out while the database was down (started again at %s) on %s (batch %s); retrying, not counted toward max_reaps',
                               pg_postmaster_start_time(), g.node, g.batch)
                   WHEN i.id = ANY (fail)
                   THEN format('lease lost %s times (max_reaps = %s): the step at %L never committed an outcome',
                               i.reaps + 1, i.max_reaps, i.step)
                   ELSE format('lease lost on %s (batch %s); retrying', g.node, g.batch) END,
               attempt = i.attempt + 1,
               reaps = i.reaps + CASE WHEN counts THEN 1 ELSE 0 END,
               ready_seq = NULL,
               eligible_at = t,
               updated_at = t
         WHERE i.id = ANY (got);
        DELETE FROM gd_batches b WHERE b.lane = g.lane AND b.batch = g.batch;
        back := back || ARRAY(SELECT x FROM unnest(got) x WHERE x <> ALL (fail));
        fails := fails || fail;
        ended := ended || ARRAY(SELECT i.parent_id FROM gd_instances i
                                 WHERE i.id = ANY (fail) AND i.parent_id IS NOT NULL);
    END LOOP;
    PERFORM pg_notify('gd_wake', q) FROM gd_append(back, p_now) q;
    PERFORM gd_rows_ended(nullif(fails, '{}'), nullif(ended, '{}'), t);
    RETURN QUERY SELECT r, r = ANY (fails) FROM unnest(back || fails) r ORDER BY r;
END
$$;

-- Deletes up to `p_limit` dead entries of the log, oldest first: per lane, those below
-- its cursor and below every live batch of it (each one taken, and its row ended or
-- moved on to a newer entry). The collector's; returns how many it deleted. A stopgap
-- until the log is reclaimed by whole segments (docs/design/storage-v2.md, step 3): the
-- entries are narrow, and nothing reads below a lane's mark.
CREATE FUNCTION gd_trim_log(p_limit int8) RETURNS int8
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n  int8 := 0;
    m  int8;
    hi int8;
    c  record;
BEGIN
    FOR c IN SELECT l.lane,
                    least(l.next_seq, (SELECT min(b.lo) FROM gd_batches b WHERE b.lane = l.lane))
                        AS mark
               FROM gd_lanes l ORDER BY l.lane
    LOOP
        SELECT x.seq INTO hi FROM gd_ready x
         WHERE x.lane = c.lane AND x.seq < c.mark
         ORDER BY x.seq OFFSET p_limit - n LIMIT 1;
        DELETE FROM gd_ready r WHERE r.lane = c.lane AND r.seq < coalesce(hi, c.mark);
        GET DIAGNOSTICS m = ROW_COUNT;
        n := n + m;
        EXIT WHEN n >= p_limit;
    END LOOP;
    RETURN n;
END
$$;

-- Whether a plain row's step is running: its entry lies in a live batch. The status of
-- such a row says `runnable`; what reads it as a status says `executing` (explain, counts,
-- a cancel, which flags a running row instead of failing it).
CREATE FUNCTION gd_on_batch(p_queue text, p_fsm text, p_priority smallint, p_seq int8)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT p_seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= p_seq
                              ORDER BY b.lo DESC LIMIT 1) b
         WHERE l.queue = p_queue AND l.fsm = p_fsm AND l.priority = p_priority
           AND b.lo <= p_seq AND b.hi > p_seq)
$$;

-- A row's status as a reader means it: `executing` for a plain row whose step runs
-- (`gd_on_batch`), the stored status otherwise. Explain, the counts, a cancel and the
-- dashboard read this; `gd_instances.status` itself says `runnable` for such a row.
CREATE FUNCTION gd_status_of(i gd_instances) RETURNS gd_status
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN i.status = 'runnable'
                     AND gd_on_batch(i.queue, i.fsm, i.priority, i.ready_seq)
                THEN 'executing'::gd_status ELSE i.status END
$$;

-- The node whose worker runs a row's step now: its lease's, or its batch's in the log.
CREATE FUNCTION gd_holder(i gd_instances) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(i.locked_by, (
        SELECT b.node FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
         WHERE i.status = 'runnable' AND l.queue = i.queue AND l.fsm = i.fsm
           AND l.priority = i.priority AND b.lo <= i.ready_seq AND b.hi > i.ready_seq
         LIMIT 1))
$$;

-- A row that leaves `runnable`, or takes a K = 1 key, a gate or a rate limit, leaves the
-- log: its entry is left behind (a read skips it) and `ready_seq` is cleared, so that it
-- gets an entry again when it is next ready. A statement that writes such a change may
-- clear it itself; this covers every other.
CREATE FUNCTION gd_off_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.ready_seq := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER gd_instances_off_log
    BEFORE UPDATE ON gd_instances
    FOR EACH ROW
    WHEN (NEW.ready_seq IS NOT NULL
          AND (NEW.status <> 'runnable' OR NEW.partition_key IS NOT NULL
               OR NEW.gate IS NOT NULL OR NEW.rate_limit IS NOT NULL))
    EXECUTE FUNCTION gd_off_log();

-- A plain row that becomes ready with no entry (inserted, woken by a signal or its last
-- child, retried, given back by a drain or a reaper) gets its entry at its transaction's
-- commit: an append made inside a long transaction of the caller's holds its lane's
-- append lock only while that transaction commits. The engine's own step commits append
-- in their statement (commit.sql) and do not come here. It sends no wake-up: the statement
-- that made the row ready does, as it did before the log (a client's inserts coalesce
-- theirs), and a notification is delivered only after the commit that appended. Whether
-- the row is due is judged by the clock of the write that made it ready (`updated_at`):
-- the engine's manual clock, in tests, is not the database's.
CREATE FUNCTION gd_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd_append(ARRAY[NEW.id], NULL, false, true);
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER gd_instances_enqueue
    AFTER INSERT OR UPDATE ON gd_instances
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'runnable' AND NEW.ready_seq IS NULL AND NEW.partition_key IS NULL
          AND NEW.gate IS NULL AND NEW.rate_limit IS NULL)
    EXECUTE FUNCTION gd_enqueue();

-- The appends an insert left for its commit: one row per insert statement, holding its
-- plain rows' ids (inserted with `ready_seq` 0, which the row trigger above passes by),
-- appended in one call at commit and deleted. A row-by-row trigger cost 0.4 ms per row
-- at commit. Unlogged: a row lives only inside its transaction.
CREATE UNLOGGED TABLE gd_appends (
    ids int8[] NOT NULL
);

CREATE FUNCTION gd_append_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM gd_append(NEW.ids, NULL, false, true);
    DELETE FROM gd_appends a WHERE a.ids = NEW.ids;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER gd_appends_at_commit
    AFTER INSERT ON gd_appends
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION gd_append_inserted();

CREATE OR REPLACE FUNCTION gd_claim_plain(text, text[], int4[], int8, text, int8, timestamptz)
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
    SELECT i.id, i.fsm, i.partition_key, i.priority, i.eligible_at
      FROM gd_instances i
     WHERE i.queue = $1
       AND i.status = 'runnable'
       AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
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
       SET status = 'executing', locked_by = $5, lease_epoch = gd_lease_epoch(i.lease_epoch),
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
       coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'),
       k.contended, '[]'::json AS throttled, NULL::timestamptz AS next_due, k.now, k.flow
  FROM pick k
  LEFT JOIN claimed c ON true
  LEFT JOIN (SELECT s.target_id, json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id) AS inbox
               FROM gd_signals s WHERE s.target_id = ANY (ARRAY(SELECT id FROM claimed))
              GROUP BY s.target_id) sg ON sg.target_id = c.id
  LEFT JOIN (SELECT ch.parent_id, json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id) AS children
               FROM gd_instances ch WHERE ch.parent_id = ANY (ARRAY(SELECT id FROM claimed))
              GROUP BY ch.parent_id) kid ON kid.parent_id = c.id
 WHERE c.id IS NOT NULL OR k.flow
 ORDER BY c.id;
END
$claim$;


CREATE OR REPLACE FUNCTION gd_claim_rated(text, text[], int4[], int8, text, int8, timestamptz)
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
           i.rate_paid, i.rate_limit IS NOT NULL AND (i.rate_paid OR i.rate_step = i.step) AS pays
      FROM gd_instances i
     WHERE i.queue = $1
       AND i.status = 'runnable'
       AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
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
    SELECT r.id, r.priority, r.eligible_at, r.rate_limit, r.rate_key, r.rate_weight, r.rate_paid,
           r.pays
      FROM (SELECT p.*, row_number() OVER (PARTITION BY p.partition_key
                                           ORDER BY p.priority, p.eligible_at, p.id) AS rn
              FROM picked p) r
     WHERE r.partition_key IS NULL OR r.rn = 1
), wants AS (
    -- The chosen rows that start only with tokens of their bucket: tokens they take now,
    -- or the ones they reserved (`rate_paid`).
    -- A weight above its limit's burst (the burst was lowered after the row's insert)
    -- counts as the burst: it could never be admitted otherwise.
    SELECT c.id, c.rate_limit, c.rate_key, least(c.rate_weight, l.burst) AS rate_weight,
           c.rate_paid, c.priority, c.eligible_at
      FROM chosen c
      JOIN gd_rate_limits l ON l.name = c.rate_limit
     WHERE c.pays
), stored AS MATERIALIZED (
    SELECT b.tid, b.name, b.key, b.tokens, b.held, b.at
      FROM (SELECT DISTINCT rate_limit, rate_key FROM wants ORDER BY 1, 2) w
     CROSS JOIN LATERAL (SELECT g.ctid AS tid, g.name, g.key, g.tokens, g.held, g.at
                           FROM gd_buckets g
                          WHERE g.name = w.rate_limit AND g.key = w.rate_key
                            FOR NO KEY UPDATE) b
), buckets AS MATERIALIZED (
    -- `avail`: what a row that reserved nothing finds, debts included; the refill stops at
    -- a full bucket less what waiting rows reserved (`held`), so reservations that were
    -- not claimed on time cannot start on top of a full bucket (R4-2).
    SELECT k.name, k.key, k.total, k.paid, k.wanted, l.per_second,
           s.name IS NOT NULL AS stored, s.tid, h.held,
           least(l.burst - h.held,
                 coalesce(s.tokens + extract(epoch FROM coalesce($7, now()) - s.at)
                                     * l.per_second, l.burst)) AS avail
      FROM (SELECT rate_limit AS name, rate_key AS key, sum(rate_weight) AS total,
                   coalesce(sum(rate_weight) FILTER (WHERE rate_paid), 0) AS paid,
                   count(*) AS wanted
              FROM wants GROUP BY 1, 2) k
      JOIN gd_rate_limits l ON l.name = k.name
      LEFT JOIN stored s ON s.name = k.name AND s.key = k.key
     CROSS JOIN LATERAL (SELECT greatest(coalesce(s.held, 0), k.paid) AS held) h
), owed AS (
    -- Of the buckets short of tokens only (none while tokens are plentiful), the rows past
    -- what the bucket holds. The line: reserved rows first (the bucket kept their tokens,
    -- `avail + held` in all), then the rest of what is reserved, then the rows that reserve
    -- now, each in pick order. A row past the line's tokens waits until they are there
    -- (rounded up to the microsecond, so it never comes back a hair short; at most ~95
    -- years: an extreme limit's debt stays a time PostgreSQL can add; R4-5); a reserved
    -- row keeps its reservation.
    SELECT o.id, o.rate_limit, o.rate_key, o.rate_weight,
           coalesce($7, now()) + least(ceil((o.pos - o.room) / o.per_second * 1e6) / 1e6, 3e9)
                                 * interval '1 second' AS due
      FROM (SELECT w.id, w.rate_limit, w.rate_key, w.rate_weight, b.per_second,
                   b.avail + b.held AS room,
                   sum(w.rate_weight) OVER (PARTITION BY w.rate_limit, w.rate_key
                                            ORDER BY NOT w.rate_paid, w.priority,
                                                     w.eligible_at, w.id)
                       + CASE WHEN w.rate_paid THEN 0 ELSE b.held - b.paid END AS pos
              FROM wants w JOIN buckets b ON b.name = w.rate_limit AND b.key = w.rate_key
             WHERE b.total - b.paid > b.avail OR b.paid > b.avail + b.held) o
     WHERE o.pos > o.room
), settled AS (
    -- Each bucket after the claim: the tokens of the rows that reserved nothing taken
    -- (admitted or reserving now), and what stays reserved: less the reserved rows that
    -- start, plus the rows that reserve now.
    SELECT b.tid, b.stored, b.name, b.key, b.avail - (b.total - b.paid) AS tokens,
           greatest(b.held - b.paid
                    + coalesce((SELECT sum(o.rate_weight) FROM owed o
                                 WHERE o.rate_limit = b.name AND o.rate_key = b.key), 0),
                    0) AS held
      FROM buckets b
), debited AS (
    UPDATE gd_buckets g
       SET (tokens, held) = (SELECT s.tokens, s.held FROM settled s WHERE s.tid = g.ctid),
           at = coalesce($7, now())
     WHERE g.ctid = ANY (ARRAY(SELECT tid FROM buckets WHERE stored))
    RETURNING g.name
), minted AS (
    INSERT INTO gd_buckets (name, key, tokens, held, at)
    SELECT s.name, s.key, s.tokens, s.held, coalesce($7, now()) FROM settled s WHERE NOT s.stored
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
       SET status = 'executing', locked_by = $5, lease_epoch = gd_lease_epoch(i.lease_epoch),
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
       coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'),
       k.contended, k.throttled, k.next_due, k.now, k.flow
  FROM pick k
  LEFT JOIN claimed c ON true
  LEFT JOIN (SELECT s.target_id, json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id) AS inbox
               FROM gd_signals s WHERE s.target_id = ANY (ARRAY(SELECT id FROM claimed))
              GROUP BY s.target_id) sg ON sg.target_id = c.id
  LEFT JOIN (SELECT ch.parent_id, json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id) AS children
               FROM gd_instances ch WHERE ch.parent_id = ANY (ARRAY(SELECT id FROM claimed))
              GROUP BY ch.parent_id) kid ON kid.parent_id = c.id
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
                     AND (hd.partition_key IS NOT NULL OR hd.gate IS NOT NULL OR hd.rate_limit IS NOT NULL)
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
       AND (hd.partition_key IS NOT NULL OR hd.gate IS NOT NULL OR hd.rate_limit IS NOT NULL)
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
           i.rate_paid, i.rate_limit IS NOT NULL AND (i.rate_paid OR i.rate_step = i.step) AS pays
      FROM gd_instances i
     WHERE i.queue = $1
       AND i.status = 'runnable'
       AND (i.partition_key IS NOT NULL OR i.gate IS NOT NULL OR i.rate_limit IS NOT NULL)
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
           rate_paid, pays,
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
           r.rate_weight, r.rate_paid, r.pays
      FROM ranked r
      LEFT JOIN free f ON f.gate = r.gate AND f.partition_key = r.partition_key
     WHERE CASE WHEN r.gate IS NULL THEN r.partition_key IS NULL OR r.rn = 1
                ELSE r.rn <= least(f.room, cardinality(f.slots)) END
), wants AS (
    -- The chosen rows that start only with tokens of their bucket: tokens they take now,
    -- or the ones they reserved (`rate_paid`).
    -- A weight above its limit's burst (the burst was lowered after the row's insert)
    -- counts as the burst: it could never be admitted otherwise.
    SELECT c.id, c.rate_limit, c.rate_key, least(c.rate_weight, l.burst) AS rate_weight,
           c.rate_paid, c.priority, c.eligible_at
      FROM chosen c
      JOIN gd_rate_limits l ON l.name = c.rate_limit
     WHERE c.pays
), stored AS MATERIALIZED (
    SELECT b.tid, b.name, b.key, b.tokens, b.held, b.at
      FROM (SELECT DISTINCT rate_limit, rate_key FROM wants ORDER BY 1, 2) w
     CROSS JOIN LATERAL (SELECT g.ctid AS tid, g.name, g.key, g.tokens, g.held, g.at
                           FROM gd_buckets g
                          WHERE g.name = w.rate_limit AND g.key = w.rate_key
                            FOR NO KEY UPDATE) b
), buckets AS MATERIALIZED (
    -- `avail`: what a row that reserved nothing finds, debts included; the refill stops at
    -- a full bucket less what waiting rows reserved (`held`), so reservations that were
    -- not claimed on time cannot start on top of a full bucket (R4-2).
    SELECT k.name, k.key, k.total, k.paid, k.wanted, l.per_second,
           s.name IS NOT NULL AS stored, s.tid, h.held,
           least(l.burst - h.held,
                 coalesce(s.tokens + extract(epoch FROM coalesce($7, now()) - s.at)
                                     * l.per_second, l.burst)) AS avail
      FROM (SELECT rate_limit AS name, rate_key AS key, sum(rate_weight) AS total,
                   coalesce(sum(rate_weight) FILTER (WHERE rate_paid), 0) AS paid,
                   count(*) AS wanted
              FROM wants GROUP BY 1, 2) k
      JOIN gd_rate_limits l ON l.name = k.name
      LEFT JOIN stored s ON s.name = k.name AND s.key = k.key
     CROSS JOIN LATERAL (SELECT greatest(coalesce(s.held, 0), k.paid) AS held) h
), owed AS (
    -- Of the buckets short of tokens only (none while tokens are plentiful), the rows past
    -- what the bucket holds. The line: reserved rows first (the bucket kept their tokens,
    -- `avail + held` in all), then the rest of what is reserved, then the rows that reserve
    -- now, each in pick order. A row past the line's tokens waits until they are there
    -- (rounded up to the microsecond, so it never comes back a hair short; at most ~95
    -- years: an extreme limit's debt stays a time PostgreSQL can add; R4-5); a reserved
    -- row keeps its reservation.
    SELECT o.id, o.rate_limit, o.rate_key, o.rate_weight,
           coalesce($7, now()) + least(ceil((o.pos - o.room) / o.per_second * 1e6) / 1e6, 3e9)
                                 * interval '1 second' AS due
      FROM (SELECT w.id, w.rate_limit, w.rate_key, w.rate_weight, b.per_second,
                   b.avail + b.held AS room,
                   sum(w.rate_weight) OVER (PARTITION BY w.rate_limit, w.rate_key
                                            ORDER BY NOT w.rate_paid, w.priority,
                                                     w.eligible_at, w.id)
                       + CASE WHEN w.rate_paid THEN 0 ELSE b.held - b.paid END AS pos
              FROM wants w JOIN buckets b ON b.name = w.rate_limit AND b.key = w.rate_key
             WHERE b.total - b.paid > b.avail OR b.paid > b.avail + b.held) o
     WHERE o.pos > o.room
), settled AS (
    -- Each bucket after the claim: the tokens of the rows that reserved nothing taken
    -- (admitted or reserving now), and what stays reserved: less the reserved rows that
    -- start, plus the rows that reserve now.
    SELECT b.tid, b.stored, b.name, b.key, b.avail - (b.total - b.paid) AS tokens,
           greatest(b.held - b.paid
                    + coalesce((SELECT sum(o.rate_weight) FROM owed o
                                 WHERE o.rate_limit = b.name AND o.rate_key = b.key), 0),
                    0) AS held
      FROM buckets b
), debited AS (
    UPDATE gd_buckets g
       SET (tokens, held) = (SELECT s.tokens, s.held FROM settled s WHERE s.tid = g.ctid),
           at = coalesce($7, now())
     WHERE g.ctid = ANY (ARRAY(SELECT tid FROM buckets WHERE stored))
    RETURNING g.name
), minted AS (
    INSERT INTO gd_buckets (name, key, tokens, held, at)
    SELECT s.name, s.key, s.tokens, s.held, coalesce($7, now()) FROM settled s WHERE NOT s.stored
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
       SET status = 'executing', locked_by = $5, lease_epoch = gd_lease_epoch(i.lease_epoch),
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
       coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'),
       k.contended, k.throttled, k.next_due, k.now, k.flow
  FROM pick k
  LEFT JOIN claimed c ON true
  LEFT JOIN (SELECT s.target_id, json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id) AS inbox
               FROM gd_signals s WHERE s.target_id = ANY (ARRAY(SELECT id FROM claimed))
              GROUP BY s.target_id) sg ON sg.target_id = c.id
  LEFT JOIN (SELECT ch.parent_id, json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id) AS children
               FROM gd_instances ch WHERE ch.parent_id = ANY (ARRAY(SELECT id FROM claimed))
              GROUP BY ch.parent_id) kid ON kid.parent_id = c.id
 WHERE c.id IS NOT NULL OR k.next_due IS NOT NULL OR NOT k.flow
 ORDER BY c.id;
END
$claim$;


CREATE OR REPLACE FUNCTION gd_commit_outcomes(
    p_node      text,
    p_ids       int8[],
    p_epochs    int8[],
    p_kinds     text[],
    p_steps     text[],
    p_states    jsonb[],
    p_results   jsonb[],
    p_errors    text[],
    p_delays    int8[],
    p_awaits    text[],
    p_children  int4[],
    p_run_ahead bool[],
    p_consumed  int8[],
    p_seen      int8[],
    p_notify    text[],
    p_now       timestamptz,
    p_keyed        bool[],
    p_keys         text[],
    p_gates        text[],
    p_rate_limits  text[],
    p_rate_keys    text[],
    p_rate_weights float8[],
    OUT committed int8[],
    OUT continued int8[],
    OUT at        timestamptz,
    OUT deferred  int8[]
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t        timestamptz := coalesce(p_now, statement_timestamp());
    mine     int8[];
    how      int[];
    quick    int8[];
    logged   int8[];
    closed   int8[];
    wanted   int8[];
    parents  int8[];
    ready    int8[];
    finished int8[];
    ended    int8[];
    parked   int8[];
    notified bigint;
BEGIN
    -- A run-ahead `next` of a queue that is paused now goes back to its queue, runnable,
    -- as a `next` without run-ahead does: a pause holds every step that has not started,
    -- the steps a claimed row runs ahead into included (R4-3). One probe of a small table
    -- while nothing is paused.
    IF EXISTS (SELECT 1 FROM gd_queue_pauses) AND true = ANY (p_run_ahead) THEN
        SELECT array_agg(f.ahead AND NOT EXISTS (
                   SELECT 1 FROM gd_instances i JOIN gd_queue_pauses qp ON qp.queue = i.queue
                    WHERE i.id = f.id) ORDER BY f.n)
          INTO p_run_ahead
          FROM unnest(p_ids, p_run_ahead) WITH ORDINALITY f(id, ahead, n);
    END IF;
    -- 0. The rows, then the parents of the rows this commit ends (a `done`, a `stop`, or
    --    any outcome of a row whose cancel was requested: it commits as `stop`). Rows are
    --    read by primary key, locked, once; each finds its outcome by binary search in the
    --    sorted ids, and there what it is: `how` by position, 1 for a `done` or a `stop`,
    --    2 for the short path of statement 1, 0 for the rest.
    SELECT array_agg(CASE WHEN f.kind IN ('done', 'stop') THEN 1
                          WHEN f.kind = 'next' AND NOT coalesce(f.keyed, false)
                               AND f.rate_limit IS NULL THEN CASE WHEN f.ahead THEN 2 ELSE 3 END
                          ELSE 0 END ORDER BY f.n)
      INTO how
      FROM unnest(p_kinds, p_run_ahead, p_keyed, p_rate_limits)
           WITH ORDINALITY f(kind, ahead, keyed, rate_limit, n);
    --    (Rows without a parent are left out by the aggregate's filter: in a WHERE,
    --    `parent_id IS NOT NULL` matched the partial index over children, which the planner
    --    chose when the statistics said no row has a parent; 0017.)
    SELECT coalesce(array_agg(x.id), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how = 2 AND NOT x.log), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how IN (2, 3) AND x.log), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.done AND x.log), '{}'),
           coalesce(array_agg(DISTINCT x.parent_id)
                        FILTER (WHERE (x.cancelled OR x.how = 1) AND x.parent_id IS NOT NULL),
                    '{}')
      INTO mine, quick, logged, closed, wanted
      FROM (SELECT i.id, i.parent_id, i.cancel_requested AS cancelled,
                   how[width_bucket(i.id, p_ids)] AS how, i.locked_by IS NULL AS log,
                   p_kinds[width_bucket(i.id, p_ids)] = 'done' AS done
              FROM gd_instances i
             WHERE i.id = ANY (p_ids)
             ORDER BY i.id
               FOR NO KEY UPDATE SKIP LOCKED) x;
    IF cardinality(wanted) = 0 THEN
        ready := mine;
    ELSE
        SELECT coalesce(array_agg(id), '{}') INTO parents FROM (
            SELECT p.id FROM gd_instances p
             WHERE p.id = ANY (wanted)
             ORDER BY p.id
               FOR NO KEY UPDATE SKIP LOCKED) x;
        IF cardinality(parents) = cardinality(wanted) THEN
            ready := mine;
        ELSE
            SELECT coalesce(array_agg(i.id), '{}') INTO ready FROM gd_instances i
             WHERE i.id = ANY (mine)
               AND (i.parent_id IS NULL OR i.parent_id = ANY (parents)
                    OR NOT (i.cancel_requested
                            OR p_kinds[width_bucket(i.id, p_ids)] IN ('done', 'stop')));
            closed := ARRAY(SELECT unnest(closed) INTERSECT SELECT unnest(ready));
        END IF;
    END IF;
    -- Deferred: still this node's, but locked by someone else (or its parent is).
    IF cardinality(ready) = cardinality(p_ids) THEN
        deferred := '{}';
    ELSE
        SELECT coalesce(array_agg(i.id), '{}') INTO deferred FROM gd_instances i
         WHERE i.id = ANY (p_ids) AND i.id <> ALL (ready)
           AND CASE WHEN i.locked_by IS NULL THEN i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
                    ELSE i.locked_by = p_node
                         AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)] END;
    END IF;

    -- 1. Apply every fenced outcome (what each kind writes: `Step` in fsm.rs); an `await`
    --    parks here and statement 3 wakes it if its signal is in. The fence is
    --    `(locked_by, lease_epoch)`: `locked_by` is set exactly while a row is claimed, and
    --    a new claim bumps the epoch. No join between the arrays and the table (its plan
    --    would rescan the arrays per row): rows by primary key, outcomes by binary search.
    --    A run-ahead `next` that moves no key and takes no limit (`quick`, never a row
    --    that ends) writes only what such an outcome changes; the general `UPDATE` takes
    --    the rest, a cancelled row included.
    --    A plain row claimed from the log (`locked_by` NULL) is fenced by its entry
    --    (`ready_seq`, in a batch this node holds: a batch a server crash forgot is gone,
    --    and with it the commits of the worker that ran it). Its `next` that moves no key
    --    and takes no limit (`logged`) writes only what it changes: a new entry at the end
    --    of its lane, or the same entry when it runs ahead, so its update can be HOT; the
    --    append locks of its lanes are taken first (log.sql).
    IF cardinality(logged) > 0 THEN
        PERFORM pg_advisory_xact_lock_shared(1734631276, x.lane) FROM (
            SELECT DISTINCT l.lane FROM gd_instances i
              JOIN gd_lanes l ON l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
             WHERE i.id = ANY (logged) AND NOT p_run_ahead[width_bucket(i.id, p_ids)]
             ORDER BY l.lane) x;
    END IF;
    WITH fast AS (
        UPDATE gd_instances i
           SET (step, state, last_error) = (
                   SELECT p_steps[x.n], coalesce(p_states[x.n], i.state), p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               awaits = '{}', await_deadline = NULL, attempt = 0, reaps = 0, updated_at = t,
               rate_limit = NULL, rate_key = NULL, rate_weight = NULL, rate_step = NULL,
               rate_paid = false
         WHERE i.id = ANY (quick)
           AND i.locked_by = p_node
           AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)]
        RETURNING i.id, i.status, i.parent_id, i.queue, false AS ahead
    ), logd AS (
        UPDATE gd_instances i
           SET (step, state, last_error) = (
                   SELECT p_steps[x.n], coalesce(p_states[x.n], i.state), p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               awaits = '{}', await_deadline = NULL, attempt = 0, reaps = 0, updated_at = t,
               ready_seq = CASE WHEN p_run_ahead[width_bucket(i.id, p_ids)] THEN i.ready_seq
                                ELSE nextval('gd_ready_seq') END
         WHERE i.id = ANY (logged)
           AND i.locked_by IS NULL AND i.status = 'runnable'
           AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
           AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                        WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                          AND b.node = p_node AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
        RETURNING i.id, i.status, i.parent_id, i.queue, i.fsm, i.priority, i.ready_seq,
                  p_run_ahead[width_bucket(i.id, p_ids)] AS ahead
    ), shut AS (
        -- A plain row's `done` (`closed`) writes only what a `done` changes.
        UPDATE gd_instances i
           SET (step, state, result, last_error) = (
                   SELECT coalesce(p_steps[x.n], i.step), coalesce(p_states[x.n], i.state),
                          p_results[x.n], p_errors[x.n]
                     FROM (SELECT width_bucket(i.id, p_ids) AS n) x),
               status = 'done', awaits = '{}', await_deadline = NULL, updated_at = t,
               ready_seq = NULL
         WHERE i.id = ANY (closed)
           AND i.locked_by IS NULL AND i.status = 'runnable'
           AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
           AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                        WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                          AND b.node = p_node AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
        RETURNING i.id, i.status, i.parent_id, i.queue, false AS ahead
    ), appended AS (
        INSERT INTO gd_ready (lane, seq, id)
        SELECT l.lane, g.ready_seq, g.id FROM logd g
          JOIN gd_lanes l ON l.queue = g.queue AND l.fsm = g.fsm AND l.priority = g.priority
         WHERE NOT g.ahead
    ), slow AS (
        UPDATE gd_instances i
           SET (step, state, status, result, last_error, awaits, await_deadline,
                eligible_at, attempt, reaps, children_pending, locked_by,
                lease_expires_at, updated_at, partition_key, gate, rate_limit, rate_key,
                rate_weight, rate_step, rate_paid, ready_seq) = (
               SELECT coalesce(CASE WHEN e.kind <> 'stop' THEN p_steps[e.n] END, i.step),
                      coalesce(p_states[e.n], i.state),
                      (CASE
                           WHEN e.kind = 'next' AND p_run_ahead[e.n] AND i.locked_by IS NOT NULL
                           THEN 'executing'
                           WHEN e.kind IN ('next', 'replay') THEN 'runnable'
                           WHEN e.kind = 'await' THEN 'awaiting_signal'
                           WHEN e.kind = 'schedule_childs' THEN
                               CASE WHEN p_children[e.n] = 0 THEN 'runnable'
                                    ELSE 'awaiting_children' END
                           WHEN e.kind = 'done' THEN 'done'
                           ELSE 'failed' END)::gd_status,
                      CASE WHEN e.kind = 'done' THEN p_results[e.n] ELSE i.result END,
                      CASE WHEN e.err IS NOT NULL THEN e.err
                           WHEN e.kind = 'replay' THEN i.last_error END,
                      CASE e.kind WHEN 'await' THEN string_to_array(p_awaits[e.n], chr(31))
                                  WHEN 'replay' THEN i.awaits
                                  WHEN 'stop' THEN i.awaits
                                  ELSE '{}' END,
                      CASE WHEN e.kind = 'await' AND p_delays[e.n] IS NOT NULL
                                THEN t + p_delays[e.n] * interval '1 millisecond'
                           WHEN e.kind = 'replay' THEN i.await_deadline END,
                      -- A row that runs ahead keeps its eligibility (it is not
                      -- runnable; a release or the reaper sets it): with `updated_at`
                      -- unindexed (migration 0014), such a step's update is HOT.
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] AND i.locked_by IS NOT NULL
                           THEN i.eligible_at
                           ELSE t + CASE WHEN e.kind = 'replay'
                                         THEN p_delays[e.n] * interval '1 millisecond'
                                         ELSE interval '0' END END,
                      CASE WHEN e.kind = 'replay' THEN i.attempt + 1
                           WHEN e.kind IN ('done', 'stop') THEN i.attempt
                           ELSE 0 END,
                      CASE WHEN e.kind IN ('next', 'await', 'schedule_childs') THEN 0
                           ELSE i.reaps END,
                      CASE WHEN e.kind = 'schedule_childs' THEN p_children[e.n]
                           ELSE i.children_pending END,
                      -- Run-ahead keeps the claim: same worker, same epoch, same lease.
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN i.locked_by END,
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN i.lease_expires_at END,
                      t,
                      -- A transition's key and its target step's limit.
                      CASE WHEN e.moves AND p_keyed[e.n] THEN p_keys[e.n] ELSE i.partition_key END,
                      CASE WHEN e.moves AND p_keyed[e.n] THEN p_gates[e.n] ELSE i.gate END,
                      CASE WHEN e.moves THEN p_rate_limits[e.n] ELSE i.rate_limit END,
                      CASE WHEN e.moves THEN p_rate_keys[e.n] ELSE i.rate_key END,
                      CASE WHEN NOT e.moves THEN i.rate_weight
                           WHEN p_rate_limits[e.n] IS NOT NULL
                           THEN gd_rate_weight(p_rate_limits[e.n], p_rate_weights[e.n]) END,
                      CASE WHEN NOT e.moves THEN i.rate_step
                           WHEN p_rate_limits[e.n] IS NOT NULL THEN p_steps[e.n] END,
                      CASE WHEN e.moves THEN false ELSE i.rate_paid END,
                      -- Off the log: a plain row that is ready again gets its entry at
                      -- commit (`gd_instances_enqueue`, log.sql).
                      NULL::int8
                 -- The effective outcome: `stop` "cancelled" if a cancel was requested.
                 FROM (SELECT x.n,
                              CASE WHEN i.cancel_requested THEN 'stop'
                                   ELSE p_kinds[x.n] END AS kind,
                              CASE WHEN i.cancel_requested THEN 'cancelled'
                                   ELSE p_errors[x.n] END AS err,
                              -- A transition: the outcome leads to a step.
                              NOT i.cancel_requested
                                  AND p_kinds[x.n] IN ('next', 'await', 'schedule_childs')
                                  AS moves
                         FROM (SELECT width_bucket(i.id, p_ids) AS n) x) e)
         WHERE i.id = ANY (ready)
           AND i.id <> ALL (quick)
           AND i.id <> ALL (logged)
           AND i.id <> ALL (closed)
           AND CASE WHEN i.locked_by IS NULL
                    THEN i.status = 'runnable'
                         AND i.ready_seq = p_epochs[width_bucket(i.id, p_ids)]
                         AND EXISTS (SELECT 1 FROM gd_lanes l CROSS JOIN LATERAL (SELECT b.lo, b.hi, b.node, b.expires_at FROM gd_batches b
                              WHERE b.lane = l.lane AND b.lo <= i.ready_seq
                              ORDER BY b.lo DESC LIMIT 1) b
                                     WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                                       AND b.node = p_node AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)
                    ELSE i.locked_by = p_node
                         AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)] END
        RETURNING i.id, i.status, i.parent_id, i.queue, false AS ahead
    ), upd AS (
        SELECT * FROM fast UNION ALL SELECT * FROM slow UNION ALL SELECT * FROM shut
        UNION ALL SELECT g.id, g.status, g.parent_id, g.queue, g.ahead FROM logd g
    ), consumed AS (
        DELETE FROM gd_signals s USING upd u
         WHERE s.id = ANY (p_consumed) AND s.target_id = u.id
        RETURNING 1
    )
    SELECT coalesce(array_agg(u.id ORDER BY u.id), '{}'),
           coalesce(array_agg(u.id) FILTER (WHERE u.status = 'executing' OR u.ahead), '{}'),
           array_agg(u.id) FILTER (WHERE u.status IN ('done', 'failed')),
           array_agg(u.parent_id) FILTER (WHERE u.status IN ('done', 'failed')
                                            AND u.parent_id IS NOT NULL),
           array_agg(u.id) FILTER (WHERE u.status = 'awaiting_signal'),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM upd
                     WHERE status = 'runnable' AND NOT ahead AND queue = ANY (p_notify)) w)
      INTO committed, continued, finished, ended, parked, notified
      FROM upd u;

    -- 2. The parents of the rows that ended (their locks are held since statement 0),
    --    and the whole inbox of every finished row, as of now.
    PERFORM gd_rows_ended(finished, ended, t);

    -- 3. A parked `await` runs at once if a signal it names is in its inbox that the step
    --    did not already see in `ctx.awaited()`: a signal that arrived while the step ran
    --    is not lost, and a step that re-awaits to accumulate signals parks until a new
    --    one comes instead of spinning on the ones it has.
    IF parked IS NOT NULL THEN
        WITH woken AS (
            UPDATE gd_instances i
               SET status = 'runnable', await_deadline = NULL
             WHERE i.id = ANY (parked)
               AND EXISTS (SELECT 1 FROM gd_signals s
                            WHERE s.target_id = i.id AND s.name = ANY (i.awaits)
                              AND s.id <> ALL (p_seen))
            RETURNING i.queue
        )
        SELECT count(pg_notify('gd_wake', q)) INTO notified
          FROM (SELECT DISTINCT queue AS q FROM woken WHERE queue = ANY (p_notify)) w;
    END IF;

    at := t;
END
$$;


CREATE OR REPLACE FUNCTION gd_release(p_ids int8[], p_epochs int8[], p_node text, p_now timestamptz)
RETURNS SETOF int8 LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(p_now, statement_timestamp());
    mine    int8[];
    parents int8[];
    rows_   int8[];
    fails   int8[];
    ended   int8[];
    n       bigint;
BEGIN
    SELECT coalesce(array_agg(x.id), '{}') INTO mine FROM (
        SELECT i.id FROM gd_instances i
          JOIN unnest(p_ids, p_epochs) AS l(id, epoch) ON l.id = i.id
         WHERE CASE WHEN i.locked_by IS NULL
                    THEN i.status = 'runnable' AND i.ready_seq = l.epoch
                    ELSE i.lease_epoch = l.epoch AND i.locked_by = p_node
                         AND i.status = 'executing' END
         ORDER BY i.id
           FOR NO KEY UPDATE OF i SKIP LOCKED) x;
    IF cardinality(mine) = 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(x.id), '{}') INTO parents FROM (
        SELECT p.id FROM gd_instances p
         WHERE p.id IN (SELECT i.parent_id FROM gd_instances i
                         WHERE i.id = ANY (mine) AND i.parent_id IS NOT NULL AND i.cancel_requested)
         ORDER BY p.id
           FOR NO KEY UPDATE SKIP LOCKED) x;
    WITH released AS (
        UPDATE gd_instances i
           SET status = (CASE WHEN i.cancel_requested THEN 'failed' ELSE 'runnable' END)::gd_status,
               last_error = CASE WHEN i.cancel_requested THEN 'cancelled' ELSE i.last_error END,
               locked_by = NULL, lease_expires_at = NULL, updated_at = t, ready_seq = NULL
         WHERE i.id = ANY (mine)
           AND (i.parent_id IS NULL OR i.parent_id = ANY (parents) OR NOT i.cancel_requested)
        RETURNING i.id, i.status, i.parent_id, i.queue
    )
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}'),
           array_agg(r.id) FILTER (WHERE r.status = 'failed'),
           array_agg(r.parent_id) FILTER (WHERE r.status = 'failed' AND r.parent_id IS NOT NULL),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM released WHERE status = 'runnable') w)
      INTO rows_, fails, ended, n
      FROM released r;
    PERFORM gd_rows_ended(fails, ended, t);
    RETURN QUERY SELECT unnest(rows_);
END
$$;


-- The runnable plain rows, on the log in pick order.
SELECT count(*) FROM gd_append(
    ARRAY(SELECT id FROM gd_instances
           WHERE status = 'runnable' AND partition_key IS NULL AND gate IS NULL
             AND rate_limit IS NULL
           ORDER BY priority, eligible_at, id), NULL);
