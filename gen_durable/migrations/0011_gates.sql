-- Concurrency gates (README, "Flow control"): at most K steps of one gate key at once,
-- across every node, enforced by a unique index over the executing rows themselves.
--
-- A gated row names its gate explicitly (`gate`) and keeps its key in `partition_key`;
-- `gate` NULL is the K = 1 partition exclusion as before. There is no prefix rule: a key
-- `stripe:acme` without a gate is a K = 1 key, whatever gates exist.
--
-- The claim gives each admitted row a slot in [0, K) of its key (`gate_slot`); a unique
-- index over (gate, key, slot) of the executing rows makes a second holder of a slot
-- impossible to commit, so over-admission cannot commit whatever a node believes. A slot
-- is returned by whatever takes the row out of `executing`: every committed outcome, a
-- release, the reaper. Nothing else holds it, so a dead worker leaks nothing.

-- K per gate name, written by the engines that declare the gate at start (the last
-- start wins) or by `Client::set_gate`; read by every claim, so a change takes effect at
-- the next pick. Inserts refuse a gate that has no row here.
CREATE TABLE gd_gates (
    name       text        PRIMARY KEY,
    size       integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT gd_gates_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT gd_gates_size CHECK (size BETWEEN 1 AND 32767)
);

ALTER TABLE gd_instances ADD COLUMN gate text, ADD COLUMN gate_slot smallint;

ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_gate_key CHECK (
    gate IS NULL OR (partition_key IS NOT NULL AND octet_length(gate) BETWEEN 1 AND 255)
) NOT VALID;

-- The K = 1 exclusion now covers ungated keys only: a gated key is bounded by its slots.
DROP INDEX gd_instances_partition_executing;
CREATE UNIQUE INDEX gd_instances_partition_executing ON gd_instances (partition_key)
    WHERE status = 'executing' AND partition_key IS NOT NULL AND gate IS NULL;

-- At most one executing row per (gate, key, slot); slots are < K when claimed.
CREATE UNIQUE INDEX gd_instances_gate_executing ON gd_instances (gate, partition_key, gate_slot)
    WHERE status = 'executing' AND gate IS NOT NULL;

-- A row can only name a declared gate: an insert (or a transition) naming another fails
-- with this constraint (`Error::UnknownGate`) and writes nothing, so no row can wait on a
-- gate nothing admits. A gate that rows name cannot be deleted.
ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_gate_fk
    FOREIGN KEY (gate) REFERENCES gd_gates (name) NOT VALID;
