#!/usr/bin/env bash
# Regenerates scripts/link-order.txt: the functions the release daemon runs, in the order it
# first runs them — start-up and idling first, then the task path. `scripts/build.rs` hands
# the file to the linker (`--symbol-ordering-file`), which places those functions side by
# side at the start of `.text`. The kernel maps a binary's code in fault-around windows, so
# the few hundred functions an idle daemon runs, scattered over 7 MB, kept ~4.5 MB of it
# resident; packed together they keep ~1.3 MB (BENCHMARKS.md, figure 2).
#
# Needs valgrind (callgrind lists every function executed) and perf (the page faults of a
# run outside valgrind: code paths valgrind does not take, e.g. Landlock, which it cannot
# emulate, and CPU-specific SHA code). About 15–20 minutes on 2 cores: a
# profile, then up to three relinks (fat LTO, ~3 minutes each) with a page-fault pass each.
#
# When to run it: after a dependency update or a large change. A stale file costs only
# memory, never correctness: symbols it names that no longer exist are skipped (the link
# is quiet about them), and `scripts/bench.sh` prints how many of its names the binary still
# has.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind perf; do
  command -v "$tool" >/dev/null || { echo "link-order: needs $tool (apt-get install valgrind linux-perf)" >&2; exit 1; }
done

cargo build --release --bins
cargo build --example bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy, so a rebuild while this runs cannot swap the binary under the profile.
cp target/release/hub-sidecar "$work/hub-sidecar"
bench() { target/debug/examples/bench --repeat 1 --quick --out "$work/bench.md" "$@" >"$work/bench.log" 2>&1 || {
  echo "link-order: bench $* failed; its output:" >&2; cat "$work/bench.log" >&2; exit 1; }; }

# callgrind: every function executed. Under valgrind the kernel's Landlock and namespace
# calls fail, so the task figures run with containment off (the perf pass below covers it).
mkdir -p "$work/cg" "$work/pf"
cat >"$work/callgrind" <<EOF
#!/usr/bin/env bash
# run --config PATH: the task figures' config gets containment = "off" as its first key.
if [ "\${LINK_ORDER_CONTAINMENT_OFF:-}" = 1 ]; then
  { echo 'containment = "off"'; cat "\$3"; } >"\$3.new" && mv "\$3.new" "\$3" && chmod 600 "\$3"
fi
exec valgrind --tool=callgrind --demangle=no --dump-instr=no \
  --callgrind-out-file="$work/cg/\$LINK_ORDER_PHASE.%p" "$work/hub-sidecar" "\$@"
EOF
# perf: the first touch of each code page in a real run, with the function that touched it.
cat >"$work/perf" <<EOF
#!/usr/bin/env bash
exec perf record -q -e page-faults -c 1 -d -o "$work/pf/\$LINK_ORDER_PHASE.\$\$" "\$LINK_ORDER_BIN" "\$@"
EOF
chmod +x "$work/callgrind" "$work/perf"

echo "link-order: profiling start-up and idle (callgrind)"
LINK_ORDER_PHASE=1-idle bench --only 2 --bin "$work/callgrind"
echo "link-order: profiling start-up and idle (page faults)"
LINK_ORDER_BIN="$work/hub-sidecar" LINK_ORDER_PHASE=2-idle-a bench --only 2 --bin "$work/perf"
echo "link-order: profiling tasks, checks and a progress flood (callgrind, containment off)"
LINK_ORDER_PHASE=3-task LINK_ORDER_CONTAINMENT_OFF=1 bench --only 3,4,7 --bin "$work/callgrind"
echo "link-order: profiling tasks and a 149 MB output (page faults, containment on)"
LINK_ORDER_BIN="$work/hub-sidecar" LINK_ORDER_PHASE=4-task-a bench --only 3,10 --bin "$work/perf"

# Functions of our binary, in first-seen order per phase, phases in order.
callgrind_functions() {
  # Callgrind compresses names: "fn=(12) name" defines id 12, a later "fn=(12)" reuses it.
  # Recursion levels come as "name'2".
  awk -v obj="$work/hub-sidecar" '
    match($0, /^(ob|cob|fn|cfn)=\([0-9]+\)/) {
      key = substr($0, 1, index($0, "=") - 1)
      id = substr($0, index($0, "(") + 1, index($0, ")") - index($0, "(") - 1)
      name = substr($0, index($0, ")") + 2)
      kind = (key ~ /ob$/) ? "ob" : "fn"
      if (name != "") names[FILENAME, kind, id] = name
      if (key == "ob") cur = names[FILENAME, "ob", id]
      if (key == "fn" && cur == obj) { n = names[FILENAME, "fn", id]; sub(/'"'"'[0-9]+$/, "", n); print n }
    }' "$@"
}
perf_functions() {
  # Instruction fetches (fault address on the same page as the instruction) in our binary
  # (either copy).
  for f in "$@"; do
    perf script -i "$f" -F addr,ip,sym,dso --no-demangle 2>/dev/null |
      awk -v obj="$work/hub-sidecar" '
        function page(hex) { sub(/^0+/, "", hex); return substr(hex, 1, length(hex) - 3) }
        index($NF, "(" obj) == 1 && page($1) == page($(NF-2)) { print $(NF-1) }'
  done
}
# Keep only names the binary has (a profile can see a symbol by another name).
nm --defined-only "$work/hub-sidecar" | awk '{print $NF}' | sort -u >"$work/symbols"
write_order() {
  {
    callgrind_functions "$work"/cg/1-idle.*
    perf_functions "$work"/pf/2-idle-*
    callgrind_functions "$work"/cg/3-task.*
    perf_functions "$work"/pf/4-task-*
  } | grep -E '^(_[ZR]|_start$|main$)' | awk '!seen[$0]++' |
    awk 'NR == FNR { have[$0] = 1; next } have[$0]' "$work/symbols" - >scripts/link-order.txt
}
write_order

# A page fault names only the first function to touch a window of pages, so which functions
# it names depends on the layout. More passes on each new layout find the ones the previous
# layout hid behind a neighbour (e.g. code valgrind never runs, next to code it does), until a
# pass finds nothing new (at most 3 more passes: ~4 minutes each).
# LINK_ORDER_PASSES=0..3 bounds them (each is a fat-LTO relink: on a busy machine the first
# profile alone, with no extra pass, already places what the daemon runs).
passes="b c d"
passes="${passes:0:$((2 * ${LINK_ORDER_PASSES:-3}))}"
for pass in $passes; do
  before=$(wc -l <scripts/link-order.txt)
  echo "link-order: page-fault pass $pass, on the layout so far ($before functions)"
  cargo build --release --bins
  cp target/release/hub-sidecar "$work/hub-sidecar-$pass"
  LINK_ORDER_BIN="$work/hub-sidecar-$pass" LINK_ORDER_PHASE=2-idle-$pass bench --only 2 --bin "$work/perf"
  LINK_ORDER_BIN="$work/hub-sidecar-$pass" LINK_ORDER_PHASE=4-task-$pass bench --only 3,10 --bin "$work/perf"
  write_order
  [ "$(wc -l <scripts/link-order.txt)" -gt "$before" ] || break
done
cargo build --release --bins
echo "link-order: $(wc -l <scripts/link-order.txt) functions in scripts/link-order.txt, laid out" \
  "in target/release/hub-sidecar"
