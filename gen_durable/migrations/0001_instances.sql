-- gen_durable schema, part 1: instances and their inboxes (spec §3, §4.1, §5).

CREATE TYPE gd_status AS ENUM (
    'runnable', 'executing', 'awaiting_signal', 'awaiting_children', 'done', 'failed'
);

CREATE TABLE gd_instances (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fsm              text        NOT NULL,
    fsm_version      integer     NOT NULL,
    step             text        NOT NULL,
    status           gd_status   NOT NULL DEFAULT 'runnable',
    state            jsonb       NOT NULL,
    result           jsonb,
    awaits           text[]      NOT NULL DEFAULT '{}',
    await_deadline   timestamptz,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    partition_key    text,
    eligible_at      timestamptz NOT NULL DEFAULT now(),
    -- Re-executions of the current step: `replay` and reaps add one, progress resets it.
    attempt          integer     NOT NULL DEFAULT 0,
    -- Lease losses of the current step, and the bound after which the reaper fails the row.
    -- Stored per row so that any node's reaper can apply it without knowing the FSM type.
    reaps            integer     NOT NULL DEFAULT 0,
    max_reaps        integer     NOT NULL DEFAULT 10,
    last_error       text,
    locked_by        text,
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    parent_id        bigint,
    children_pending integer     NOT NULL DEFAULT 0,
    unique_key       text,
    unique_scope     gd_status[],
    -- Equal to unique_key while the status is in the scope, NULL otherwise: one partial
    -- unique index on it enforces "occupied while in scope" under any concurrency (§4.1).
    unique_guard     text GENERATED ALWAYS AS (
                         CASE WHEN status = ANY (unique_scope) THEN unique_key END
                     ) STORED,
    inserted_at      timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gd_instances_children_pending_nonneg CHECK (children_pending >= 0)
) WITH (
    -- A queue table churns: leave room for HOT updates and vacuum it early.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

-- The pick: `queue = $1 AND status = 'runnable' ORDER BY priority, eligible_at, id LIMIT n`
-- reads this index in order and stops after n entries, whatever the backlog.
CREATE INDEX gd_instances_pick ON gd_instances (queue, priority, eligible_at, id)
    WHERE status = 'runnable';

-- The reaper scans executing rows by lease expiry.
CREATE INDEX gd_instances_lease ON gd_instances (lease_expires_at)
    WHERE status = 'executing';

-- Await timeouts fire from this index.
CREATE INDEX gd_instances_await_deadline ON gd_instances (await_deadline)
    WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL;

-- Children of a parent (fan-in, ctx.childs(), cancel cascade).
CREATE INDEX gd_instances_parent ON gd_instances (parent_id) WHERE parent_id IS NOT NULL;

-- Terminal rows by age, for the collector.
CREATE INDEX gd_instances_terminal ON gd_instances (updated_at)
    WHERE status IN ('done', 'failed');

-- Uniqueness (§4.1).
CREATE UNIQUE INDEX gd_instances_unique_guard ON gd_instances (unique_guard)
    WHERE unique_guard IS NOT NULL;

-- Partition exclusion (§7.4): at most one executing row per partition key. It rests on the
-- rows themselves, so a dead worker holds nothing once the reaper returns its row.
CREATE UNIQUE INDEX gd_instances_partition_executing ON gd_instances (partition_key)
    WHERE status = 'executing' AND partition_key IS NOT NULL;

CREATE TABLE gd_signals (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_id   bigint      NOT NULL REFERENCES gd_instances (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     jsonb       NOT NULL,
    dedup_key   text,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gd_signals_dedup UNIQUE (target_id, dedup_key),
    CONSTRAINT gd_signals_name_length CHECK (octet_length(name) BETWEEN 1 AND 255)
);

CREATE INDEX gd_signals_target_name ON gd_signals (target_id, name);
