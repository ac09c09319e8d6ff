#!/usr/bin/env bash
# Install hub-sidecar as a systemd service on this machine, from a source checkout.
# On Debian and Ubuntu prefer the package: `cargo deb`, then `sudo apt install
# ./target/debian/hub-sidecar_*.deb` (upgrades keep the edited config, removal is clean).
#
#   sudo bash scripts/install.sh                   # build a release binary, then install
#   sudo bash scripts/install.sh --binary PATH     # install a binary built elsewhere
#   bash scripts/install.sh --dry-run              # print what would be done, change nothing
#
# Installs /usr/local/bin/hub-sidecar, creates the system user `hub-sidecar` and
# /etc/hub-sidecar, installs the units hub-sidecar.service and hub-sidecar@.service (their
# ExecStart pointed at that binary) and the
# example config as /etc/hub-sidecar/hub-sidecar.toml (mode 0600, owned by the service user).
# An existing config is never overwritten. Nothing is started: the next steps are printed.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
BINARY=""
PREFIX="${PREFIX:-/usr/local}"
UNIT_DIR="${UNIT_DIR:-/etc/systemd/system}"
CONF_DIR="${CONF_DIR:-/etc/hub-sidecar}"
SERVICE_USER="hub-sidecar"

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --binary) shift; BINARY="${1:?--binary needs a path}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# Print every action; run it unless --dry-run.
run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

if [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
  echo "install.sh: run as root (sudo), or with --dry-run to see the actions" >&2
  exit 1
fi

if [ -z "$BINARY" ]; then
  BINARY="target/release/hub-sidecar"
  run cargo build --release --locked
elif [ ! -x "$BINARY" ]; then
  echo "install.sh: $BINARY is not an executable file; build it with cargo build --release" >&2
  exit 1
fi

run install -D -m 0755 "$BINARY" "$PREFIX/bin/hub-sidecar"

if id -u "$SERVICE_USER" >/dev/null 2>&1; then
  echo "= user $SERVICE_USER exists"
else
  # Home is the state directory: `claude` keeps its login in ~/.claude there.
  run useradd --system --user-group --home-dir /var/lib/hub-sidecar --no-create-home \
    --shell /usr/sbin/nologin "$SERVICE_USER"
fi

# systemd's StateDirectory= would create it at the first start; creating it now lets
# `hub-sidecar check` run as the service user before that.
run install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_USER" /var/lib/hub-sidecar

run install -d -m 0750 "$CONF_DIR"
run chown "root:$SERVICE_USER" "$CONF_DIR"
if [ -e "$CONF_DIR/hub-sidecar.toml" ]; then
  echo "= $CONF_DIR/hub-sidecar.toml exists: left as is"
else
  # 0600 and owned by the service user: the file holds the hub token.
  run install -m 0600 -o "$SERVICE_USER" -g "$SERVICE_USER" \
    config/hub-sidecar.example.toml "$CONF_DIR/hub-sidecar.toml"
fi

if [ -e /var/lib/dpkg/info/hub-sidecar.list ]; then
  echo "= the hub-sidecar package is installed too: its units (/usr/bin/hub-sidecar) are" \
    "overridden by these in $UNIT_DIR; remove one of the two installs"
fi
# The shipped units name the packaged binary (/usr/bin): point them at this one.
for unit in hub-sidecar.service hub-sidecar@.service; do
  echo "+ install config/$unit as $UNIT_DIR/$unit (ExecStart=$PREFIX/bin/hub-sidecar)"
  if [ "$DRY_RUN" = 0 ]; then
    mkdir -p "$UNIT_DIR"
    sed "s|^ExecStart=/usr/bin/hub-sidecar |ExecStart=$PREFIX/bin/hub-sidecar |" \
      "config/$unit" > "$UNIT_DIR/$unit"
    chmod 0644 "$UNIT_DIR/$unit"
  fi
done
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  run systemctl daemon-reload
else
  echo "= systemd is not running here: run 'systemctl daemon-reload' on the target"
fi

cat <<NEXT

Next steps:
  1. Edit $CONF_DIR/hub-sidecar.toml: set agent_id, token and hub_url.
  2. Check it:   sudo -u $SERVICE_USER $PREFIX/bin/hub-sidecar check --config $CONF_DIR/hub-sidecar.toml
  3. Start it:   systemctl enable --now hub-sidecar
     Status:     systemctl status hub-sidecar    Logs: journalctl -u hub-sidecar -f
  Several agents on this box: one config per agent as $CONF_DIR/NAME.toml (mode 0600,
  owned by $SERVICE_USER), then  systemctl enable --now hub-sidecar@NAME
  Claude tasks: log the service user in once so ~/.claude exists in its state directory,
  e.g.  sudo -u $SERVICE_USER env HOME=/var/lib/hub-sidecar claude
NEXT
