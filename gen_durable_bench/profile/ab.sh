#!/usr/bin/env bash
# A and B of one SQL function in the same drain: each call goes at random to the function
# as the migrations define it (A) or to a variant of it (B), and pg_stat_statements times
# both. On a machine whose speed moves ±15% from one run to the next, two variants timed in
# one run see the same machine; two runs do not (gen_durable_bench/results/PERFORMANCE-log.md, "Measured trade-offs").
#
#   bash gen_durable_bench/profile/ab.sh FUNCTION VARIANT.sql [N] [RUNS]
#   SCENARIO=drain_gated bash gen_durable_bench/profile/ab.sh gd_handoff my_handoff.sql
#
# FUNCTION returns a set (RETURNS TABLE or SETOF: the claims, the hand-off, the commit) or
# OUT parameters (the apply, `gd_commit_outcomes`: then a "row" is a call); of its
# overloads, the one with the most arguments. VARIANT.sql holds one `CREATE OR REPLACE
# FUNCTION FUNCTION(…)` with the same arguments and result. Runs profile.sh (same server, same environment) RUNS times (1 by
# default) with N instances (20000) and prints, per run, A's and B's calls, time per call,
# rows per call and time per row; then the median of B's time per row over A's.
set -euo pipefail
fn=${1:?function name}
variant=${2:?variant file}
N=${3:-20000}
RUNS=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5433/postgres}
hostport=${DATABASE_URL#*@}; hostport=${hostport%%/*}
export PGHOST=${hostport%%:*} PGPORT=${hostport##*:} PGUSER=postgres

# Run inside the bench's database once its backlog is in place (profile.sh's PRE_SQL):
# the function as it is becomes FUNCTION_a, the variant FUNCTION_b, and FUNCTION a
# dispatcher with the same signature that calls either with the same arguments.
pre=$(cat <<SQL
DO \$ab\$
DECLARE
    f regprocedure := (SELECT p.oid::regprocedure FROM pg_proc p
                        WHERE p.proname = '$fn' AND pg_function_is_visible(p.oid)
                        ORDER BY p.pronargs DESC LIMIT 1);
    def text := pg_get_functiondef(f);
    n int := (SELECT pronargs FROM pg_proc WHERE oid = f);
    args text := (SELECT string_agg('\$' || i, ', ') FROM generate_series(1, n) i);
    -- A function of OUT parameters (the apply) returns one row: its dispatcher copies it.
    outs text := (SELECT string_agg(format('%I := r.%I;', a.name, a.name), ' ')
                    FROM pg_proc p, unnest(p.proargnames, p.proargmodes) a(name, mode)
                   WHERE p.oid = f AND NOT p.proretset AND a.mode IN ('o', 'b'));
BEGIN
    EXECUTE replace(def, 'FUNCTION public.$fn(', 'FUNCTION public.${fn}_a(');
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION public.$fn(%s) RETURNS %s LANGUAGE plpgsql AS %L',
        pg_get_function_arguments(f), pg_get_function_result(f),
        CASE WHEN outs IS NULL THEN
            format('BEGIN IF random() < 0.5 THEN RETURN QUERY SELECT * FROM ${fn}_a(%s); '
                   'ELSE RETURN QUERY SELECT * FROM ${fn}_b(%s); END IF; END', args, args)
        ELSE
            format('DECLARE r record; BEGIN IF random() < 0.5 THEN '
                   'SELECT * INTO r FROM ${fn}_a(%s); ELSE SELECT * INTO r FROM ${fn}_b(%s); '
                   'END IF; %s END', args, args, outs)
        END);
END
\$ab\$;
$(sed -E "s/FUNCTION (public\.)?$fn\(/FUNCTION public.${fn}_b(/" "$variant")
SQL
)

ratios=()
for run in $(seq 1 "$RUNS"); do
  out=$(mktemp -d /tmp/gd-ab.XXXXXX)
  PRE_SQL="$pre" OUT=$out bash "$here/profile.sh" "$N" > "$out/profile.txt"
  per_s=$(grep -o '"per_s":[0-9.]*' "$out/profile.txt" | head -1 | cut -d: -f2)
  line=$(psql -X -q -At -F ' ' -d postgres <<SQL
SELECT string_agg(format('%s: %s calls, %s ms per call, %s rows per call, %s us per row',
                         v, calls, round(ms::numeric, 3), round(rows::numeric, 1),
                         round((1000 * ms / nullif(rows, 0))::numeric, 2)), ' | ' ORDER BY v),
       round(((max(1000 * ms / nullif(rows, 0)) FILTER (WHERE v = 'B'))
              / (max(1000 * ms / nullif(rows, 0)) FILTER (WHERE v = 'A')))::numeric, 3)
FROM (SELECT CASE WHEN query LIKE '%${fn}_a(%' THEN 'A' ELSE 'B' END AS v,
             calls, total_exec_time / calls AS ms, rows::float8 / calls AS rows
        FROM pg_stat_statements
       WHERE NOT toplevel AND calls > 0
         AND (query LIKE '%FROM ${fn}_a(%' OR query LIKE '%FROM ${fn}_b(%')) s;
SQL
)
  echo "run $run ($per_s/s, files in $out): ${line% *}; B/A per row ${line##* }"
  ratios+=("${line##* }")
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {print "median B/A per row over " NR " runs: " a[int((NR + 1) / 2)]}'
