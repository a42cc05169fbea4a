-- The entry that scheduled the row's current step: the per-row fence. A commit writes only
-- if it is still the entry the worker claimed; a redelivery appends a new one.
ALTER TABLE p_instances ADD COLUMN log_seq bigint NOT NULL DEFAULT 0;
CREATE SEQUENCE p_log_seq;
