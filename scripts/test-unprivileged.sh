#!/usr/bin/env bash
# The test suite as an unprivileged user: what the service user meets. Root hides it (root
# may write its own /proc/self files, read every file, map uid 0), so containment and the
# end-to-end tests must also pass without it.
#
#   sudo bash scripts/test-unprivileged.sh [TEST FILTER...]
#
# Builds the tests as the caller (cargo test --no-run), creates the system user
# `hub-sidecar-test` if missing, and runs the unit and integration test binaries as that
# user with a fresh HOME and no Rust toolchain on PATH. Run as an unprivileged user, it runs
# the binaries as that user directly.
#
# What is required here (HUB_SIDECAR_REQUIRE, passed through): what the caller requires,
# less `root` (never held here) and every tool the test user cannot run (the Rust
# toolchain, anything installed under root's HOME); each dropped one is printed, and its
# tests' skips are listed at the end (tests/it/util.rs, "Gating a test").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/requirements.sh

TEST_USER="${TEST_USER:-hub-sidecar-test}"

# The test binaries, built as the caller, as cargo lists them ("Executable … (PATH)").
mapfile -t BINARIES < <(cargo test --locked --no-run 2>&1 \
  | sed -n 's/^ *Executable .*(\(.*\))$/\1/p' | sed "s|^\([^/]\)|$PWD/\1|")
if [ "${#BINARIES[@]}" = 0 ]; then
  echo "test-unprivileged: cargo built no test binary" >&2
  exit 1
fi

if [ "$(id -u)" = 0 ]; then
  if ! id -u "$TEST_USER" >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin "$TEST_USER"
  fi
  # The tests read fixtures and run the built binary from the work tree: every directory
  # on the way must be searchable by the test user.
  if ! runuser -u "$TEST_USER" -- test -x "$PWD/target"; then
    if [ "${CI:-}" = true ]; then
      # A throwaway CI machine: open the closed parents for searching (not reading).
      d="$PWD"
      while [ "$d" != / ]; do
        if ! runuser -u "$TEST_USER" -- test -x "$d"; then
          echo "test-unprivileged: chmod o+x $d (so $TEST_USER can reach the work tree)"
          chmod o+x "$d"
        fi
        d="$(dirname "$d")"
      done
    fi
    if ! runuser -u "$TEST_USER" -- test -x "$PWD/target"; then
      echo "test-unprivileged: $PWD is not reachable for $TEST_USER (a parent directory is" \
        "closed); clone the repository somewhere world-searchable" >&2
      exit 1
    fi
  fi
  HOME_DIR="$(mktemp -d)"
  chown "$TEST_USER:" "$HOME_DIR"
  trap 'rm -rf "$HOME_DIR"' EXIT
  as_user() { runuser -u "$TEST_USER" -- env -i HOME="$HOME_DIR" PATH=/usr/local/bin:/usr/bin:/bin \
    LANG=C.UTF-8 RUST_BACKTRACE=1 HUB_SIDECAR_REQUIRE="$HUB_SIDECAR_REQUIRE" \
    HUB_SIDECAR_SKIPS="$HUB_SIDECAR_SKIPS" "$@"; }
  RUN_AS="$TEST_USER (uid $(id -u "$TEST_USER"))"
else
  as_user() { "$@"; }
  RUN_AS="$(id -un) (uid $(id -u))"
fi

# The skip list: the caller's (.ci/run keeps one across both runs), else our own.
own_list=
if [ -z "${HUB_SIDECAR_SKIPS:-}" ]; then
  HUB_SIDECAR_SKIPS="$(mktemp /tmp/hub-sidecar-skips.XXXXXX)"
  own_list=1
fi
export HUB_SIDECAR_SKIPS
if [ "$(id -u)" = 0 ]; then
  # The test user appends to it.
  chgrp "$TEST_USER" "$HUB_SIDECAR_SKIPS"
  chmod g+w "$HUB_SIDECAR_SKIPS"
fi
echo "# as $RUN_AS" >>"$HUB_SIDECAR_SKIPS"

# Never root here; a tool the test user cannot run is not required of this run.
req="$(requirements_without "${HUB_SIDECAR_REQUIRE:-}" root)"
for tool in rustc cargo claude lintian promtool mmdebstrap python3 perl curl git tar go node \
  npm pnpm yarn uv; do
  case ",$req," in *",$tool,"*) ;; *) continue ;; esac
  arg=--version
  [ "$tool" = go ] && arg=version
  if ! (cd /tmp && as_user "$tool" "$arg" >/dev/null 2>&1); then
    echo "test-unprivileged: \`$tool\` does not run for $RUN_AS: not required here (its tests are listed as skips)"
    req="$(requirements_without "$req" "$tool")"
  fi
done
export HUB_SIDECAR_REQUIRE="$req"
echo "running the tests as $RUN_AS; required: ${req:-nothing}"

status=0
for bin in "${BINARIES[@]}"; do
  echo "== $(basename "$bin") as an unprivileged user"
  (cd /tmp && as_user "$bin" --test-threads="${TEST_THREADS:-4}" "$@") || status=1
done
if [ -n "$own_list" ]; then
  skips_print "$HUB_SIDECAR_SKIPS"
  rm -f "$HUB_SIDECAR_SKIPS"
fi
exit $status
