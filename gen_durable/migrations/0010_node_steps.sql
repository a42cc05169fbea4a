-- The step names of each FSM version a node runs, announced with it (`gd_nodes.fsms`):
-- `{"Checkout@2": ["reserve", "ship"], …}`. `Client::restart` / `gen_durable restart ID
-- --step S` checks the step against them when the caller's own registry does not have the
-- instance's FSM version (the stock CLI links no FSM). A node announces only the versions
-- it has registered, not the older ones it migrates on claim (it does not run their steps).
ALTER TABLE gd_nodes ADD COLUMN steps jsonb NOT NULL DEFAULT '{}';
