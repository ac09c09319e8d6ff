#!/usr/bin/env bash
# Fuzz hub frame parsing and dispatch with cargo-fuzz (libFuzzer). Not run in CI.
#   bash scripts/fuzz.sh [SECONDS]     # default 300 s
# Needs a nightly toolchain (rustup toolchain install nightly) and installs cargo-fuzz if
# missing. Without nightly it falls back to the stable mutation fuzzer in
# examples/fuzz_frames.rs (a fixed number of iterations). Crashes land in fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-300}"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain; running the stable fallback (examples/fuzz_frames.rs)"
  exec cargo run --release --example fuzz_frames -- "${FUZZ_ITERATIONS:-1000000}"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo +nightly install cargo-fuzz --locked
fi
mkdir -p fuzz/corpus/frames
cp -n fuzz/seeds/frames/* fuzz/corpus/frames/ 2>/dev/null || true
# -rss_limit_mb: a frame may be 16 MiB; the parser must not need much more than that.
exec cargo +nightly fuzz run frames fuzz/corpus/frames -- \
  -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -dict=fuzz/frames.dict
