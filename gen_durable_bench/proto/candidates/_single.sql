-- The single wide row of the s-family designs (s, b, d, e): v1's columns, with the queue
-- entry and the lease in the row, but only the five indexes a queue of plain steps needs
-- (v1 has twelve: gates, rate limits, keys, awaits and children add the rest).
CREATE TABLE s_instances (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fsm              text        NOT NULL,
    fsm_version      integer     NOT NULL,
    step             text        NOT NULL,
    status           text        NOT NULL DEFAULT 'runnable',
    state            jsonb       NOT NULL,
    result           jsonb,
    awaits           text[]      NOT NULL DEFAULT '{}',
    await_deadline   timestamptz,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    partition_key    text,
    eligible_at      timestamptz NOT NULL DEFAULT now(),
    attempt          integer     NOT NULL DEFAULT 0,
    reaps            integer     NOT NULL DEFAULT 0,
    max_reaps        integer     NOT NULL DEFAULT 10,
    last_error       text,
    locked_by        text,
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    parent_id        bigint,
    children_pending integer     NOT NULL DEFAULT 0,
    unique_key       text,
    inserted_at      timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false,
    gate             text,
    rate_limit       text,
    rate_key         text,
    rate_weight      double precision,
    rate_step        text
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
CREATE INDEX s_instances_pick ON s_instances (queue, priority, eligible_at, id)
    WHERE status = 'runnable';
CREATE INDEX s_instances_lease ON s_instances (lease_expires_at) WHERE status = 'executing';
CREATE INDEX s_instances_finished ON s_instances (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX s_instances_parent ON s_instances (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX s_instances_key ON s_instances (unique_key, id) WHERE unique_key IS NOT NULL;
