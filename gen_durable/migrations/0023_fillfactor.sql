-- Half of each page of `gd_instances` left free for the new versions of its rows
-- (fillfactor 80 → 50; PERFORMANCE.md, "What to cut", item 2, and "A shorter apply").
--
-- Every step updates its row at least twice (the claim, the outcome), and a workflow's
-- steps that run ahead once per step more. At 80, a page had room for about one new
-- version per four rows, so most updates put the new version on another page: a lock
-- record on the old one first, and no HOT update possible for the run-ahead steps, whose
-- update changes no indexed column. At 50, more versions stay on their page. Measured:
-- WAL per step −10.6%, and five_step +3–8% beside the apply's short path (0024).
--
-- The price: a backlog at rest takes 80/50 = 1.6× the heap pages. The setting applies to
-- pages written from now on; rows already stored keep their layout until rewritten (a
-- `VACUUM FULL` or `pg_repack` of the table rewrites them all, at the cost of its lock).
-- Taking it back is `ALTER TABLE gd_instances SET (fillfactor = 80)`.

ALTER TABLE gd_instances SET (fillfactor = 50);
