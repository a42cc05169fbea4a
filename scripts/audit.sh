#!/usr/bin/env bash
# Reruns the SQL audit's probes (../shared/audit, or $AUDIT) against this tree: a copy of
# the probes in target/audit, with their prep.sql generated from the engine's statements
# as they are now (gd_audit_prep), on a scratch database built from ./migrations.
# Each probe's output lands beside it: target/audit/<probe>.out.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${AUDIT:-../shared/audit}
rm -rf target/audit && mkdir -p target/audit && cp "$src"/* target/audit/ && chmod -R u+w target/audit
cargo run --quiet --bin gd_audit_prep > target/audit/prep.sql
MIGRATIONS="$PWD/migrations" DB=${DB:-gd_audit} bash target/audit/run_all.sh
