-- Periodic schedules (gen_durable::Schedule): one row per schedule name. A fire locks its
-- row (SKIP LOCKED: one node at a time), inserts the instances of its due fire times and
-- moves `next_fire` past them, in one transaction — so a fire time is inserted once or not
-- at all, whichever node takes it.
CREATE TABLE gd_schedules (
    name        text        PRIMARY KEY,
    -- As the node that last handled it declares them (shown by `gen_durable status`).
    pattern     text        NOT NULL,
    timezone    text        NOT NULL,
    catch_up    text        NOT NULL,
    -- The earliest fire time not handled yet; NULL once the pattern never fires again.
    next_fire   timestamptz,
    -- The newest fire time an instance was inserted for, and that instance.
    last_fire   timestamptz,
    last_id     bigint,
    -- Fire times handled without an instance: left out by the catch-up policy, or whose
    -- entry could not be built (`last_error` says why).
    skipped     bigint      NOT NULL DEFAULT 0,
    last_error  text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
