#!/usr/bin/env bash
# The plan of a claim on a big backlog with gated rows (gen_durable_bench/results/PERFORMANCE-log.md, "Claim with gated
# rows"): 1,000,000 runnable rows on queue `q`, every hundredth gated (10,000 rows over 5
# keys of gate `g`, K = 2), each key already holding its 2 slots, so every gated row must be
# skipped. Prints EXPLAIN (ANALYZE, BUFFERS) of one claim of 256 through `gd_claim`'s
# statement as the engine prepares it (`gd_audit_prep`), under the function's settings, in a
# transaction rolled back after. Run from the repository's root:
#
#   bash gen_durable_bench/profile/explain_gated.sh      # DATABASE_URL's server; db gd_explain_gated
set -euo pipefail
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=gd_explain_gated
base=${DATABASE_URL%/*}
psql -X -q -d "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
url="$base/$db"
for m in gen_durable/migrations/*.sql; do
  psql -X -q -v ON_ERROR_STOP=1 -d "$url" -f "$m" > /dev/null
done
prep=$(mktemp)
trap 'rm -f "$prep"' EXIT
cargo run --quiet -p gen_durable_suite --bin gd_audit_prep > "$prep"
psql -X -q -v ON_ERROR_STOP=1 -d "$url" <<'SQL'
INSERT INTO gd_gates (name, size) VALUES ('g', 2);
INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
SELECT 'F', 1, 's', '{}', 'q',
       CASE WHEN g % 100 = 0 THEN 'g' END,
       CASE WHEN g % 100 = 0 THEN 'k' || (g / 100) % 5 END
  FROM generate_series(1, 1000000) g;
INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                          status, gate_slot, locked_by)
SELECT 'F', 1, 's', '{}', 'q', 'g', 'k' || k, 'executing', s, 'n0'
  FROM generate_series(0, 4) k, generate_series(0, 1) s;
VACUUM ANALYZE gd_instances;
SQL
{
  echo "BEGIN;"
  # The function's own settings (plan_cache_mode, enable_seqscan, jit), from the catalog.
  echo "SELECT count(set_config(split_part(c, '=', 1), substr(c, strpos(c, '=') + 1), true))"
  echo "  FROM pg_proc, unnest(proconfig) c WHERE proname = 'gd_claim' \\g /dev/null"
  # Only the claim's statement: the rest of prep.sql prepares other statements.
  sed -n '/^PREPARE claim(/,/^PREPARE claim_plain(/p' "$prep" | sed '$d'
  for run in 1 2 3; do
    echo "SAVEPOINT s;"
    echo "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE claim('q', '{F}', '{1}', 256, 'n1', 30000, NULL);"
    echo "ROLLBACK TO SAVEPOINT s;"
  done
  echo "ROLLBACK;"
} | psql -X -q -v ON_ERROR_STOP=1 -d "$url"
[ -n "${KEEP:-}" ] || psql -X -q -d "$DATABASE_URL" -c "DROP DATABASE $db WITH (FORCE)"
