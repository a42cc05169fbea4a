-- Rate-limit reservations and pauses, where the audit of round four found them broken
-- (RELIABILITY.md, R4-1, R4-2, R4-3, R4-5).
--
-- A bucket now also counts what waiting rows have reserved (`held`: the weights of its
-- runnable rows with `rate_paid`). `tokens` keeps its meaning (the level, debts included,
-- as of `at`), but its refill stops at `burst - held`, not at `burst`: tokens that rows
-- reserved and did not use in their time (the queue was paused, no node was up) are not
-- handed out again on top of a full bucket (R4-2). A reserved row no longer starts for
-- free whenever it is due: the claims take it first in its bucket's line, ahead of the
-- rows that reserve now, and it starts only if the bucket holds its tokens (else it waits
-- again, keeping its reservation). So a restart, or a cancel and a retry, of reserved rows
-- (which makes them due now) cannot start them early (R4-1), and a cancel gives the
-- tokens back. The hand-off leaves rows that pay or hold tokens to the claims. A due time
-- is at most ~95 years away, so an extreme limit cannot make a claim fail (R4-5). The
-- collector recounts `held` from the rows (`rate_limit.rs`, SWEEP), so a write that
-- missed it (a cancel by a node of an earlier version) is corrected.
--
-- A run-ahead `next` of a paused queue is committed as a plain `next`: the row goes back
-- to its queue, runnable (R4-3).
--
-- The functions are those of 0026 (`gd_claim_rated`, `gd_claim`), 0030 (`gd_handoff`)
-- and 0024 (`gd_commit_outcomes`) with these changes only.

ALTER TABLE gd_buckets ADD COLUMN held double precision NOT NULL DEFAULT 0;

-- The reserved rows of a bucket, for the collector's recount of `held` (only rows that
-- hold a reservation are in it).
CREATE INDEX gd_instances_rate_held ON gd_instances (rate_limit, rate_key)
    WHERE status = 'runnable' AND rate_paid;

-- What is reserved now: rows that reserved while their bucket was collected (the
-- collector deleted buckets whose level came back to the burst, reservations or not) get
-- a full bucket that holds their tokens.
WITH held AS (
    SELECT rate_limit, rate_key, sum(rate_weight) AS w
      FROM gd_instances
     WHERE status = 'runnable' AND rate_paid AND rate_limit IS NOT NULL
     GROUP BY 1, 2
), counted AS (
    UPDATE gd_buckets b SET held = h.w
      FROM held h
     WHERE b.name = h.rate_limit AND b.key = h.rate_key
    RETURNING b.name, b.key
)
INSERT INTO gd_buckets (name, key, tokens, held, at)
SELECT h.rate_limit, h.rate_key, l.burst - h.w, h.w, now()
  FROM held h
  JOIN gd_rate_limits l ON l.name = h.rate_limit
 WHERE NOT EXISTS (SELECT 1 FROM gd_buckets b WHERE b.name = h.rate_limit AND b.key = h.rate_key);

-- The collector's recount of what is reserved: `held` of up to `p_limit` buckets, from
-- their rows, moving `tokens` by the same difference (so `tokens + held`, the tokens not
-- yet taken, is unchanged). Every write of `held` locks its bucket, so the buckets are
-- locked first (skipping those a claim or an operator holds) and counted in a statement
-- of its own, whose snapshot sees what the holders before it committed. How many were
-- corrected.
CREATE FUNCTION gd_recount_held(p_limit int8) RETURNS int8
LANGUAGE plpgsql AS $recount$
DECLARE
    tids tid[];
    n    int8;
BEGIN
    SELECT array_agg(b.ctid) INTO tids
      FROM (SELECT g.ctid FROM gd_buckets g
             WHERE g.held > 0 OR EXISTS (SELECT 1 FROM gd_instances i
                                          WHERE i.rate_limit = g.name AND i.rate_key = g.key
                                            AND i.status = 'runnable' AND i.rate_paid)
             ORDER BY g.name, g.key
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED) b;
    WITH counted AS (
        SELECT g.ctid AS tid, g.held AS was,
               coalesce((SELECT sum(i.rate_weight) FROM gd_instances i
                          WHERE i.rate_limit = g.name AND i.rate_key = g.key
                            AND i.status = 'runnable' AND i.rate_paid), 0) AS held
          FROM gd_buckets g
         WHERE g.ctid = ANY (tids)
    ), fixed AS (
        UPDATE gd_buckets g SET held = c.held, tokens = g.tokens + (c.was - c.held)
          FROM counted c
         WHERE g.ctid = c.tid AND c.held <> c.was
        RETURNING 1
    )
    SELECT count(*) INTO n FROM fixed;
    RETURN n;
END
$recount$;

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

CREATE OR REPLACE FUNCTION gd_handoff(
    p_names    text[],
    p_versions int4[],
    p_node     text,
    p_lease_ms int8,
    p_now      timestamptz,
    p_ids      int8[],
    p_queues   text[],
    p_gates    text[],
    p_keys     text[],
    p_slots    int2[])
RETURNS TABLE (id bigint, fsm text, fsm_version integer, step text, state jsonb, attempt integer,
    awaits text[], lease_epoch bigint, partition_key text, gate text, inbox json, children json,
    now timestamptz, queue text, gate_slot int2)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $handoff$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH ended AS (
    -- The slots the caller's rows held and no longer hold (`p_ids` are rows whose outcome
    -- this transaction committed; `p_gates`, `p_keys` and `p_slots` the gate key and slot
    -- each was claimed in). A slot the caller does not know (NULL: a row the claim took,
    -- which returns no slot) is read by primary key, and only from a row that ended.
    SELECT f.queue, f.gate, f.key,
           array_agg(coalesce(f.slot, (SELECT i.gate_slot FROM gd_instances i
                                        WHERE i.id = f.id AND i.status <> 'executing')))
               AS slots
      FROM unnest(p_ids, p_queues, p_gates, p_keys, p_slots) f(id, queue, gate, key, slot)
     GROUP BY f.queue, f.gate, f.key
), freed AS MATERIALIZED (
    -- Per key of a queue not paused, those below the gate's size now, while no running
    -- row of the key holds a slot at or above it (see 1 above).
    SELECT e.queue, e.gate, e.key,
           ARRAY(SELECT s FROM unnest(e.slots) s WHERE s < g.size ORDER BY s) AS slots
      FROM ended e
      JOIN gd_gates g ON g.name = e.gate
     WHERE NOT EXISTS (SELECT 1 FROM gd_queue_pauses qp WHERE qp.queue = e.queue)
       AND NOT EXISTS (SELECT 1 FROM gd_instances x
                        WHERE x.status = 'executing' AND x.gate = e.gate
                          AND x.partition_key = e.key AND x.gate_slot >= g.size)
), picked AS MATERIALIZED (
    -- The key's next rows, as many as its slots, in pick order, each given the slot of its
    -- rank among them (numbered here, per key, over the few rows the scan returns).
    SELECT n.id, n.priority, n.eligible_at, k.queue, k.gate, k.key, k.slots[n.rn] AS slot
      FROM freed k
     CROSS JOIN LATERAL (
        SELECT o.*, row_number() OVER (ORDER BY o.priority, o.eligible_at, o.id) AS rn
          FROM (SELECT i.id, i.priority, i.eligible_at
                  FROM gd_instances i
                 WHERE i.queue = k.queue AND i.gate = k.gate AND i.partition_key = k.key
                   AND i.status = 'runnable'
                   AND i.eligible_at <= coalesce(p_now, now())
                   AND (i.fsm, i.fsm_version) IN (SELECT * FROM unnest(p_names, p_versions))
                   -- A row that pays tokens, or holds a reservation, starts by a claim,
                   -- which sees its bucket (R4-1).
                   AND NOT (i.rate_limit IS NOT NULL AND (i.rate_paid OR i.rate_step = i.step))
                 ORDER BY i.priority, i.eligible_at, i.id
                 LIMIT cardinality(k.slots)
                   FOR NO KEY UPDATE SKIP LOCKED) o) n
), bar AS (
    -- Priorities first: the highest-priority row of the queue, above the key's candidates,
    -- that a claim would take (due, of a version the node runs, not of a K = 1 key running
    -- now, not of a full gate key). Only candidates of its priority or higher are handed
    -- their slots; the others are left to the picker's claim, which takes that row first.
    -- Within a priority a freed slot goes to its own key's next row. (Only rows of a
    -- higher priority are read, none in the usual case of one priority.)
    SELECT l.queue, l.gate, l.key, b.priority
      FROM (SELECT p.queue, p.gate, p.key, max(p.priority) AS priority
              FROM picked p GROUP BY p.queue, p.gate, p.key) l
     CROSS JOIN LATERAL (
        SELECT h.priority
          FROM gd_instances h
         WHERE h.queue = l.queue
           AND h.status = 'runnable'
           AND h.priority < l.priority
           AND h.eligible_at <= coalesce(p_now, now())
           AND (h.fsm, h.fsm_version) IN (SELECT * FROM unnest(p_names, p_versions))
           AND NOT EXISTS (SELECT 1 FROM gd_instances e
                            WHERE e.partition_key = h.partition_key AND e.status = 'executing'
                              AND e.gate IS NULL AND h.gate IS NULL)
           AND NOT coalesce((SELECT count(*) FROM gd_instances e
                              WHERE e.status = 'executing' AND e.gate = h.gate
                                AND e.partition_key = h.partition_key)
                            >= (SELECT g.size FROM gd_gates g WHERE g.name = h.gate), false)
         ORDER BY h.priority, h.eligible_at, h.id
         LIMIT 1) b
), chosen AS (
    SELECT array_agg(p.id ORDER BY p.id) AS ids, array_agg(p.slot ORDER BY p.id) AS slots
      FROM picked p
     WHERE NOT EXISTS (SELECT 1 FROM bar b
                        WHERE b.queue = p.queue AND b.gate = p.gate AND b.key = p.key
                          AND p.priority > b.priority)
), claimed AS (
    UPDATE gd_instances i
       SET status = 'executing', locked_by = p_node, lease_epoch = gd_lease_epoch(i.lease_epoch),
           lease_expires_at = coalesce(p_now, now()) + p_lease_ms * interval '1 millisecond',
           updated_at = coalesce(p_now, now()),
           gate_slot = (SELECT slots FROM chosen)[width_bucket(i.id, (SELECT ids FROM chosen))],
           rate_paid = false
     WHERE i.id = ANY ((SELECT ids FROM chosen)::int8[])
    RETURNING i.id, i.fsm, i.fsm_version, i.step, i.state, i.attempt, i.awaits, i.lease_epoch,
              i.partition_key, i.gate, i.queue, i.gate_slot
)
SELECT c.id, c.fsm, c.fsm_version, c.step, c.state, c.attempt, c.awaits, c.lease_epoch,
       c.partition_key, c.gate,
       coalesce(sg.inbox, '[]'), coalesce(kid.children, '[]'),
       coalesce(p_now, now()), c.queue, c.gate_slot
  FROM claimed c
  LEFT JOIN (SELECT s.target_id, json_agg(json_build_object(
                   'id', s.id, 'name', s.name, 'payload', s.payload,
                   'dedup_key', s.dedup_key, 'inserted_at', s.inserted_at) ORDER BY s.id) AS inbox
               FROM gd_signals s WHERE s.target_id = ANY ((SELECT ids FROM chosen)::int8[])
              GROUP BY s.target_id) sg ON sg.target_id = c.id
  LEFT JOIN (SELECT ch.parent_id, json_agg(json_build_object(
                   'id', ch.id, 'fsm', ch.fsm, 'status', ch.status, 'state', ch.state,
                   'result', ch.result, 'last_error', ch.last_error) ORDER BY ch.id) AS children
               FROM gd_instances ch WHERE ch.parent_id = ANY ((SELECT ids FROM chosen)::int8[])
              GROUP BY ch.parent_id) kid ON kid.parent_id = c.id
 ORDER BY c.id;
END
$handoff$;

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
                          WHEN f.kind = 'next' AND f.ahead AND NOT coalesce(f.keyed, false)
                               AND f.rate_limit IS NULL THEN 2
                          ELSE 0 END ORDER BY f.n)
      INTO how
      FROM unnest(p_kinds, p_run_ahead, p_keyed, p_rate_limits)
           WITH ORDINALITY f(kind, ahead, keyed, rate_limit, n);
    --    (Rows without a parent are left out by the aggregate's filter: in a WHERE,
    --    `parent_id IS NOT NULL` matched the partial index over children, which the planner
    --    chose when the statistics said no row has a parent; 0017.)
    SELECT coalesce(array_agg(x.id), '{}'),
           coalesce(array_agg(x.id) FILTER (WHERE NOT x.cancelled AND x.how = 2), '{}'),
           coalesce(array_agg(DISTINCT x.parent_id)
                        FILTER (WHERE (x.cancelled OR x.how = 1) AND x.parent_id IS NOT NULL),
                    '{}')
      INTO mine, quick, wanted
      FROM (SELECT i.id, i.parent_id, i.cancel_requested AS cancelled,
                   how[width_bucket(i.id, p_ids)] AS how
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
        END IF;
    END IF;
    -- Deferred: still this node's, but locked by someone else (or its parent is).
    IF cardinality(ready) = cardinality(p_ids) THEN
        deferred := '{}';
    ELSE
        SELECT coalesce(array_agg(i.id), '{}') INTO deferred FROM gd_instances i
         WHERE i.id = ANY (p_ids) AND i.id <> ALL (ready)
           AND i.locked_by = p_node AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)];
    END IF;

    -- 1. Apply every fenced outcome (what each kind writes: `Step` in fsm.rs); an `await`
    --    parks here and statement 3 wakes it if its signal is in. The fence is
    --    `(locked_by, lease_epoch)`: `locked_by` is set exactly while a row is claimed, and
    --    a new claim bumps the epoch. No join between the arrays and the table (its plan
    --    would rescan the arrays per row): rows by primary key, outcomes by binary search.
    --    A run-ahead `next` that moves no key and takes no limit (`quick`, never a row
    --    that ends) writes only what such an outcome changes; the general `UPDATE` takes
    --    the rest, a cancelled row included.
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
        RETURNING i.id, i.status, i.parent_id, i.queue
    ), slow AS (
        UPDATE gd_instances i
           SET (step, state, status, result, last_error, awaits, await_deadline,
                eligible_at, attempt, reaps, children_pending, locked_by,
                lease_expires_at, updated_at, partition_key, gate, rate_limit, rate_key,
                rate_weight, rate_step, rate_paid) = (
               SELECT coalesce(CASE WHEN e.kind <> 'stop' THEN p_steps[e.n] END, i.step),
                      coalesce(p_states[e.n], i.state),
                      (CASE
                           WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN 'executing'
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
                      CASE WHEN e.kind = 'next' AND p_run_ahead[e.n] THEN i.eligible_at
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
                      CASE WHEN e.moves THEN false ELSE i.rate_paid END
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
           AND i.locked_by = p_node
           AND i.lease_epoch = p_epochs[width_bucket(i.id, p_ids)]
        RETURNING i.id, i.status, i.parent_id, i.queue
    ), upd AS (
        SELECT * FROM fast UNION ALL SELECT * FROM slow
    ), consumed AS (
        DELETE FROM gd_signals s USING upd u
         WHERE s.id = ANY (p_consumed) AND s.target_id = u.id
        RETURNING 1
    )
    SELECT coalesce(array_agg(u.id ORDER BY u.id), '{}'),
           coalesce(array_agg(u.id) FILTER (WHERE u.status = 'executing'), '{}'),
           array_agg(u.id) FILTER (WHERE u.status IN ('done', 'failed')),
           array_agg(u.parent_id) FILTER (WHERE u.status IN ('done', 'failed')
                                            AND u.parent_id IS NOT NULL),
           array_agg(u.id) FILTER (WHERE u.status = 'awaiting_signal'),
           (SELECT count(pg_notify('gd_wake', q))
              FROM (SELECT DISTINCT queue AS q FROM upd
                     WHERE status = 'runnable' AND queue = ANY (p_notify)) w)
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
