-- The references of `gd_instances.gate` to `gd_gates` and of `gd_instances.rate_limit` to
-- `gd_rate_limits` (0011, 0012), kept by triggers instead of foreign keys, so that a row
-- naming neither costs nothing (PERFORMANCE.md, "Where insert_all's server time goes").
--
-- PostgreSQL queues a foreign key's check for every row inserted, whatever its value, and
-- only then finds the column NULL: in a batch insert of rows without a gate or a limit,
-- the two checks took 10–14% of the statement's execution, 8% of `insert_all`'s rate
-- end to end. A trigger's `WHEN` is evaluated before anything is queued, so only the rows
-- that name a gate or a limit (on insert, or when a transition changes it) are checked.
--
-- What the foreign keys did, the triggers do, under the same names, so every caller reads
-- the same errors (`insert::gate_error`: `Error::UnknownGate`, `Error::UnknownRateLimit`):
-- - A row naming a gate or a limit that is not declared fails with `foreign_key_violation`,
--   constraint `gd_instances_gate_fk` / `gd_instances_rate_limit_fk`, detail `Key (gate)=(x)
--   is not present in table "gd_gates".`; it locks the declared one `FOR KEY SHARE` until
--   its transaction ends, as a foreign key's check does, so it cannot be deleted meanwhile.
-- - A gate or a limit that rows name cannot be deleted, renamed or truncated away (the same
--   error, detail `Key (name)=(x) is still referenced from table "gd_instances".`). The
--   library never does either; an operator may.
-- - One difference: a foreign key's check on delete also sees rows inserted by
--   transactions that committed after the deleting one's snapshot was taken; a trigger
--   sees only its snapshot. Under READ COMMITTED each statement takes a new snapshot after
--   the row lock it waited for, and under SERIALIZABLE a conflict aborts one side; under
--   REPEATABLE READ a delete could miss a concurrent insert and leave a row naming nothing,
--   which would never run. So a delete, rename or truncate of a gate or a limit is refused
--   in a REPEATABLE READ transaction.

ALTER TABLE gd_instances DROP CONSTRAINT gd_instances_gate_fk,
                         DROP CONSTRAINT gd_instances_rate_limit_fk;

-- The referencing side: the row's gate and limit must be declared.
CREATE FUNCTION gd_instances_references() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.gate IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.gate IS DISTINCT FROM OLD.gate) THEN
        PERFORM FROM gd_gates g WHERE g.name = NEW.gate FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE foreign_key_violation USING
                MESSAGE = 'insert or update on table "gd_instances" violates foreign key '
                          'constraint "gd_instances_gate_fk"',
                DETAIL = format('Key (gate)=(%s) is not present in table "gd_gates".',
                                NEW.gate),
                CONSTRAINT = 'gd_instances_gate_fk', TABLE = 'gd_instances',
                COLUMN = 'gate', SCHEMA = TG_TABLE_SCHEMA;
        END IF;
    END IF;
    IF NEW.rate_limit IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.rate_limit IS DISTINCT FROM OLD.rate_limit) THEN
        PERFORM FROM gd_rate_limits r WHERE r.name = NEW.rate_limit FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE foreign_key_violation USING
                MESSAGE = 'insert or update on table "gd_instances" violates foreign key '
                          'constraint "gd_instances_rate_limit_fk"',
                DETAIL = format('Key (rate_limit)=(%s) is not present in table '
                                '"gd_rate_limits".', NEW.rate_limit),
                CONSTRAINT = 'gd_instances_rate_limit_fk', TABLE = 'gd_instances',
                COLUMN = 'rate_limit', SCHEMA = TG_TABLE_SCHEMA;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER gd_instances_references_on_insert
    AFTER INSERT ON gd_instances
    FOR EACH ROW
    WHEN (NEW.gate IS NOT NULL OR NEW.rate_limit IS NOT NULL)
    EXECUTE FUNCTION gd_instances_references();

CREATE TRIGGER gd_instances_references_on_update
    AFTER UPDATE OF gate, rate_limit ON gd_instances
    FOR EACH ROW
    WHEN ((NEW.gate IS NOT NULL AND NEW.gate IS DISTINCT FROM OLD.gate)
          OR (NEW.rate_limit IS NOT NULL AND NEW.rate_limit IS DISTINCT FROM OLD.rate_limit))
    EXECUTE FUNCTION gd_instances_references();

-- The referenced side: a declared gate or limit that rows name stays. Arguments: the
-- column of `gd_instances` that names it, and the constraint's name.
CREATE FUNCTION gd_still_referenced() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    named text;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.name = OLD.name THEN
        RETURN NEW;
    END IF;
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE object_not_in_prerequisite_state USING
            MESSAGE = format('cannot %s rows of "%s" in a REPEATABLE READ transaction',
                             lower(TG_OP), TG_TABLE_NAME),
            HINT = 'Rows of gd_instances name them; only READ COMMITTED or SERIALIZABLE '
                   'sees the rows that concurrent transactions insert. Run it in one of those.';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        EXECUTE format('SELECT min(%I) FROM gd_instances', TG_ARGV[0]) INTO named;
    ELSE
        EXECUTE format('SELECT min(%I) FROM gd_instances WHERE %I = $1',
                       TG_ARGV[0], TG_ARGV[0])
           INTO named USING OLD.name;
    END IF;
    IF named IS NOT NULL THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('update or delete on table "%s" violates foreign key constraint '
                             '"%s" on table "gd_instances"', TG_TABLE_NAME, TG_ARGV[1]),
            DETAIL = format('Key (name)=(%s) is still referenced from table "gd_instances".',
                            named),
            CONSTRAINT = TG_ARGV[1], TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD WHEN 'UPDATE' THEN NEW END;
END
$$;

CREATE TRIGGER gd_gates_referenced
    BEFORE DELETE OR UPDATE OF name ON gd_gates
    FOR EACH ROW
    EXECUTE FUNCTION gd_still_referenced('gate', 'gd_instances_gate_fk');

CREATE TRIGGER gd_gates_referenced_on_truncate
    BEFORE TRUNCATE ON gd_gates
    FOR EACH STATEMENT
    EXECUTE FUNCTION gd_still_referenced('gate', 'gd_instances_gate_fk');

CREATE TRIGGER gd_rate_limits_referenced
    BEFORE DELETE OR UPDATE OF name ON gd_rate_limits
    FOR EACH ROW
    EXECUTE FUNCTION gd_still_referenced('rate_limit', 'gd_instances_rate_limit_fk');

CREATE TRIGGER gd_rate_limits_referenced_on_truncate
    BEFORE TRUNCATE ON gd_rate_limits
    FOR EACH STATEMENT
    EXECUTE FUNCTION gd_still_referenced('rate_limit', 'gd_instances_rate_limit_fk');
