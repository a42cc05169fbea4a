-- The tables, their indexes and constraints, and the triggers that keep the references of
-- the flow-control columns: what `gen_durable::migrate` has built, as it is now.
-- The statements that read and write these tables are in `gen_durable/src/store/pg/`; the
-- functions are in the other files of this folder (README.md).

-- The lifecycle of an instance. `runnable` rows are picked by the claim; `executing` rows
-- hold a lease; `awaiting_signal` and `awaiting_children` are parked; `done` and `failed`
-- are terminal and left to the collector.
CREATE TYPE gd_status AS ENUM (
    'runnable', 'executing', 'awaiting_signal', 'awaiting_children', 'done', 'failed'
);

-- One row per instance of an FSM: where it is (`step`, `state`, `status`), what runs it
-- (the lease), and what it waits for. Column order is the order the migrations added them.
CREATE TABLE gd_instances (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fsm              text        NOT NULL,
    fsm_version      integer     NOT NULL,
    step             text        NOT NULL,
    status           gd_status   NOT NULL DEFAULT 'runnable',
    state            jsonb       NOT NULL,
    result           jsonb,
    -- The signal names a parked `await` waits for (kept by a failure, so a retry parks the
    -- row again where its step began), and when the await times out.
    awaits           text[]      NOT NULL DEFAULT '{}',
    await_deadline   timestamptz,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    -- A K = 1 key (at most one executing row per key), or the row's key within `gate`.
    partition_key    text,
    eligible_at      timestamptz NOT NULL DEFAULT now(),
    -- Re-executions of the current step: `replay` and reaps add one, progress resets it.
    attempt          integer     NOT NULL DEFAULT 0,
    -- Lease losses of the current step, and the bound after which the reaper fails the row.
    -- Stored per row so that any node's reaper can apply it without knowing the FSM type.
    -- A lease lost to a server restart is not counted (lease.sql, `gd_reap`).
    reaps            integer     NOT NULL DEFAULT 0,
    max_reaps        integer     NOT NULL DEFAULT 10,
    last_error       text,
    -- The lease: who runs the row, the fence every later write checks (a claim bumps the
    -- epoch; lease.sql, `gd_lease_epoch`), and when the reaper may take it back.
    locked_by        text,
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    -- The fan-in barrier: the number of this row's children that are not `done` or
    -- `failed`, always (also for a parent that failed, so a retry can re-arm it exactly).
    -- `gd_fan_in` is its one writer after the children are inserted.
    parent_id        bigint,
    children_pending integer     NOT NULL DEFAULT 0,
    unique_key       text,
    unique_scope     gd_status[],
    -- Equal to unique_key while the status is in the scope, NULL otherwise: one partial
    -- unique index on it enforces "occupied while in scope" under any concurrency.
    unique_guard     text GENERATED ALWAYS AS (
                         CASE WHEN status = ANY (unique_scope) THEN unique_key END
                     ) STORED,
    inserted_at      timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- `Client::cancel` of an executing row: the committing worker (and the reaper, and a
    -- drain) fails it with "cancelled" instead of applying its step's outcome.
    cancel_requested boolean     NOT NULL DEFAULT false,
    -- Concurrency gates: at most K executing rows per (gate, key), each in its own slot in
    -- [0, K) (`gd_instances_gate_executing`). A slot is returned by whatever takes the row
    -- out of `executing` (an outcome, a release, the reaper): a dead worker leaks nothing.
    -- `gate` NULL is the K = 1 partition exclusion; there is no prefix rule.
    gate             text,
    gate_slot        smallint,
    -- Rate limits: the row's limit and key, its weight, and the step that pays (every run
    -- of that step pays, no other does, so a transition leaves the limit behind without a
    -- write). A row whose tokens are not there yet reserves them and is deferred to the
    -- instant they are due: `rate_paid`, `eligible_at` (claim.sql).
    rate_limit       text,
    rate_key         text,
    rate_weight      double precision,
    rate_step        text,
    rate_paid        boolean     NOT NULL DEFAULT false,
    -- `updated_at` while the row is terminal, NULL otherwise, generated from the row itself
    -- so every writer that ends a row sets it. The collector's index reads this column and
    -- not `updated_at`, which every write changes: so a step's update can be HOT.
    finished_at      timestamptz GENERATED ALWAYS AS (
                         CASE WHEN status IN ('done', 'failed') THEN updated_at END
                     ) STORED,
    -- The seq of the row's entry in the ready log (log.sql) while it waits in the log or
    -- runs from it, NULL otherwise: the fence of its step's outcome. No index covers it, so
    -- the update of a step that moves it can be HOT.
    ready_seq        bigint,
    CONSTRAINT gd_instances_children_pending_nonneg CHECK (children_pending >= 0)
) WITH (
    -- A queue table churns: vacuum it early, and leave half of each page free for the new
    -- versions of its rows (every step updates its row at least twice: the claim, the
    -- outcome), so more updates stay on their page and can be HOT. 80 → 50 cut WAL per
    -- step by 10.6%; a backlog at rest takes 1.6× the heap pages.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    fillfactor = 50
);

-- The checks below were added to a live table, NOT VALID (rows written before were not
-- re-checked); they hold for every row written since, and are kept NOT VALID here so that
-- a database built from this folder has the catalog the migrations build.

-- Uniqueness scopes a row can never re-enter: every live status, plus any of the terminal
-- ones; or none. A scope that leaves a live status out lets a row leave it and come back
-- while another row holds the key, and whatever brings it back (a commit, a reap, a
-- delivery, a claim of many rows) would fail on the unique index (RELIABILITY.md, E2).
ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_unique_scope_live CHECK (
    unique_scope IS NULL OR cardinality(unique_scope) = 0
    OR unique_scope @> '{runnable,executing,awaiting_signal,awaiting_children}'::gd_status[]
) NOT VALID;

-- Keys are indexed by B-trees, whose entries are capped near 2.7 kB: a longer partition key
-- would be stored and then fail every claim of its queue (RELIABILITY.md, E8). The client
-- refuses keys over 1,024 bytes (`MAX_KEY_BYTES`) before it writes; these cover the others.
ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_key_length CHECK (
    octet_length(partition_key) <= 1024 AND octet_length(unique_key) <= 1024
    AND octet_length(queue) <= 1024
) NOT VALID;

ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_gate_key CHECK (
    gate IS NULL OR (partition_key IS NOT NULL AND octet_length(gate) BETWEEN 1 AND 255)
) NOT VALID;

-- A weight above its limit's burst is stored negated by `gd_rate_weight` (rate_limit.sql),
-- so this check refuses it: it could never be admitted.
ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_rate CHECK (
    rate_limit IS NULL
    OR (rate_key IS NOT NULL AND octet_length(rate_key) <= 1024 AND rate_step IS NOT NULL
        AND rate_weight > 0 AND rate_weight <= 1e9)
) NOT VALID;

-- The pick of the rows that stay off the log (a K = 1 key, a gate or a rate limit; the
-- others are claimed from the log, log.sql): `queue = $1 AND status = 'runnable' AND (...)
-- ORDER BY priority, eligible_at, id LIMIT n` reads this index in order and stops after n
-- entries, whatever the backlog.
CREATE INDEX gd_instances_pick ON gd_instances (queue, priority, eligible_at, id)
    WHERE status = 'runnable'
      AND (partition_key IS NOT NULL OR gate IS NOT NULL OR rate_limit IS NOT NULL);

-- The reaper scans executing rows by lease expiry.
CREATE INDEX gd_instances_lease ON gd_instances (lease_expires_at)
    WHERE status = 'executing';

-- Await timeouts fire from this index.
CREATE INDEX gd_instances_await_deadline ON gd_instances (await_deadline)
    WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL;

-- Children of a parent (fan-in, ctx.children(), cancel cascade).
CREATE INDEX gd_instances_parent ON gd_instances (parent_id) WHERE parent_id IS NOT NULL;

-- Uniqueness: see `unique_guard`.
CREATE UNIQUE INDEX gd_instances_unique_guard ON gd_instances (unique_guard)
    WHERE unique_guard IS NOT NULL;

-- Partition exclusion: at most one executing row per ungated key (a gated key is bounded
-- by its slots). It rests on the rows themselves, so a dead worker holds nothing once the
-- reaper returns its row.
CREATE UNIQUE INDEX gd_instances_partition_executing ON gd_instances (partition_key)
    WHERE status = 'executing' AND partition_key IS NOT NULL AND gate IS NULL;

-- A key's newest instance, for a wait by key once no instance holds the key (without it
-- that lookup read the whole table). Partial: rows inserted without a key pay nothing.
CREATE INDEX gd_instances_key ON gd_instances (unique_key, id) WHERE unique_key IS NOT NULL;

-- At most one executing row per (gate, key, slot); slots are < K when claimed. This index
-- is the gates' guarantee: over-admission cannot commit, whatever a node believes.
CREATE UNIQUE INDEX gd_instances_gate_executing ON gd_instances (gate, partition_key, gate_slot)
    WHERE status = 'executing' AND gate IS NOT NULL;

-- Rows waiting for reserved tokens, by when they are due: a picker that found nothing to
-- run sleeps until the first of them instead of a whole poll interval (one probe).
CREATE INDEX gd_instances_rate_due ON gd_instances (queue, eligible_at)
    WHERE status = 'runnable' AND rate_paid;

-- Terminal rows by age, for the collector and the dashboard's chart (see `finished_at`).
CREATE INDEX gd_instances_finished ON gd_instances (finished_at)
    WHERE status IN ('done', 'failed');

-- The runnable rows of each gate key, in pick order: the hand-off (handoff.sql) reads the
-- next rows of one key without reading past the rest of its queue. Gated rows only.
CREATE INDEX gd_instances_gate_next ON gd_instances (queue, gate, partition_key, priority, eligible_at, id)
    WHERE status = 'runnable' AND gate IS NOT NULL;

-- The reserved rows of a bucket, for the collector's recount of `held` (`gd_recount_held`).
CREATE INDEX gd_instances_rate_held ON gd_instances (rate_limit, rate_key)
    WHERE status = 'runnable' AND rate_paid;

-- A row's inbox: signals delivered and not yet consumed. Deleted whole when the row ends.
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

-- As `gd_instances_key_length` (added NOT VALID likewise).
ALTER TABLE gd_signals ADD CONSTRAINT gd_signals_dedup_key_length CHECK (
    octet_length(dedup_key) <= 1024
) NOT VALID;

-- The nodes that run the engine, as they announce themselves: `gen_durable status` shows
-- the rows no live node can run. Each engine upserts its row on its heartbeat and deletes
-- it on a graceful shutdown; a node is live while `last_seen_at` is within the last 60
-- seconds (three beats of a 20-second announce), and a row unseen for a day is deleted.
CREATE TABLE gd_nodes (
    node_id      text        PRIMARY KEY,
    -- The queues this node picks from.
    queues       text[]      NOT NULL DEFAULT '{}',
    -- The (fsm, fsm_version) pairs it can run, each as 'name@version': the version is
    -- the integer after the last '@', so a name containing '@' stays unambiguous.
    fsms         text[]      NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    -- The step names of each FSM version it runs, `{"Checkout@2": ["reserve", "ship"]}`:
    -- `Client::restart --step` checks a step against them when the caller's registry does
    -- not have the instance's version (the stock CLI links no FSM).
    steps        jsonb       NOT NULL DEFAULT '{}'
);

-- Periodic schedules, one row per name. A fire locks its row (SKIP LOCKED: one node at a
-- time), inserts the instances of its due fire times and moves `next_fire` past them, in
-- one transaction: a fire time is inserted once or not at all, whichever node takes it.
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

-- Queues an operator paused cluster-wide (`Client::pause_queue`): every claim and hand-off
-- skips a queue that has a row here (one primary-key probe per statement), so a pause is
-- durable and honored within one poll interval; deleting the row resumes it. Rows already
-- claimed finish their step.
CREATE TABLE gd_queue_pauses (
    queue      text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    -- Who paused it and why, as the operator said (shown by `status` and `explain`).
    reason     text
);

-- K per gate name, written by the engines that declare the gate at start (the last start
-- wins) or by `Client::set_gate`; read by every claim, so a change takes effect at the next
-- pick. A row may name only a declared gate (the triggers below).
CREATE TABLE gd_gates (
    name       text        PRIMARY KEY,
    size       integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gd_gates_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT gd_gates_size CHECK (size BETWEEN 1 AND 32767)
);

-- The rate limits, written like the gates; read by every admission.
CREATE TABLE gd_rate_limits (
    name       text             PRIMARY KEY,
    per_second double precision NOT NULL,
    burst      double precision NOT NULL,
    updated_at timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT gd_rate_limits_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT gd_rate_limits_rate CHECK (per_second > 0 AND per_second <= 1e9),
    CONSTRAINT gd_rate_limits_burst CHECK (burst >= 1 AND burst <= 1e9)
);

-- One token bucket per (limit, key), refilled lazily from the database clock and minted by
-- the first admission of the key (full, minus what it took). `tokens` at `at`, debts
-- included (negative: tokens reserved by rows waiting for them); the refill stops at
-- `burst - held`, so tokens reserved and not used in their time are not handed out again
-- on top of a full bucket (RELIABILITY.md, R4-2). `held`: the weights of the bucket's
-- runnable rows with `rate_paid`, recounted by the collector (`gd_recount_held`). The
-- collector deletes a bucket once it is full again.
CREATE TABLE gd_buckets (
    name   text             NOT NULL REFERENCES gd_rate_limits (name) ON DELETE CASCADE,
    key    text             NOT NULL,
    tokens double precision NOT NULL,
    at     timestamptz      NOT NULL,
    held   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, key)
);

-- The collector's per-minute rollup of finished instances (minutes.rs), what the
-- dashboard's charts over hours and days read: the finished rows of a week are too many
-- for a page to read. Per minute and queue, and per minute for all queues under queue
-- '*' (written for every minute rolled, even an empty one: the rollup's watermark):
-- instances done and failed in that minute (by `finished_at`), and a histogram of how long
-- they took from insert to finish, `took_ms[i]` counting those in [2^(i-2), 2^(i-1)) ms
-- (`took_ms[1]`: under 1 ms; `took_ms[32]`: 2^30 ms, 12 days, or more). Keyed by queue
-- first: a chart reads one queue's (or '*''s) minutes as one range. A queue named '*' is
-- counted with the totals. Rows the collector deletes less than two minutes after they
-- finish (a retention that short) may be deleted before their minute is rolled.
CREATE TABLE gd_minutes (
    minute  timestamptz NOT NULL,
    queue   text        NOT NULL,
    done    bigint      NOT NULL,
    failed  bigint      NOT NULL,
    took_ms bigint[]    NOT NULL,
    PRIMARY KEY (queue, minute)
);

-- The collector forgets minutes by age, across queues.
CREATE INDEX gd_minutes_minute ON gd_minutes (minute);

-- The references of `gd_instances.gate` to `gd_gates` and of `gd_instances.rate_limit` to
-- `gd_rate_limits`, kept by triggers and not by foreign keys, so that a row naming neither
-- costs nothing: a foreign key queues its check for every row inserted, whatever its value
-- (10–14% of a batch insert of rows without a gate or a limit); a trigger's `WHEN` is
-- evaluated before anything is queued. They raise what the foreign keys raised, under the
-- same constraint names (`gd_instances_gate_fk`, `gd_instances_rate_limit_fk`), so callers
-- map the same errors (`Error::UnknownGate`, `Error::UnknownRateLimit`):
-- - a row naming an undeclared gate or limit fails with `foreign_key_violation`; the
--   declared one is locked `FOR KEY SHARE` until the transaction ends, so it cannot be
--   deleted meanwhile;
-- - a gate or limit that rows name cannot be deleted, renamed or truncated away. A trigger
--   sees only its snapshot (a foreign key's check also sees later commits), so that is
--   refused in a REPEATABLE READ transaction, where it could miss a concurrent insert.

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
