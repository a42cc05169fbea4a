-- The history of every instance (docs/guide/history.md): one entry per outcome a step
-- committed, written by the commit in its statement (so it is exactly what committed,
-- fenced like the outcome), and one per lost lease and release. Kept by
-- its own age, in one partition per day that the collector drops whole (`gd_history_keep`):
-- no DELETE, no bloat, nothing written to the instance rows. Appended to, never updated.
--   entry       the entry's id: orders an instance's entries, and names one (a fork's origin)
--   at          when it was committed (the database's clock; the engine's manual clock in tests)
--   kind        next, retry, await, children, done, failed, cancelled (an outcome);
--               lease_lost, released, migrated (the engine); cancelled, cancel_requested,
--               retried, restarted, migrated (an operator's action, with its actor)
--   step        the step that ran (for a lost lease or a release: the step that was to run)
--   attempt     the step's attempt, from 1
--   started_at  when the step began: `at` less the step's duration as its worker measured it
--   next_step   the step the outcome leads to (next, await, children)
--   node        the node whose worker ran the step (or lost its lease)
--   error       the step's error (a retry's, a stop's reason), a lost lease's account
--   signals     the signals the step consumed
--   children    how many children the step spawned
--   state       the state the step began with (level `full` only)
--   actor       who did an operator's action: the name the client was given
--               (`Client::with_actor`), else the database role it connected as
--   detail      what an action did that the other columns do not say (a migration's versions)
CREATE SEQUENCE gd_history_entry;

CREATE TABLE gd_history (
    entry       bigint      NOT NULL DEFAULT nextval('gd_history_entry'),
    instance_id bigint      NOT NULL,
    at          timestamptz NOT NULL,
    kind        text        NOT NULL,
    step        text        NOT NULL,
    attempt     integer     NOT NULL,
    started_at  timestamptz,
    next_step   text,
    node        text,
    error       text,
    signals     int8[],
    children    integer,
    state       jsonb,
    actor       text,
    detail      text
) PARTITION BY RANGE (at);

-- Entries the day partitions do not cover (the collector did not run ahead of them). They
-- are collected by DELETE, the only ones.
CREATE TABLE gd_history_default PARTITION OF gd_history DEFAULT;

-- An instance's entries in order (a read, a page of it, a fork's entry).
CREATE INDEX gd_history_instance ON gd_history (instance_id, entry);

-- Keeps the history's partitions: one per day (UTC) from `p_now`'s day to two days ahead,
-- and none whose whole day is older than `p_keep`; the default partition's entries older
-- than that are deleted. The collector's, once a pass. Returns the partitions it created
-- and dropped.
--
-- Engines connect as a role without DDL (docs/roles.sql): this runs as the schema's owner
-- (SECURITY DEFINER, its search path fixed), and takes from its caller only a time and an
-- interval. Anyone may call a function, so it first checks that its caller may delete the
-- history's entries (a role that may not, such as a read-only reader, may not drop them
-- by the day either). Creating a partition takes a lock that waits for no one (an attach, beside
-- the commits' inserts); dropping one needs the table to itself, so it gives up after
-- `lock_timeout` and is tried again at the next pass. A day whose entries went to the
-- default partition (the collector did not run ahead of it) gets no partition: its
-- entries stay there, and are deleted when they are old enough.
CREATE FUNCTION gd_history_keep(p_now timestamptz, p_keep interval,
                                OUT created integer, OUT dropped integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = public, pg_temp
SET lock_timeout = '100ms' AS $$
DECLARE
    today date := (p_now AT TIME ZONE 'UTC')::date;
    day   date;
    part  text;
    lo    timestamptz;
BEGIN
    IF NOT has_table_privilege(session_user, 'gd_history', 'DELETE') THEN
        RAISE EXCEPTION 'permission denied: role % may not delete from gd_history', session_user
              USING ERRCODE = 'insufficient_privilege';
    END IF;
    created := 0;
    dropped := 0;
    -- One keeper at a time (several nodes collect).
    IF NOT pg_try_advisory_xact_lock(1734631280) THEN
        RETURN;
    END IF;
    FOR day IN SELECT d::date FROM generate_series(today, today + 2, interval '1 day') d LOOP
        part := 'gd_history_' || to_char(day, 'YYYYMMDD');
        lo := day::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN to_regclass(part) IS NOT NULL
                   OR EXISTS (SELECT 1 FROM gd_history_default h
                               WHERE h.at >= lo AND h.at < lo + interval '1 day');
        BEGIN
            EXECUTE format('CREATE TABLE %I (LIKE gd_history INCLUDING DEFAULTS)', part);
            EXECUTE format('ALTER TABLE gd_history ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           part, lo, lo + interval '1 day');
            created := created + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    FOR part IN SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
                 WHERE h.inhparent = 'gd_history'::regclass
                   AND c.relname ~ '^gd_history_[0-9]{8}$'
                   AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= ((p_now - p_keep) AT TIME ZONE 'UTC')::date
                 ORDER BY c.relname LOOP
        BEGIN
            EXECUTE format('DROP TABLE %I', part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    DELETE FROM gd_history_default h WHERE h.at < p_now - p_keep;
END
$$;
