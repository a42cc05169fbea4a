#!/usr/bin/env bash
# Reruns round four's SQL audit probes (../shared/audit/r4, or $AUDIT_R4) against this
# tree: a copy in target/audit-r4 whose prep_control.sql (RETRY, CANCEL_TREE and
# CANCEL_APPLY, which the probes EXECUTE) is generated from the engine's statements as
# they are now, each probe in a scratch database built from gen_durable/migrations. Outputs land
# beside the probes: target/audit-r4/<probe>.out. (r4_02 compiles the audit's own copy of
# the dashboard's throttle as it was; the throttle as it is now is tested by
# `dashboard::throttle::tests::r4_4_…`.)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${AUDIT_R4:-../shared/audit/r4}
out=target/audit-r4
rm -rf "$out" && mkdir -p "$out" && cp "$src"/* "$out"/ && chmod -R u+w "$out"
{
  echo "-- Statements of store/pg/control.rs as they are now (gd_audit_prep)"
  cargo run --quiet -p gen_durable_suite --bin gd_audit_prep |
    awk '/^PREPARE (retry|cancel_tree|cancel_apply)\(/ { on = 1 } on { print } on && /;$/ { on = 0; print "" }'
} > "$out/prep_control.sql"
MIGRATIONS="$PWD/gen_durable/migrations" bash "$out/run_all.sh"
