-- The claim: up to `$4` runnable rows of queue `$1` in one statement, each returned with its
-- inbox and children, so a pick is one round trip whatever its size. The engine calls
-- `gd_claim_plain` while no gate and no rate limit is declared and `gd_claim` otherwise
-- (`gen_durable::store::pg::claim`); the plan tests and the SQL audit prepare the statement
-- between each function's `RETURN QUERY` and the `;` that ends it (`claim::body`), so that
-- text is what this file says.
--
-- Arguments, the same for all three: $1 queue, $2 FSM names and $3 their versions (only
-- pairs this node registered are claimed: other rows stay runnable for a node that can
-- run them), $4 how many, $5 the node, $6 the lease in milliseconds, $7 the injected now
-- (NULL: the database's).
--
-- Why functions: sent as a prepared statement, the claim was planned anew on every call
-- (its generic plan looks costly with an unknown `LIMIT`): 2.4–2.7 ms of a claim with
-- gates and rate limits, 0.4–0.5 ms without. Each function's settings hold for its call
-- only (no session state, so they work through PgBouncer in transaction mode):
-- - `plan_cache_mode = force_generic_plan` reuses one plan per connection;
-- - `enable_seqscan = off` keeps that plan on the indexes even when it was made while the
--   table was empty (such a plan, kept, read the whole table on every claim once it had
--   filled, until the next ANALYZE); every read of the claim has an index;
-- - `jit = off`: PostgreSQL compiles with LLVM on every execution above `jit_above_cost`,
--   and `gd_claim`'s generic plan is estimated from the whole backlog (1.8 s of compiling
--   per claim at 1,000,000 rows with gated ones, for a statement of 6 ms).
--
-- The claim commits without waiting for its WAL flush: the engine's statement calls
-- `set_config('synchronous_commit', 'off', true)` beside the function (a `SET LOCAL` inside
-- would be undone by the function's own `SET` clauses when it returns). A claim is the one
-- write a server crash may forget without harm: the row is back, runnable, and the worker
-- that claimed it cannot commit its outcome (the fence; `gd_lease_epoch` never gives an
-- epoch twice). A forgotten claim also frees its gate slot and the tokens it took.
--
-- The CTEs, as `gd_claim` has them (the other two are the same statement without some):
-- - `picked` is MATERIALIZED: the fence that makes `LIMIT` bound the rows locked. It reads
--   the pick index `(queue, priority, eligible_at, id) WHERE status = 'runnable' AND (a key, a
--   gate or a limit)` in order (plain rows are claimed from the log: log.sql)
--   and stops after the batch: a pick is O(batch), not O(backlog). `FOR NO KEY UPDATE` (not
--   `FOR UPDATE`) so that signal inserts, which take `KEY SHARE` on their target through
--   the foreign key, don't wait. `SKIP LOCKED`: two nodes take different rows.
-- - A queue in `gd_queue_pauses` gives nothing: the `NOT EXISTS` does not reference `i`, so
--   it is planned once per statement as an InitPlan under a one-time filter, and the pick's
--   index scan is not even started for a paused queue.
-- - Partitions: a row whose key already has an executing row is skipped. The `NOT EXISTS`
--   stands alone (a NULL key matches no row): alone it is an anti-join probing the partial
--   unique index per row read; inside an `OR` it was a hash of every executing row of every
--   queue on each claim. Only the first row per key of the batch is claimed (`chosen`); the
--   others are handed back untouched (no attempt burned) and listed in `contended`. Two
--   nodes racing on one key make one claim fail on the unique index; the caller retries.
-- - Gates: a gated row whose key already has K executing rows is skipped before the `LIMIT`,
--   so a full gate takes no place in the batch. The full keys are one array computed once
--   per statement (an InitPlan over the executing gated rows), tested per row as a filter:
--   as a join against a CTE, its estimate turned the pick into a scan and sort of the whole
--   queue. Of the rest, the first `room` rows per key (`ranked`) are claimed, each into a
--   free slot below K (`free`: its free slots ordered from an offset that depends on the
--   node, so two nodes claiming one key at once mostly pick different slots). The unique
--   index over (gate, key, slot) is the guarantee. `head` first reads the first `$4` rows
--   without locking them, and `bound` caps what `picked` locks at what can be claimed of
--   them (every row without a gate, at most the room of each gate key, and the rows of a
--   full key, which `picked` skips): without it a hot key with little room had most of each
--   claim's rows locked only to be handed back. Claims of one gate take turns across nodes:
--   `gd_claim` first locks the `gd_gates` rows of the gates at the head of the queue, then
--   counts free slots in a statement of its own, whose snapshot sees what the claim before
--   it took (two nodes otherwise chose the same slots, and one failed every time).
-- - Rate limits: chosen rows whose step is their limit's step, or that reserved tokens,
--   take them from their key's bucket (`wants`), reserved rows first, then in pick order.
--   The existing buckets are locked in key order (`stored`: claims, and the cancels and
--   restarts that give tokens back, write them, so a claim waits at most for one such
--   statement, never in a cycle), refilled to now and debited by the batch's total
--   (`buckets`, `settled`, `debited`); a key's first admission mints its bucket (`minted`;
--   two claims minting one key at once: the loser fails on the primary key and retries).
--   Only buckets short of tokens compute the running sum that finds the rows past what they
--   hold (`owed`): such a row is not claimed but reserves its tokens and is deferred,
--   runnable and paid, until they are due (`late`, `deferred`). `next_due` is the first
--   instant a paid row of the queue is due (`gd_instances_rate_due`), so the picker wakes
--   then.
-- - The rows a claim updates are found by primary key, one probe each (`id = ANY`, each
--   row's slot or due instant by `width_bucket` in the sorted ids), not by a join with the
--   batch: a plan made on an empty table walked the whole primary key on every claim.
-- - `claimed` bumps `lease_epoch`: every later write of this worker is fenced by it.
-- - The claimed rows' inboxes and children are read in one pass each over the claimed ids,
--   grouped by row: not two subqueries per claimed row.
-- - The result has one row per claimed row (or one row of NULLs when nothing was claimed but
--   a paid row waits, or when the variant should switch), each carrying the pick's summary:
--   `contended`, `throttled`, `next_due`, `now` and `flow` (whether a gate or a rate limit
--   is declared: the engine switches between `gd_claim` and `gd_claim_plain` on it).

-- The full claim, while a gate is declared. While none is (but a rate limit is), it hands
-- the claim to `gd_claim_rated`, skipping the gates' work (`head`, `bound`, `free`, the full
-- keys, the gates' lock), which cost a drain of rate-limited rows ~7% of its rate. (The
-- "5 in the header" of its first comment is that paragraph.)
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

-- `gd_claim` without the gates: the claim while rate limits are declared and no gate is.
-- Rows that name a gate are left to `gd_claim`, as `gd_claim_plain` leaves them: a gate
-- declared between the check and the claim has its rows claimed from the next pick on.
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

-- The claim while no gate and no rate limit is declared: `gd_claim` without the gates' and
-- the rate limits' CTEs (planned, they made a claim 5× as long to plan; run, they still
-- cost each claim their probes and sorts). With none declared no row can name one (the
-- reference triggers); the filter on both is belt and braces. `flow` says whether one is
-- declared now, and the row of the pick's summary comes back when it is, so the engine
-- switches to `gd_claim` from the next pick on.
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
