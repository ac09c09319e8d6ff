#!/usr/bin/env bash
# Benchmarks: build the release binary and the driver once, run the driver
# (examples/bench/) against the real binary, and put the table into BENCHMARKS.md
# between the "results" markers. Extra arguments go to the driver (e.g. --quick).
#
# The daemon is built on its own (`--bins`) and the driver after it (`--examples`): building
# both in one command unifies the dev-dependency features (tokio's test-util) into the
# daemon, and the figures must be those of the binary `cargo build --release` deploys.
#
# Figure 13 (issue 30) scales the workspace: 1k / 10k / 100k files for each of four shapes,
# peak RSS and CPU per attempt (`--only 13`; `--quick` leaves out the 100k rows).
#
# Figure 14 measures the Node sidecar in the same run, against the same mock hub, when
# NODE_SIDECAR names a copy of it with its dependencies installed, kept OUTSIDE this
# repository (never committed):
#   mkdir -p /work/node-sidecar
#   git -C <AgentCom checkout> archive HEAD sidecar | tar -x -C /work/node-sidecar
#   (cd /work/node-sidecar/sidecar && npm ci)
#   NODE_SIDECAR=/work/node-sidecar/sidecar bash scripts/bench.sh --only 14
# Without it, figure 14 is skipped and says so.
set -euo pipefail
if [ -n "${NODE_SIDECAR:-}" ]; then
  [ -f "$NODE_SIDECAR/index.js" ] && [ -d "$NODE_SIDECAR/node_modules" ] || {
    echo "bench: NODE_SIDECAR=$NODE_SIDECAR is not a Node sidecar with its dependencies (index.js, node_modules: run npm ci there)" >&2; exit 1; }
  case "$(realpath "$NODE_SIDECAR")" in
    "$(realpath "$(dirname "$0")/..")"/*) echo "bench: keep the Node sidecar outside this repository" >&2; exit 1 ;;
  esac
  export NODE_SIDECAR
fi
cd "$(dirname "$0")/.."

cargo build --release --locked --bins
cargo build --release --locked --examples

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
# The CPU time the hypervisor took from this machine while the driver ran ("steal", from
# /proc/stat's first line): on a shared VM the latency figures move with it (2026-12-02:
# 11–24 % of the CPU under load, figure 3c twice its quiet value), so the header says it.
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t; exit }' /proc/stat; }
read -r steal0 total0 < <(cpu_ticks)
# Every figure three times (BENCH_REPEAT): the table shows min / median / max of each headline.
target/release/examples/bench --bin target/release/hub-sidecar --out "$out" --repeat "${BENCH_REPEAT:-3}" "$@"
read -r steal1 total1 < <(cpu_ticks)
steal=$(awk -v s=$((steal1 - steal0)) -v t=$((total1 - total0)) 'BEGIN { printf "%.1f", t ? 100 * s / t : 0 }')

# Header for the results section: when, on what, with which command.
{
  echo "Run: \`bash scripts/bench.sh $*\` on $(date -u '+%Y-%m-%d %H:%M UTC'),"
  echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
  echo "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, kernel $(uname -r), $(rustc --version);"
  echo "CPU time taken by the hypervisor (steal) during the run: ${steal} %."
  echo
  cat "$out"
} >"$out.section"
trap 'rm -f "$out" "$out.section"' EXIT

# Replace what is between the markers; everything else in BENCHMARKS.md is prose.
if grep -q '<!-- results:begin -->' BENCHMARKS.md 2>/dev/null; then
  awk -v f="$out.section" '
    /<!-- results:begin -->/ { print; while ((getline l < f) > 0) print l; skip = 1; next }
    /<!-- results:end -->/   { skip = 0 }
    !skip                    { print }
  ' BENCHMARKS.md >BENCHMARKS.md.new
  mv BENCHMARKS.md.new BENCHMARKS.md
  echo "bench: results written to BENCHMARKS.md"
else
  cp "$out.section" bench-results.md
  echo "bench: results written to bench-results.md"
fi
