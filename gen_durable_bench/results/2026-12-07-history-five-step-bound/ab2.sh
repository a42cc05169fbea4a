#!/usr/bin/env bash
set -euo pipefail
# From the repository's root, after CARGO_TARGET_DIR=target-bench cargo build --release -p gen_durable_bench.
H=gen_durable_bench/results/2026-12-07-history-cost; B=gen_durable_bench/results/2026-12-07-history-five-step-bound
D() { case $1 in off|steps) echo "$H/$1.sql" ;; *) echo "$B/$1.sql" ;; esac; }
N=10000; R=${1:-12}; OUT=gen_durable_bench/results/2026-12-07-history-five-step-bound/ab2.jsonl; : > "$OUT"
per_s() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["per_s"])'; }
for r in $(seq 1 "$R"); do
  for s in five_step; do
    for v in off steps noindex unlogged; do
      l=$(GD_SCHEMA_EXPERIMENT=$(D $v) ./target-bench/release/gen_durable_bench --scenario "$s" \
            --no-ceiling --n "$N" 2>/dev/null | grep "\"scenario\":\"$s\"" | tail -1)
      echo "{\"round\":$r,\"s\":\"$s\",\"v\":\"$v\",\"per_s\":$(echo "$l" | per_s)}" >> "$OUT"
    done
  done
done
touch "$OUT.done"
