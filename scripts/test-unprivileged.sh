#!/usr/bin/env bash
# The test suite as an unprivileged user: what the service user meets. Root hides it (root
# may write its own /proc/self files, read every file, map uid 0), so containment and the
# end-to-end tests must also pass without it.
#
#   sudo bash scripts/test-unprivileged.sh [TEST FILTER...]
#
# Builds the tests as the caller (cargo test --no-run), creates the system user
# `hub-sidecar-test` if missing, and runs the unit and integration test binaries as that
# user with a fresh HOME and no Rust toolchain on PATH (tests that need one say "skipped").
# Tests that need root (booting systemd) skip with a message. Run as an unprivileged user,
# it runs the binaries as that user directly.
set -euo pipefail
cd "$(dirname "$0")/.."

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
    LANG=C.UTF-8 RUST_BACKTRACE=1 "$@"; }
  echo "running the tests as $TEST_USER (uid $(id -u "$TEST_USER"))"
else
  as_user() { "$@"; }
  echo "running the tests as $(id -un) (uid $(id -u))"
fi

status=0
for bin in "${BINARIES[@]}"; do
  echo "== $(basename "$bin") as an unprivileged user"
  (cd /tmp && as_user "$bin" --test-threads="${TEST_THREADS:-4}" "$@") || status=1
done
exit $status
