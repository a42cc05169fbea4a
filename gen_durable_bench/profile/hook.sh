#!/usr/bin/env bash
# The bench's --before-drain / --after-drain hook for profile.sh: `hook.sh before|after`.
# Environment: OUT (the run's folder), PGPORT/PGHOST/PGUSER of the profiled server, PERF
# (1: perf record), and from the bench GD_BENCH_PID. Everything it learns goes to $OUT.
set -euo pipefail
stage=$1
psql_db() { psql -X -q -At -v ON_ERROR_STOP=1 -d gen_durable_bench "$@"; }

# The server's processes: the postmaster and its children (backends, walwriter, …).
postmaster=$(psql_db -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'" | xargs ps -o ppid= -p | tr -d ' ')
server_pids() { echo "$postmaster"; ps --ppid "$postmaster" -o pid= | tr -d ' '; }

# CPU ticks (utime + stime; for the postmaster also its reaped children's) by role.
cpu() {
  local bench pg_back=0 pg_bg=0
  bench=$(awk '{print $14 + $15}' "/proc/$GD_BENCH_PID/stat")
  for pid in $(server_pids); do
    [ -r "/proc/$pid/stat" ] || continue
    local t cmd
    t=$(sed 's/^.*) //' "/proc/$pid/stat" | awk -v pm=$(( pid == postmaster )) '{print $12 + $13 + pm * ($14 + $15)}')
    cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline")
    case "$cmd" in
      *gen_durable_bench*|*postgres\ postgres*) pg_back=$(( pg_back + t )) ;;
      *) pg_bg=$(( pg_bg + t )) ;;
    esac
  done
  echo "$bench $pg_back $pg_bg"
}

case "$stage" in
before)
  # Let the insert's backends flush their counters before they are reset, so they count
  # nothing of the insert: an idle backend may hold them for up to 10 s (PG 15).
  # PRE_SQL: an experiment on the backlog in place (e.g. a fillfactor and VACUUM FULL).
  if [ -n "${PRE_SQL:-}" ]; then printf "%s\n" "$PRE_SQL" | psql_db >/dev/null; fi
  sleep 11
  psql -X -q -At -v ON_ERROR_STOP=1 -d postgres -c "SELECT pg_stat_statements_reset()" >/dev/null
  psql_db -c "SELECT pg_stat_reset()" \
    -c "SELECT pg_stat_reset_shared('wal')" -c "SELECT pg_stat_reset_shared('bgwriter')" >/dev/null
  psql_db -c "SELECT pg_current_wal_lsn()" > "$OUT/lsn_start"
  cpu > "$OUT/cpu_start"
  echo "$GD_BENCH_PID" > "$OUT/bench_pid"
  if [ "${PERF:-0}" = 1 ]; then
    # System-wide: the engine's backends do not exist yet. profile.sh keeps the samples of
    # this server's processes and of the bench by pid.
    perf record -a -F 999 ${PERF_CALLGRAPH:+-g} -o "$OUT/perf.data" >"$OUT/perf.log" 2>&1 &
    echo $! > "$OUT/perf.pid"
    sleep 1
  fi
  date +%s.%N > "$OUT/t_start"
  ;;
after)
  date +%s.%N > "$OUT/t_end"
  cpu > "$OUT/cpu_end"
  psql_db -c "SELECT pg_current_wal_lsn()" > "$OUT/lsn_end"
  server_pids | paste -sd, > "$OUT/pg_pids"
  if [ -f "$OUT/perf.pid" ]; then
    pid=$(cat "$OUT/perf.pid")
    kill -INT "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  ;;
*) echo "hook.sh before|after" >&2; exit 2 ;;
esac
