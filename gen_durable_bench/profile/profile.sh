#!/usr/bin/env bash
# Where a drain's time goes: runs one `gen_durable_bench --scenario $SCENARIO --no-ceiling
# --n N` (SCENARIO: drain by default; drain_gated, drain_rate_limited, five_step) with hooks
# around its timed part (hook.sh) and prints the cost per step from the server's
# catalogs (pg_stat_statements, pg_stat_user_tables), its WAL (pg_waldump) and /proc.
#
#   bash gen_durable_bench/profile/profile.sh [N]        # N = 20000 by default
#   PERF=1 bash gen_durable_bench/profile/profile.sh N   # + perf's top functions, each side
#
# Needs a server with pg_stat_statements loaded, on this host (pg_waldump reads its pg_wal;
# run as root or the server's owner), e.g. a private cluster: see gen_durable_bench/results/PERFORMANCE-log.md, "Where
# the time goes". DATABASE_URL defaults to postgres://postgres@127.0.0.1:5433/postgres.
# BENCH is the bench binary (default: $CARGO_TARGET_DIR/release/gen_durable_bench, else
# target/release/…); OUT the folder kept for the run (default: a new /tmp/gd-profile.*).
set -euo pipefail
N=${1:-20000}
SCENARIO=${SCENARIO:-drain}
here=$(cd "$(dirname "$0")" && pwd)
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5433/postgres}
BENCH=${BENCH:-${CARGO_TARGET_DIR:-$here/../../target}/release/gen_durable_bench}
OUT=${OUT:-$(mktemp -d /tmp/gd-profile.XXXXXX)}
mkdir -p "$OUT"
# psql and the hook reach the same server as the bench.
hostport=${DATABASE_URL#*@}; hostport=${hostport%%/*}
export PGHOST=${hostport%%:*} PGPORT=${hostport##*:} PGUSER=postgres OUT PERF=${PERF:-0}
psql_db() { psql -X -q -At -v ON_ERROR_STOP=1 -d gen_durable_bench "$@"; }

psql -X -q -At -d postgres -c "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'" | grep -q 1 ||
  psql -X -q -d postgres -c "CREATE EXTENSION pg_stat_statements"

"$BENCH" --scenario "$SCENARIO" --no-ceiling --n "$N" \
  --before-drain "bash $here/hook.sh before" --after-drain "bash $here/hook.sh after" \
  > "$OUT/bench.json"
# The engine's backends have exited: their table counters are flushed.
sleep 1

read -r b0 p0 g0 < "$OUT/cpu_start"; read -r b1 p1 g1 < "$OUT/cpu_end"
tck=$(getconf CLK_TCK)
secs=$(python3 -c "import json;print(json.load(open('$OUT/bench.json'))['secs'])")
window=$(echo "$(cat "$OUT/t_end") - $(cat "$OUT/t_start")" | bc)
lsn0=$(cat "$OUT/lsn_start"); lsn1=$(cat "$OUT/lsn_end")
us() { echo "scale=1; ($1) * 1000000 / $tck / $N" | bc; }

echo "# $SCENARIO of $N at $(git -C "$here" rev-parse --short HEAD), $(date -u +%FT%TZ); files in $OUT"
cat "$OUT/bench.json"
echo
echo "## CPU per step (µs; /proc utime+stime over the hook window of ${window}s; the drain itself ${secs}s)"
echo "engine (bench process)      $(us "$b1 - $b0")"
echo "postgres backends           $(us "$p1 - $p0")"
echo "postgres other processes    $(us "$g1 - $g0")"
echo "wall per step               $(echo "scale=1; $secs * 1000000 / $N" | bc)"

echo
echo "## WAL and rows per step"
table() { psql -X -q -A -v ON_ERROR_STOP=1 "$@" | sed '/^([0-9]* rows\?)$/d'; }
table -d gen_durable_bench -v n="$N" -v l0="$lsn0" -v l1="$lsn1" <<'SQL'
SELECT round(pg_wal_lsn_diff(:'l1', :'l0') / :n, 1) AS wal_bytes_per_step,
       round(n_tup_upd::numeric / :n, 3) AS updates,
       round(n_tup_hot_upd::numeric / :n, 3) AS hot_updates,
       round(n_tup_hot_upd::numeric / nullif(n_tup_upd, 0), 3) AS hot_ratio,
       round(n_tup_del::numeric / :n, 3) AS deletes,
       round(pg_relation_size('gd_instances') / 8192.0 / :n, 4) AS heap_pages_now
FROM pg_stat_user_tables WHERE relname = 'gd_instances';
SQL

echo
echo "## Statements (pg_stat_statements, track = all: nested = inside gd_commit_outcomes)"
table -d postgres -v n="$N" <<'SQL'
SELECT CASE WHEN toplevel THEN '' ELSE 'nested ' END ||
         left(regexp_replace(query, '\s+', ' ', 'g'), 60) AS statement,
       calls,
       round((total_exec_time / calls)::numeric, 3) AS exec_ms,
       round((total_plan_time / calls)::numeric, 3) AS plan_ms,
       round(rows::numeric / calls, 1) AS rows_per_call,
       round((shared_blks_hit + shared_blks_read)::numeric / calls, 1) AS blks_per_call,
       round(shared_blks_dirtied::numeric / calls, 1) AS dirtied_per_call,
       round(wal_records::numeric / :n, 2) AS wal_recs_per_step,
       round(wal_fpi::numeric / :n, 3) AS fpi_per_step,
       round(wal_bytes / :n, 1) AS wal_bytes_per_step,
       round(((total_exec_time + total_plan_time) * 1000 / :n)::numeric, 2) AS us_per_step
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'gen_durable_bench')
  AND calls > 0 AND (query LIKE '/* gd:%' OR NOT toplevel)
ORDER BY total_exec_time + total_plan_time DESC
LIMIT 15;
SQL

echo
echo "## WAL records per step by kind (pg_waldump --stats=record)"
pgdata=$(psql -X -At -d postgres -c "SHOW data_directory")
waldump=$(dirname "$(readlink -f "$(command -v pg_config || echo /usr/lib/postgresql/15/bin/pg_config)")")/pg_waldump
[ -x "$waldump" ] || waldump=/usr/lib/postgresql/15/bin/pg_waldump
"$waldump" -p "$pgdata/pg_wal" -s "$lsn0" -e "$lsn1" --stats=record 2>/dev/null |
  awk -v n="$N" '{gsub(/\([ 0-9.]*\)/, "")} $1 ~ /\// && $2 > 0 {printf "%-22s %8.3f records/step %8.1f bytes/step (FPI %.1f)\n", $1, $2 / n, $5 / n, $4 / n}' |
  sort -k2 -nr | head -12

echo
echo "## Index entries written per step, by index (Btree records of the drain's WAL)"
"$waldump" -p "$pgdata/pg_wal" -s "$lsn0" -e "$lsn1" -r Btree 2>/dev/null |
  grep -o 'desc: [A-Z_]*.*blkref #0: rel [0-9/]*' | awk '{split($NF, r, "/"); print $2, r[3]}' |
  sort | uniq -c > "$OUT/btree_by_rel"
table -d gen_durable_bench -v n="$N" <<SQL
WITH w(records, kind, relfilenode) AS (VALUES $(awk '{printf "%s(%d,'"'"'%s'"'"',%d)", (NR > 1 ? "," : ""), $1, $2, $3}' "$OUT/btree_by_rel"))
SELECT coalesce(c.relname, w.relfilenode::text) AS index, w.kind, round(w.records::numeric / :n, 3) AS per_step
FROM w LEFT JOIN pg_class c ON c.relfilenode = w.relfilenode
ORDER BY w.records DESC;
SQL

if [ "$PERF" = 1 ] && [ -f "$OUT/perf.data" ]; then
  top() {
    perf report -i "$OUT/perf.data" --stdio --no-children --percentage relative --pid "$1" --sort dso,sym 2>/dev/null |
      grep -v '^#' | grep -v '^$' | head -"${PERF_TOP:-25}" || true
  }
  # Self time by part, from symbol names (normalised to 100: perf's relative percentages
  # under --pid need not add up to it). $2 names what matches nothing else.
  shares() {
    perf report -i "$OUT/perf.data" --stdio --no-children --percentage relative --pid "$1" --sort sym 2>/dev/null |
      awk -v rest="$2" '$1 ~ /%$/ { p = $1 + 0; $1 = ""; s = $0
             k = s ~ /\[k\]/ ? "kernel" : s ~ /malloc|free|_int_|unlink_chunk|realloc|memmove|memcpy|memset|calloc/ ? "malloc/free/memcpy" :
                 s ~ /gen_durable::|gen_durable_bench::/ ? "gen_durable" : s ~ /tokio|mio::|parking_lot/ ? "tokio" :
                 s ~ /sqlx/ ? "sqlx" : s ~ /serde|json/ ? "serde/json" : s ~ /hashbrown|btree|alloc::|core::/ ? "std collections/alloc" : rest
             t[k] += p; all += p } END { for (k in t) printf "%6.1f%%  %s\n", 100 * t[k] / all, k }' | sort -nr
  }
  echo
  echo "## perf: the bench process's CPU by part (self time, % of its samples)"
  shares "$(cat "$OUT/bench_pid")" other
  echo
  echo "## perf: the bench process's top functions (self time, % of its samples)"
  top "$(cat "$OUT/bench_pid")"
  echo
  echo "## perf: the server's processes' CPU by part (self time, % of their samples)"
  shares "$(cat "$OUT/pg_pids")" postgres
  echo
  echo "## perf: the server's processes' top functions (self time, % of their samples)"
  top "$(cat "$OUT/pg_pids")"
fi
