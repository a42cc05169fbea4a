#!/usr/bin/env bash
# off / steps / unnest, drain and five_step, N, R rounds interleaved.
set -euo pipefail
# From the repository's root, after CARGO_TARGET_DIR=target-bench cargo build --release -p gen_durable_bench.
H=gen_durable_bench/results/2026-12-07-history-cost; B=gen_durable_bench/results/2026-12-07-history-five-step-bound
D() { case $1 in off|steps) echo "$H/$1.sql" ;; *) echo "$B/$1.sql" ;; esac; }
N=${1:-10000}; R=${2:-20}; OUT=${3:-/tmp/ab.jsonl}
: > "$OUT"
per_s() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["per_s"])'; }
for r in $(seq 1 "$R"); do
  for s in five_step drain; do
    for v in off steps unnest; do
      l=$(GD_SCHEMA_EXPERIMENT=$(D $v) ./target-bench/release/gen_durable_bench --scenario "$s" \
            --no-ceiling --n "$N" 2>/dev/null | grep "\"scenario\":\"$s\"" | tail -1)
      echo "{\"round\":$r,\"s\":\"$s\",\"v\":\"$v\",\"per_s\":$(echo "$l" | per_s)}" >> "$OUT"
    done
  done
done
echo done >> "$OUT.done"
