#!/usr/bin/env bash
# graphile.sh: the drain of gen_durable_bench run by graphile-worker 0.17.3 (see README.md).
#
#   bash gen_durable_bench/peers/graphile.sh [--n 20000] [--concurrency 24] [--local-queue 500]
#        [--complete-batch-delay 0] [--fail-batch-delay 0] [--pool 25] [--add-batch 5000]
#   bash gen_durable_bench/peers/graphile.sh --install-only
#
# Installs graphile-worker 0.17.3 from npm into $GD_PEER_DIR (default
# ${TMPDIR:-/tmp}/gd-peer-graphile; reused when that version is already there), then runs
# graphile_drain.mjs: a fresh database gd_peer_graphile on DATABASE_URL's server
# (default postgres://postgres@127.0.0.1:5432/postgres), graphile's migrations, N no-op
# jobs enqueued, one worker timed draining them. One JSON line on stdout; exits non-zero
# unless every job ran exactly once and the jobs table ends empty.
set -euo pipefail

VERSION=0.17.3
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GD_PEER_DIR="${GD_PEER_DIR:-${TMPDIR:-/tmp}/gd-peer-graphile}"

command -v node >/dev/null || { echo "graphile.sh: node is not installed (node >= 18)" >&2; exit 2; }
command -v npm >/dev/null || { echo "graphile.sh: npm is not installed" >&2; exit 2; }

installed() {
  node -e 'process.stdout.write(require(process.argv[1]).version)' \
    "$GD_PEER_DIR/node_modules/graphile-worker/package.json" 2>/dev/null || true
}

if [ "$(installed)" != "$VERSION" ]; then
  echo "graphile.sh: installing graphile-worker@$VERSION into $GD_PEER_DIR" >&2
  mkdir -p "$GD_PEER_DIR"
  [ -f "$GD_PEER_DIR/package.json" ] || echo '{"name":"gd-peer-graphile","private":true}' >"$GD_PEER_DIR/package.json"
  npm install --prefix "$GD_PEER_DIR" --no-audit --no-fund --save-exact "graphile-worker@$VERSION" >&2
  [ "$(installed)" = "$VERSION" ] || { echo "graphile.sh: graphile-worker@$VERSION did not install" >&2; exit 2; }
fi

[ "${1:-}" = "--install-only" ] && exit 0

# NO_LOG_SUCCESS: graphile-worker's own switch to skip its "Completed task" line per job.
NO_LOG_SUCCESS=1 exec node "$HERE/graphile_drain.mjs" "$@"
