-- The queue's cursor, and its watermark: entries below `safe_hi` are all settled (the
-- transactions that took their seqs have committed or rolled back).
CREATE TABLE p_cursor (
    queue      text   PRIMARY KEY,
    next_seq   bigint NOT NULL DEFAULT 1,
    safe_hi    bigint NOT NULL DEFAULT 1,
    last_batch bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 10);
INSERT INTO p_cursor (queue) VALUES ('default');
-- A batch's lease, logged: after a crash the reaper finds the ranges in flight here.
CREATE TABLE p_batches (
    batch      bigint      PRIMARY KEY,
    worker     text        NOT NULL,
    lo         bigint      NOT NULL,
    hi         bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
-- The claim of a range, a short transaction of its own (the cursor's row is locked only
-- for it): takes up to `p_batch` entries below the watermark and leases them; once the
-- entries below it are used up, first moves the watermark (a tick).
CREATE FUNCTION p_advance(p_worker text, p_batch int8)
RETURNS TABLE (batch int8, lo int8, hi int8)
LANGUAGE plpgsql AS $advance$
#variable_conflict use_column
DECLARE
    c  p_cursor;
    b  int8;
    h  int8;
BEGIN
    SELECT * INTO c FROM p_cursor WHERE queue = 'default' FOR NO KEY UPDATE;
    -- A tick. Every transaction that appends holds the queue's advisory lock in shared
    -- mode from before it takes its first seq until it ends. Taken here in exclusive mode,
    -- the lock waits for those in flight and holds back new ones until this claim ends, so
    -- every seq handed out so far is then committed or rolled back: the end of the log, read
    -- from the sequence, is safe. (A snapshot cannot say it: its `xmax` is one past the last
    -- *completed* transaction, so a running appender newer than every completed one is
    -- neither below it nor in its in-progress list. A tick built on it let the cursor pass
    -- uncommitted entries, and a run lost 31 of them.)
    IF c.next_seq >= c.safe_hi THEN
        PERFORM pg_advisory_xact_lock(4242);
        c.safe_hi := (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END
                        FROM p_log_seq);
    END IF;
    h := least(c.next_seq + p_batch, c.safe_hi);
    b := greatest(c.last_batch + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::int8);
    UPDATE p_cursor
       SET next_seq = greatest(h, c.next_seq), safe_hi = c.safe_hi,
           last_batch = CASE WHEN h > c.next_seq THEN b
                                                            ELSE c.last_batch END
     WHERE queue = 'default';
    IF h > c.next_seq THEN
        INSERT INTO p_batches VALUES (b, p_worker, c.next_seq, h, now() + interval '30 s');
        RETURN QUERY SELECT b, c.next_seq, h;
    END IF;
END
$advance$;
-- The entries of a claimed range whose row still waits for them (a row that moved on, by
-- a redelivery or a cancel, is skipped); the epoch is the entry's seq, the per-row fence.
-- A function (PL/pgSQL, which keeps its plan) so that the plan keeps to the indexes: a segment made empty and analyzed
-- empty was read by a sequential scan once it had filled (5× slower with partitions).
CREATE FUNCTION p_read(p_lo int8, p_hi int8)
RETURNS TABLE (id int8, epoch int8, step text, state jsonb)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $read$
BEGIN
    RETURN QUERY
    SELECT l.id, l.seq, i.step, i.state
      FROM p_log l
      CROSS JOIN LATERAL (SELECT i.step, i.state, i.log_seq FROM p_instances i
                           WHERE i.id = l.id LIMIT 1) i
     WHERE l.seq >= p_lo AND l.seq < p_hi AND i.log_seq = l.seq;
END
$read$;
