#!/usr/bin/env bash
# Reruns the SQL audit's probes (../shared/audit, or $AUDIT) against this tree: a copy of
# the probes in target/audit, with their prep.sql generated from the engine's statements
# as they are now (gd_audit_prep; so is the reap that the pgbench race e7 runs), on a
# scratch database built from gen_durable/migrations.
# Each probe's output lands beside it: target/audit/<probe>.out.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${AUDIT:-../shared/audit}
rm -rf target/audit && mkdir -p target/audit && cp "$src"/* target/audit/ && chmod -R u+w target/audit
# The probes' runner does not parse under bash 5.2 (an apostrophe inside "${VAR:?…}").
sed -i "s/the project's migrations/the project migrations/" target/audit/run_all.sh
cargo run --quiet -p gen_durable_suite --bin gd_audit_prep > target/audit/prep.sql
cargo run --quiet -p gen_durable_suite --bin gd_audit_prep -- reap-pgbench > target/audit/e7_reap_exact.pgb
MIGRATIONS="$PWD/gen_durable/migrations" DB=${DB:-gd_audit} bash target/audit/run_all.sh
