-- gen_durable schema, part 3: the nodes that run the engine, as they announce themselves
-- (spec §7.1, §9). `gen_durable status` reads it to show the rows that no live node can
-- run: a node claims only rows of its queues whose (fsm, fsm_version) it has registered.
--
-- Each engine upserts its row on its heartbeat and deletes it on a graceful shutdown; a
-- crashed node's row simply stops being refreshed. A node is *live* while its
-- last_seen_at is within the last 60 seconds (three beats of a 20-second announce; see
-- `store/pg/admin.rs`), and a row unseen for a day is deleted by the next announce.

CREATE TABLE gd_nodes (
    node_id      text        PRIMARY KEY,
    -- The queues this node picks from.
    queues       text[]      NOT NULL DEFAULT '{}',
    -- The (fsm, fsm_version) pairs it can run, each as 'name@version': the version is
    -- the integer after the last '@', so a name containing '@' stays unambiguous.
    fsms         text[]      NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);
