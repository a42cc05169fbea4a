#!/usr/bin/env bash
# Starts a PgBouncer in transaction mode on 127.0.0.1:${PGBOUNCER_PORT:-6543} in front of
# the PostgreSQL at 127.0.0.1:5432 (trust auth), installing it if needed; prints nothing
# on success. Its log, including every statement it forwards when the server logs them,
# is the server's; PgBouncer's own log goes to $DIR/pgbouncer.log.
#
#   scripts/pgbouncer.sh            # start (idempotent)
#   scripts/pgbouncer.sh stop
#
# Then: DATABASE_URL=postgres://postgres@127.0.0.1:6543/postgres
#       DATABASE_DIRECT_URL=postgres://postgres@127.0.0.1:5432/postgres
#       GD_TEST_POOLER=transaction
set -euo pipefail

port=${PGBOUNCER_PORT:-6543}
dir=${PGBOUNCER_DIR:-/tmp/gd-pgbouncer}

if [ "${1:-}" = stop ]; then
  [ -f "$dir/pgbouncer.pid" ] && kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
  exit 0
fi

if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
  echo "pgbouncer.sh: installing pgbouncer" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
fi
bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)

if pg_isready -h 127.0.0.1 -p "$port" -q 2>/dev/null; then
  exit 0
fi

mkdir -p "$dir"
chown postgres "$dir" 2>/dev/null || true
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 40
max_db_connections = 60
; sqlx sends these at startup; PgBouncer 1.18 refuses unknown startup parameters.
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
printf '"postgres" ""\n"root" ""\n' >"$dir/users.txt"
chown postgres "$dir"/* 2>/dev/null || true

if [ "$(id -u)" = 0 ]; then
  su postgres -s /bin/sh -c "$bin -d $dir/pgbouncer.ini"
else
  "$bin" -d "$dir/pgbouncer.ini"
fi
for _ in $(seq 1 50); do
  pg_isready -h 127.0.0.1 -p "$port" -q 2>/dev/null && exit 0
  sleep 0.1
done
echo "pgbouncer.sh: PgBouncer did not come up on 127.0.0.1:$port; see $dir/pgbouncer.log" >&2
exit 1
