#!/usr/bin/env bash
# What `[network] mode = "allowlist"` costs per task and per child, and the throughput of a
# 100 MB download through the daemon's proxy against a direct one
# (examples/bench_net.rs). Needs Landlock, user namespaces and curl; release build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --example bench_net
target/release/examples/bench_net "$@"
