# Sourced by scripts/test.sh, scripts/test-unprivileged.sh and .ci/run: what a test run
# requires, and the list of the tests that skipped (tests/it/util.rs, "Gating a test").
#
#   HUB_SIDECAR_REQUIRE  comma-separated requirements; a test gated on one of them fails
#                        when it is missing instead of skipping.
#   HUB_SIDECAR_SKIPS    the file every other skip is appended to: test, requirement, reason
#                        (tab-separated), one line each.

# requirements_without LIST NAME...: LIST (comma-separated) without the NAMEs.
requirements_without() {
  local list=",$1,"
  shift
  for name in "$@"; do
    list="${list//,$name,/,}"
  done
  list="${list#,}"
  echo "${list%,}"
}

# skips_print FILE: the skip list as a table, or that there was none.
skips_print() {
  local n
  n="$(grep -cv '^#' "$1" 2>/dev/null || true)"
  echo "== skipped tests: ${n:-0} (test, requirement, reason; HUB_SIDECAR_REQUIRE: ${HUB_SIDECAR_REQUIRE:-none})"
  if [ -s "$1" ]; then
    sed 's/\t/  |  /g' "$1"
  fi
}
