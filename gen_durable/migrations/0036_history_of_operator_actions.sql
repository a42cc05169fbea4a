-- Operator actions in the history: a cancel, a retry, a restart and an instance migration
-- write an entry (kinds `cancelled`, `cancel_requested`, `retried`, `restarted`,
-- `migrated`) in the statement that does them, with who did it (`actor`). What an action
-- did that no other column holds (a migration's versions) goes in the new `detail`.
-- Adding a nullable column to the partitioned table writes no row.
ALTER TABLE gd_history ADD COLUMN detail text;
