#!/usr/bin/env bash
# The test suite: unit tests beside the code and the integration tests under tests/,
# which drive the real daemon against the mock hub over loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
# A few threads: most tests wait on sockets and child processes, not the CPU.
exec cargo test --locked -- --test-threads="${TEST_THREADS:-4}" "$@"
