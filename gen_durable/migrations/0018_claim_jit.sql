-- No JIT compilation of the claim's statements (PERFORMANCE.md, "Claim with gated rows").
--
-- PostgreSQL compiles a statement's expressions with LLVM when its estimated cost is above
-- `jit_above_cost` (100,000 by default), and it does so on every execution: the code is not
-- kept with the plan. `gd_claim`'s generic plan is estimated from the whole backlog (its
-- pick's LIMIT is computed, not a constant), so on a backlog of 1,000,000 rows with gated
-- rows its estimate was 88 million and each claim spent 1.8 s compiling 345 functions to
-- run a statement that takes 6 ms (`bash gen_durable_bench/profile/explain_gated.sh`).
-- The claim reads a batch through indexes: JIT can only cost it time. `gd_claim_plain` is
-- estimated from the batch and stayed below the threshold, but gets the same setting, so no
-- backlog size can change that.

ALTER FUNCTION gd_claim(text, text[], int4[], int8, text, int8, timestamptz) SET jit = off;
ALTER FUNCTION gd_claim_plain(text, text[], int4[], int8, text, int8, timestamptz) SET jit = off;
