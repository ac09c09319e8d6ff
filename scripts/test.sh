#!/usr/bin/env bash
# The test suite: unit tests beside the code and the integration tests under tests/,
# which drive the real daemon against the mock hub over loopback.
#
# Tests that need what this machine may lack (a kernel feature, a tool, root) skip, and each
# skip is listed at the end; a requirement named in HUB_SIDECAR_REQUIRE fails instead
# (.ci/run names everything it installs). See tests/it/util.rs, "Gating a test".
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/requirements.sh

# Run as root, no test can be unprivileged; run as another user, none can be root.
if [ "$(id -u)" = 0 ]; then
  HUB_SIDECAR_REQUIRE="$(requirements_without "${HUB_SIDECAR_REQUIRE:-}" unprivileged)"
else
  HUB_SIDECAR_REQUIRE="$(requirements_without "${HUB_SIDECAR_REQUIRE:-}" root)"
fi
export HUB_SIDECAR_REQUIRE
# Our own list unless the caller (.ci/run) keeps one across runs and prints it itself.
own_list=
if [ -z "${HUB_SIDECAR_SKIPS:-}" ]; then
  mkdir -p target
  export HUB_SIDECAR_SKIPS="$PWD/target/skipped-tests.txt"
  : >"$HUB_SIDECAR_SKIPS"
  own_list=1
fi
echo "# as $(id -un) (uid $(id -u))" >>"$HUB_SIDECAR_SKIPS"

status=0
# A few threads: most tests wait on sockets and child processes, not the CPU.
cargo test --locked -- --test-threads="${TEST_THREADS:-4}" "$@" || status=$?
if [ -n "$own_list" ]; then
  skips_print "$HUB_SIDECAR_SKIPS"
fi
exit $status
