-- The ready queue as a log (docs/design/storage-v2.md): what a row that may run now waits
-- in, apart from its durable row. An entry is appended when a row becomes ready and is
-- never updated; claims take whole ranges of a lane's entries below a watermark, and the
-- durable row is written once per step, by its outcome.
--
-- Plain rows live on the log: rows with no K = 1 key, no gate and no rate limit. Rows with
-- one stay on the row-by-row claims of claim.sql (their admission is decided per row).
-- A plain row that runs keeps the status `runnable`: it is executing while its entry lies
-- in a live batch (`gd_batches`), and nothing is written to it when it is claimed.

-- Every entry's place in the log, across lanes: its order, and the per-row fence
-- (`gd_instances.ready_seq`). One sequence for all lanes, so that seqs order entries
-- across lanes too (a claim serves a lane whose head is older first).
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
        -- A parent that is gone (collected) waits for nothing: it counts as held.
        parents := parents || ARRAY(SELECT DISTINCT i.parent_id FROM gd_instances i
                                     WHERE i.id = ANY (fail) AND i.parent_id IS NOT NULL
                                       AND NOT EXISTS (SELECT 1 FROM gd_instances p
                                                        WHERE p.id = i.parent_id));
        CONTINUE WHEN cardinality(parents) < (SELECT count(DISTINCT i.parent_id) FROM gd_instances i
                                              WHERE i.id = ANY (fail));
        WITH reaped AS (
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
         WHERE i.id = ANY (got)
        RETURNING i.id, i.step, i.attempt, i.last_error
        )
        INSERT INTO gd_history (instance_id, at, kind, step, attempt, node, error)
        SELECT r.id, t, 'lease_lost', r.step, r.attempt, g.node, r.last_error FROM reaped r;
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
