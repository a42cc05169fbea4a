#!/usr/bin/env bash
# The drain with each SQL variant of this directory applied after the migration
# (GD_SCHEMA_EXPERIMENT), interleaved with graphile-worker:
#   bash gen_durable_bench/results/2026-12-07-lean-commit/run.sh [N] [ROUNDS] [VARIANT...]
# from the repository's root, after `cargo build --release -p gen_durable_bench`.
set -euo pipefail
N=${1:-100000}; R=${2:-5}; shift 2 || true
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VARIANTS=("$@"); [ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(general lean)
OUT=$(mktemp -d)/runs.jsonl
export GD_PEER_DIR=${GD_PEER_DIR:-/tmp/gd-peer-graphile}
bash gen_durable_bench/peers/graphile.sh --install-only >/dev/null
per_s() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["per_s"])'; }
for r in $(seq 1 "$R"); do
  for v in "${VARIANTS[@]}"; do
    l=$(GD_SCHEMA_EXPERIMENT=$HERE/$v.sql ./target/release/gen_durable_bench --scenario drain \
          --no-ceiling --n "$N" 2>/dev/null | grep '"scenario":"drain"' | tail -1)
    echo "{\"round\":$r,\"v\":\"$v\",\"per_s\":$(echo "$l" | per_s)}" >> "$OUT"
  done
  l=$(bash gen_durable_bench/peers/graphile.sh --n "$N" 2>/dev/null | grep graphile_drain | tail -1)
  echo "{\"round\":$r,\"v\":\"graphile\",\"per_s\":$(echo "$l" | per_s)}" >> "$OUT"
done
python3 - "$OUT" "${VARIANTS[@]}" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
vs = sys.argv[2:]
by = {}
for r in rows:
    by.setdefault(r["v"], []).append(r["per_s"])
g = st.median(by["graphile"])
for v, xs in by.items():
    print(f"{v:9} median {round(st.median(xs)):6} spread {round(min(xs))}-{round(max(xs))}  / graphile {st.median(xs) / g:.2f}")
rounds = {}
for x in rows:
    rounds.setdefault(x["round"], {})[x["v"]] = x["per_s"]
for r, d in sorted(rounds.items()):
    print("round", r, " ".join(f"{v}/graphile {d[v] / d['graphile']:.2f}" for v in vs))
def per_round(a, b):
    xs = [d[a] / d[b] for d in rounds.values()]
    return f"{st.median(xs):.2f} (spread {min(xs):.2f}-{max(xs):.2f})"
for v in vs:
    print(f"{v}/graphile per round: median {per_round(v, 'graphile')}")
for v in vs[1:]:
    print(f"{v}/{vs[0]} per round: median {per_round(v, vs[0])}")
PY
