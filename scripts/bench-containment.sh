#!/usr/bin/env bash
# What containment costs per child process: spawn + wait of /bin/true through the daemon's
# spawn path, unconfined and in a task sandbox, and the one-off cost of building a task's
# sandbox (examples/bench_spawn.rs). Needs Landlock and user namespaces; release build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --example bench_spawn
target/release/examples/bench_spawn "$@"
