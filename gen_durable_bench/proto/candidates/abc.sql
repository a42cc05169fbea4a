-- abc: a's narrow queue entry, but never updated (a `next` keeps its place; a `done`
-- deletes it); b's unlogged leases; and a durable row with no index on anything a step
-- changes, so each of its updates can be HOT. Terminal rows are found for retention
-- through an append-only log of (finished_at, id).
-- @setup
@include _narrow.sql
@include _leases.sql
CREATE TABLE p_ready (
    id          bigint      PRIMARY KEY,
    queue       text        NOT NULL,
    priority    smallint    NOT NULL DEFAULT 0,
    eligible_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX p_ready_pick ON p_ready (queue, priority, eligible_at, id);
CREATE TABLE p_finished (
    finished_at timestamptz NOT NULL,
    id          bigint      NOT NULL,
    PRIMARY KEY (finished_at, id)
);
-- The claim, as a function of two statements: the first locks the entries and takes their
-- leases; the second, with a fresh snapshot, reads the rows' step and state. In one
-- statement the read would use the snapshot taken before the locks: a lease deleted by a
-- commit after it would let the claim read the step that commit has just moved past, and
-- run it again. (v1 locks and reads the same row, so the lock's recheck gives it the
-- latest version.) The lease probe has a LIMIT so that it stays a probe of p_leases' key
-- per row: as an anti-join the planner materialized every lease.
CREATE FUNCTION p_claim(p_worker text, p_batch int8)
RETURNS TABLE (id int8, epoch int8, step text, state jsonb)
LANGUAGE plpgsql AS $claim$
#variable_conflict use_column
DECLARE
    ids    int8[];
    epochs int8[];
BEGIN
    WITH c AS MATERIALIZED (
        SELECT r.id FROM p_ready r
         WHERE r.queue = 'default' AND r.eligible_at <= now()
           AND NOT EXISTS (SELECT 1 FROM p_leases l
                            WHERE l.id = r.id AND l.expires_at > now() LIMIT 1)
         ORDER BY r.priority, r.eligible_at, r.id
         LIMIT p_batch
           FOR NO KEY UPDATE SKIP LOCKED),
    l AS (
        INSERT INTO p_leases AS p (id, epoch, locked_by, expires_at)
        SELECT c.id, (extract(epoch FROM clock_timestamp()) * 1000000)::int8, p_worker,
               now() + interval '30 s'
          FROM c
        ON CONFLICT (id) DO UPDATE
           SET epoch = greatest(p.epoch + 1, excluded.epoch), locked_by = excluded.locked_by,
               expires_at = excluded.expires_at
         WHERE p.expires_at <= now()
        RETURNING p.id, p.epoch)
    SELECT array_agg(l.id ORDER BY l.id), array_agg(l.epoch ORDER BY l.id)
      INTO ids, epochs FROM l;
    RETURN QUERY
    SELECT i.id, epochs[width_bucket(i.id, ids)], i.step, i.state
      FROM p_instances i WHERE i.id = ANY (ids);
END
$claim$;
-- @seed
WITH i AS (
    INSERT INTO p_instances (fsm, fsm_version, step, state, queue)
    SELECT 'proto', 1, 's0', jsonb_build_object('i', g, 'step', 0), 'default'
      FROM generate_series(1, $1) g
    RETURNING id, queue, priority)
INSERT INTO p_ready (id, queue, priority) SELECT id, queue, priority FROM i
-- @claim
SELECT c.* FROM set_config('synchronous_commit', 'off', true) AS without_flush,
       p_claim($1, $2) c
-- @commit
-- Rows by primary key (`= ANY`), each outcome found by binary search in the sorted
-- ids (`width_bucket`): no join of the arrays with a table, whose plan could rescan them.
-- The queue entries of the `done` rows are locked (`k`, an InitPlan of `f`, so before the
-- first lease is deleted), then the leases: a claim holds an entry it locked while it
-- waits on a lease a commit is deleting, so the other order deadlocks.
WITH k AS MATERIALIZED (
    SELECT r.id FROM p_ready r
     WHERE r.id = ANY ($1::int8[]) AND ($4::text[])[width_bucket(r.id, $1::int8[])] IS NULL
     ORDER BY r.id
       FOR NO KEY UPDATE),
f AS (
    DELETE FROM p_leases l
     WHERE l.id = ANY ($1::int8[]) AND l.locked_by = $3 AND l.epoch = ($2::int8[])[width_bucket(l.id, $1::int8[])]
       AND (SELECT count(*) FROM k) >= 0
    RETURNING l.id, ($4::text[])[width_bucket(l.id, $1::int8[])] AS s),
r AS (DELETE FROM p_ready r WHERE r.id = ANY (ARRAY(SELECT id FROM f WHERE s IS NULL))),
u AS (
    UPDATE p_instances i
       SET step = coalesce(($4::text[])[width_bucket(i.id, $1::int8[])], i.step), state = ($5::jsonb[])[width_bucket(i.id, $1::int8[])],
           status = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN 'done' ELSE i.status END,
           result = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN '{"ok": true}'::jsonb END,
           finished_at = CASE WHEN ($4::text[])[width_bucket(i.id, $1::int8[])] IS NULL THEN now() END,
           attempt = 0, updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM f))
    RETURNING i.id, ($4::text[])[width_bucket(i.id, $1::int8[])] AS s),
g AS (INSERT INTO p_finished SELECT now(), id FROM u WHERE s IS NULL)
SELECT count(*) FROM u
-- @gc
WITH f AS (DELETE FROM p_finished WHERE (finished_at, id) IN (
             SELECT finished_at, id FROM p_finished WHERE finished_at <= now()
              ORDER BY finished_at, id LIMIT 5000) RETURNING id),
     d AS (DELETE FROM p_instances i USING f WHERE i.id = f.id RETURNING 1)
SELECT count(*) FROM d
-- @tables
p_instances, p_ready, p_leases, p_finished
