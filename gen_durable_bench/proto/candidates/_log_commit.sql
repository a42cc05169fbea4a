-- Per row, the fence is the row's entry: written only if it is still the one claimed. A
-- `next` gives the row a new entry and appends it, its seq taken under the queue's
-- advisory lock in shared mode (`x`, before the first seq), which a tick waits for; the
-- durable row, which no index covers, is updated (HOT when its page has room). The
-- batch's lease goes with its commit.
WITH x AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(4242)),
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
