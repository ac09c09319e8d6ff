#!/usr/bin/env bash
# The long fault-injection runs (not part of CI): 20+ hub crashes, 20 daemon SIGKILLs, a
# 1,000-task soak with RSS/fd/zombie checks, and a fleet of 4 sidecars over 120 tasks with
# sidecar and hub kills (exactly-once, issue 39). Release build, one test at a time so the
# timing faults are not distorted by each other. Figures are printed by each test.
#   bash scripts/soak.sh             # all long variants
#   bash scripts/soak.sh long_soak   # one of them (cargo test filter)
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test it -- --ignored --nocapture --test-threads=1 "${1:-::long_}"
