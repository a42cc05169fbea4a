-- The durable row of the narrow designs (a*): what an instance is, without the queue
-- entry or the lease, which live in `p_ready` (and `p_leases`). Same columns as v1's row
-- otherwise. `fillfactor` leaves room on each page so an update can stay on its page (HOT).
CREATE TABLE p_instances (
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
    attempt          integer     NOT NULL DEFAULT 0,
    reaps            integer     NOT NULL DEFAULT 0,
    max_reaps        integer     NOT NULL DEFAULT 10,
    last_error       text,
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
CREATE INDEX p_instances_parent ON p_instances (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX p_instances_key ON p_instances (unique_key, id) WHERE unique_key IS NOT NULL;
