#!/usr/bin/env bash
# The history's cost: drain and five_step with the history off, at level steps (no state),
# and at level full (every entry with its step's state, the states padded to 1 KB, against
# off with the same states), interleaved:
#   bash gen_durable_bench/results/2026-12-07-history-cost/run.sh [N] [ROUNDS]
# from the repository's root, after `cargo build --release -p gen_durable_bench`. The runs
# are kept in `$RESULTS/runs-N.jsonl` (default: this directory).
set -euo pipefail
N=${1:-20000}; R=${2:-20}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=$(mktemp -d)/runs.jsonl
per_s() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["per_s"])'; }
for r in $(seq 1 "$R"); do
  for s in drain five_step; do
    for v in off:0 steps:0 off:1024 full:1024; do
      level=${v%%:*}; bytes=${v##*:}
      l=$(GD_SCHEMA_EXPERIMENT=$HERE/$level.sql ./target/release/gen_durable_bench --scenario "$s" \
            --no-ceiling --n "$N" --state-bytes "$bytes" 2>/dev/null | grep "\"scenario\":\"$s\"" | tail -1)
      echo "{\"round\":$r,\"s\":\"$s\",\"v\":\"$level@$bytes\",\"per_s\":$(echo "$l" | per_s)}" >> "$OUT"
    done
  done
done
cp "$OUT" "${RESULTS:-$HERE}/runs-$N.jsonl"
python3 - "$OUT" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
cell = {}
for x in rows:
    cell.setdefault((x["s"], x["round"]), {})[x["v"]] = x["per_s"]
for s in ("drain", "five_step"):
    for a, b in (("steps@0", "off@0"), ("full@1024", "off@1024")):
        xs = [d[a] / d[b] for (sc, _), d in cell.items() if sc == s]
        med = {v: st.median([d[v] for (sc, _), d in cell.items() if sc == s]) for v in (a, b)}
        print(f"{s:9} {a:9} / {b:8}: per round median {st.median(xs):.3f} "
              f"(spread {min(xs):.3f}-{max(xs):.3f}); rates {med[a]:.0f} vs {med[b]:.0f}/s")
PY
