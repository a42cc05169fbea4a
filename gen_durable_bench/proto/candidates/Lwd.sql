-- Lwd: Lw, but a `done` keeps its result: it moves the durable row into p_done (a delete and
-- an insert), which stands for one day's partition; retention truncates it and the log.
-- @setup
@include _narrow.sql
-- The entry that scheduled the row's current step: the per-row fence. A commit writes only
-- if it is still the entry the worker claimed; a redelivery appends a new one.
ALTER TABLE p_instances ADD COLUMN log_seq bigint NOT NULL DEFAULT 0;
CREATE SEQUENCE p_log_seq;
CREATE TABLE p_log (
    seq bigint PRIMARY KEY DEFAULT nextval('p_log_seq'),
    id  bigint NOT NULL
);
-- The queue's cursor, and its watermark: entries below `safe_hi` are all settled (no
-- transaction that could still commit one is running). `pending_hi` is the end of the log
-- as seen at the last tick, which becomes safe once every transaction running then, all
-- with an id below `pending_xmax`, has ended.
CREATE TABLE p_cursor (
    queue        text   PRIMARY KEY,
    next_seq     bigint NOT NULL DEFAULT 1,
    safe_hi      bigint NOT NULL DEFAULT 1,
    pending_hi   bigint NOT NULL DEFAULT 1,
    pending_xmax xid8   NOT NULL DEFAULT '0',
    last_batch   bigint NOT NULL DEFAULT 0
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
-- for it): moves the watermark when the last tick has settled, then takes up to `p_batch`
-- entries below it and leases them.
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
    IF pg_snapshot_xmin(pg_current_snapshot()) >= c.pending_xmax THEN
        c.safe_hi := c.pending_hi;
        c.pending_hi := (SELECT coalesce(max(l.seq), 0) + 1 FROM p_log l);
        -- Taken after the end was read: a transaction that committed an entry seen there
        -- has an id below it, and so has any still running that holds a lower seq.
        c.pending_xmax := pg_snapshot_xmax(pg_current_snapshot());
    END IF;
    h := least(c.next_seq + p_batch, c.safe_hi);
    b := greatest(c.last_batch + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::int8);
    UPDATE p_cursor
       SET next_seq = greatest(h, c.next_seq), safe_hi = c.safe_hi, pending_hi = c.pending_hi,
           pending_xmax = c.pending_xmax, last_batch = CASE WHEN h > c.next_seq THEN b
                                                            ELSE c.last_batch END
     WHERE queue = 'default';
    IF h > c.next_seq THEN
        INSERT INTO p_batches VALUES (b, p_worker, c.next_seq, h, now() + interval '30 s');
        RETURN QUERY SELECT b, c.next_seq, h;
    END IF;
END
$advance$;
CREATE TABLE p_done (LIKE p_instances INCLUDING DEFAULTS);
ALTER TABLE p_done ADD PRIMARY KEY (id);
-- @seed
WITH i AS (
    INSERT INTO p_instances (fsm, fsm_version, step, state, queue, log_seq)
    SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default', nextval('p_log_seq')
      FROM generate_series(1, $1) g
    RETURNING id, log_seq)
INSERT INTO p_log (seq, id) SELECT log_seq, id FROM i ORDER BY log_seq
-- @claim
SELECT a.lo, a.hi FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       p_advance($1, $2) a
-- @read
-- The entries of the range whose row still waits for them (a row that moved on, by a
-- redelivery or a cancel, is skipped); the epoch is the entry's seq, the per-row fence.
SELECT l.id, l.seq AS epoch, i.step, i.state
  FROM p_log l
  CROSS JOIN LATERAL (SELECT i.step, i.state, i.log_seq FROM p_instances i
                       WHERE i.id = l.id LIMIT 1) i
 WHERE l.seq >= $1 AND l.seq < $2 AND i.log_seq = l.seq
-- @commit
-- Per row, the fence is the row's entry: written only if it is still the one claimed. A
-- `next` gives the row a new entry (its seq taken after the transaction has its id, so
-- the watermark covers it: `x`) and appends it; the durable row, which no index covers,
-- is updated (HOT when its page has room). The batch's lease goes with its commit.
WITH x AS MATERIALIZED (SELECT pg_current_xact_id() AS xid),
n AS (
    UPDATE p_instances i
       SET step = ($4::text[])[width_bucket(i.id, $1::int8[])], state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])], attempt = 0, updated_at = now(),
           log_seq = nextval('p_log_seq')
     WHERE i.id = ANY ($1::int8[]) AND i.log_seq = ($2::int8[])[width_bucket(i.id, $1::int8[])] AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NOT NULL
       AND EXISTS (SELECT 1 FROM x)
    RETURNING i.id, i.log_seq),
q AS (INSERT INTO p_log (seq, id) SELECT log_seq, id FROM n ORDER BY log_seq),
k AS (DELETE FROM p_batches b
       WHERE b.worker = $3 AND b.lo <= (SELECT min(e) FROM unnest($2::int8[]) e)
         AND b.hi > (SELECT min(e) FROM unnest($2::int8[]) e)),
d AS (
    DELETE FROM p_instances i
     WHERE i.id = ANY ($1::int8[]) AND i.log_seq = ($2::int8[])[width_bucket(i.id, $1::int8[])] AND ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL
    RETURNING i.id, i.fsm, i.fsm_version, i.step, 'done', ($5::jsonb[])[width_bucket(i.id, $1::int8[])], '{"ok": true}'::jsonb,
              i.awaits, i.await_deadline, i.queue, i.priority, i.partition_key, i.attempt,
              i.reaps, i.max_reaps, i.last_error, i.parent_id, i.children_pending,
              i.unique_key, i.inserted_at, now(), now(), i.cancel_requested, i.gate,
              i.rate_limit, i.rate_key, i.rate_weight, i.rate_step, i.log_seq),
m AS (INSERT INTO p_done SELECT * FROM d RETURNING 1)
SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM m)
-- @gc
TRUNCATE p_log, p_done
-- @tables
p_instances, p_log, p_cursor, p_batches, p_done
