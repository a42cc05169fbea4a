-- The collector's index on `finished_at` instead of `updated_at`, so that a step's update
-- can be HOT (PERFORMANCE.md, "Where the time goes").
--
-- PostgreSQL updates a row in place on its page (HOT: no new entry in any index) only
-- when no column an index reads changes. `updated_at` changes on every write, and the
-- collector's index `gd_instances_terminal (updated_at)` read it, so no update of
-- `gd_instances` was ever HOT, even a run-ahead `next` that changes nothing indexed.
--
-- `finished_at` is `updated_at` while the row is terminal and NULL otherwise, generated
-- by PostgreSQL from the row itself, so every writer that ends a row sets it exactly as it
-- sets `updated_at` (nothing writes a terminal row but to take it out of terminal). A
-- step that leaves its row executing (run-ahead) leaves it NULL: unchanged.
--
-- Adding a stored generated column rewrites the table once, under an exclusive lock: 3.6 s
-- for 1,000,000 rows (half of them finished) on the 2-core development machine, under
-- load, and 0.16 s for the new index. On a big table, delete finished rows first
-- (`gen_durable gc`) and migrate in a quiet moment.

ALTER TABLE gd_instances ADD COLUMN finished_at timestamptz GENERATED ALWAYS AS (
    CASE WHEN status IN ('done', 'failed') THEN updated_at END
) STORED;

-- Terminal rows by age, for the collector and the dashboard's chart.
CREATE INDEX gd_instances_finished ON gd_instances (finished_at)
    WHERE status IN ('done', 'failed');

DROP INDEX gd_instances_terminal;
