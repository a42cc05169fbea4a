#!/usr/bin/env bash
# compare.sh: gen_durable's drain against graphile-worker's, interleaved (see README.md).
#
#   bash gen_durable_bench/peers/compare.sh [--n 20000] [--runs 3] [--build] [--out FILE]
#
# For each of --runs rounds: gen_durable_bench --scenario drain --no-ceiling --n N, then
# graphile.sh --n N (tuned settings, its defaults). Then every run's figures, the medians
# and the ratio gen_durable / graphile of the medians. The binary is
# target/release/gen_durable_bench (or $GD_BENCH), built with
# `cargo build --release -p gen_durable_bench` when missing or with --build.
# Every JSON line is also kept in --out (default ${TMPDIR:-/tmp}/gd-peer-compare-N-<time>.jsonl).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
N=20000
RUNS=3
BUILD=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --n) N="$2"; shift 2 ;;
    --n=*) N="${1#*=}"; shift ;;
    --runs) RUNS="$2"; shift 2 ;;
    --runs=*) RUNS="${1#*=}"; shift ;;
    --build) BUILD=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$N" =~ ^[0-9]+$ && "$RUNS" =~ ^[0-9]+$ && "$RUNS" -ge 1 ]] || { echo "compare.sh: --n and --runs take positive integers" >&2; exit 2; }

cd "$ROOT"
BIN="${GD_BENCH:-$ROOT/target/release/gen_durable_bench}"
if [ "$BUILD" = 1 ] || [ ! -x "$BIN" ]; then
  [ -n "${GD_BENCH:-}" ] && { echo "compare.sh: GD_BENCH=$GD_BENCH is not executable" >&2; exit 2; }
  echo "compare.sh: cargo build --release -p gen_durable_bench" >&2
  cargo build --release -p gen_durable_bench >&2
fi
OUT="${OUT:-${TMPDIR:-/tmp}/gd-peer-compare-$N-$(date -u +%Y%m%dT%H%M%SZ).jsonl}"
: >"$OUT"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "+dirty" || true)"
echo "compare.sh: n=$N runs=$RUNS commit=$COMMIT$DIRTY bin=$BIN out=$OUT" >&2

# Installs graphile-worker (if needed) outside the rounds.
GD_PEER_DIR="${GD_PEER_DIR:-${TMPDIR:-/tmp}/gd-peer-graphile}"
export GD_PEER_DIR
bash "$HERE/graphile.sh" --install-only

line_of() { # $1 = scenario name; stdin = a run's stdout -> its one JSON line
  grep -F "\"scenario\":\"$1\"" | tail -n 1
}

for r in $(seq 1 "$RUNS"); do
  echo "compare.sh: round $r/$RUNS: gen_durable drain" >&2
  gd="$("$BIN" --scenario drain --no-ceiling --n "$N" | line_of drain)"
  [ -n "$gd" ] || { echo "compare.sh: no drain line from $BIN" >&2; exit 1; }
  echo "{\"round\":$r,\"peer\":\"gen_durable\",\"line\":$gd}" >>"$OUT"
  echo "compare.sh: round $r/$RUNS: graphile drain" >&2
  gw="$(bash "$HERE/graphile.sh" --n "$N" | line_of graphile_drain)"
  [ -n "$gw" ] || { echo "compare.sh: no graphile_drain line from graphile.sh" >&2; exit 1; }
  echo "{\"round\":$r,\"peer\":\"graphile\",\"line\":$gw}" >>"$OUT"
done

COMMIT="$COMMIT$DIRTY" node - "$OUT" <<'JS'
const fs = require("fs");
const rows = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map((l) => JSON.parse(l));
const of = (peer) => rows.filter((x) => x.peer === peer).map((x) => x.line);
const gd = of("gen_durable"), gw = of("graphile");
const median = (v) => {
  const s = [...v].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const f0 = (x) => Math.round(x).toLocaleString("en-US");
const n = gd[0].n;
console.log(`\nn = ${n}, ${gd.length} interleaved rounds, commit ${process.env.COMMIT}`);
console.log("round | gen_durable inst/s (secs) | graphile jobs/s (secs, run() -> empty) | graphile start-up ms | graphile jobs/s, first job -> empty");
gd.forEach((g, i) => {
  const w = gw[i];
  console.log(`${i + 1} | ${f0(g.per_s)} (${g.secs.toFixed(3)}) | ${f0(w.per_s)} (${w.secs.toFixed(3)}) | ${w.startup_ms.toFixed(1)} | ${f0(w.per_s_first_to_last)}`);
});
const mGd = median(gd.map((x) => x.per_s));
const mGw = median(gw.map((x) => x.per_s));
const mGwF = median(gw.map((x) => x.per_s_first_to_last));
const mSt = median(gw.map((x) => x.startup_ms));
const range = (v) => `${f0(Math.min(...v))}-${f0(Math.max(...v))}`;
console.log(`median | ${f0(mGd)} (spread ${range(gd.map((x) => x.per_s))}) | ${f0(mGw)} (spread ${range(gw.map((x) => x.per_s))}) | ${mSt.toFixed(1)} | ${f0(mGwF)}`);
console.log(`ratio gen_durable / graphile of the medians: ${(mGd / mGw).toFixed(2)} (graphile from run(), start-up included); ${(mGd / mGwF).toFixed(2)} (graphile from its first job, the window of gen_durable's drain)`);
console.log(JSON.stringify({
  scenario: "compare_drain", n, runs: gd.length, commit: process.env.COMMIT,
  gen_durable_per_s: gd.map((x) => x.per_s), graphile_per_s: gw.map((x) => x.per_s),
  graphile_startup_ms: gw.map((x) => x.startup_ms), graphile_per_s_first_to_last: gw.map((x) => x.per_s_first_to_last),
  median_gen_durable_per_s: mGd, median_graphile_per_s: mGw, median_graphile_per_s_first_to_last: mGwF,
  median_graphile_startup_ms: mSt,
  ratio: Math.round((mGd / mGw) * 1000) / 1000, ratio_first_to_last: Math.round((mGd / mGwF) * 1000) / 1000,
  graphile_settings: gw[0].settings, graphile_version: gw[0].version, gen_durable_config: gd[0].config,
}));
JS
echo "compare.sh: lines kept in $OUT" >&2
