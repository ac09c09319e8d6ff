//! Benchmark driver: how light and fast the real `hub-sidecar` binary is.
//!
//! It builds nothing. It runs the **release binary** (`target/release/hub-sidecar`, or
//! `--bin PATH`) as a child process with a TOML config in a temp dir, against an in-process
//! [`MockHub`] on `127.0.0.1:0`, and measures the figures listed in `BENCHMARKS.md`. Every
//! time is taken from the mock's own [`Recorded::at`] stamps where the wire is involved (the
//! instant the hub sent `task_assign` and the instant it read the answer), so the driver's
//! scheduling does not leak into the numbers.
//!
//! ```sh
//! cargo build --release --bins --examples
//! target/release/examples/bench [--quick] [--out FILE] [--bin PATH]
//! ```
//!
//! `--quick` shortens the long runs (fewer tasks, 10 s instead of 60 s of idle CPU, no
//! 100,000-file rows in figure 13). The
//! results table goes to stdout and, with `--out`, to FILE (markdown). Figure 13 can be
//! narrowed to some rows: `BENCH_13_SHAPES=d BENCH_13_SIZES=100000 bench --only 13`.
//!
//! # Layout
//!
//! - `main.rs`: arguments, which figures run, the table written out.
//! - `harness.rs`: [`harness::Daemon`] (one child process with its config, temp dir and
//!   `/proc` readers), the mock hubs, [`harness::Stats`] (order statistics), the table rows.
//! - one module per group of figures (`startup`, `latency`, `output`, `verify`, `clone`,
//!   `scaling`, `push_scan`),
//!   one `async fn` per figure, each returning rows for the table.
//!
//! This is a benchmark, not a test: it reports, it does not assert. A figure that misses its
//! target is printed as `MISS`, and the run goes on.

mod clone;
mod harness;
mod latency;
mod node;
mod output;
mod push_scan;
mod scaling;
mod startup;
mod verify;

use std::path::{Path, PathBuf};
use std::time::Instant;

use harness::{merge_runs, table, Row};

#[derive(Debug, Clone)]
struct Opts {
    quick: bool,
    /// Run the selected figures this many times and show min / median / max (`--repeat 3`).
    repeat: usize,
    /// Run only these figures (`--only 3,4`); empty: all.
    only: Vec<u32>,
    out: Option<PathBuf>,
    bin: PathBuf,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        quick: false,
        repeat: 1,
        only: Vec::new(),
        out: None,
        bin: PathBuf::from("target/release/hub-sidecar"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--repeat" => {
                o.repeat = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n >= 1)
                    .unwrap_or(1)
            }
            "--out" => o.out = args.next().map(PathBuf::from),
            "--only" => {
                o.only = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|n| n.trim().parse().ok())
                    .collect()
            }
            "--bin" => o.bin = args.next().map(PathBuf::from).unwrap_or(o.bin),
            "-h" | "--help" => {
                println!(
                    "usage: bench [--quick] [--repeat N] [--only 1,2,..] [--out FILE] [--bin PATH]"
                );
                std::process::exit(0);
            }
            other => {
                eprintln!("bench: unknown argument {other}; try --help");
                std::process::exit(2);
            }
        }
    }
    o
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = parse_args();
    // The binary as after a reboot, not as the build left it in the page cache (see
    // `harness::drop_from_page_cache`); every later start reads it back the same way.
    harness::drop_from_page_cache(&o.bin);
    let started = Instant::now();
    let (tasks, idle_secs, overhead_runs) = if o.quick {
        (200, 10, 10)
    } else {
        (1000, 60, 30)
    };
    let run = |n: u32| o.only.is_empty() || o.only.contains(&n);
    let mut runs: Vec<Vec<Row>> = Vec::new();
    for _ in 0..o.repeat {
        let mut rows = Vec::new();
        if run(1) {
            eprintln!("bench: 1 spawn → identify");
            rows.extend(startup::spawn_to_identify(&o).await);
        }
        if run(2) || run(8) {
            eprintln!("bench: 2, 8 idle RSS and CPU ({idle_secs} s)");
            rows.extend(startup::idle(&o, &[], "", if run(8) { idle_secs } else { 0 }).await);
            rows.extend(
                startup::idle(&o, &[("MALLOC_ARENA_MAX", "2")], " (MALLOC_ARENA_MAX=2)", 0).await,
            );
        }
        if run(3) {
            eprintln!("bench: 3 latency ({tasks} tasks, state on disk, then on tmpfs)");
            rows.extend(latency::latency(&o, tasks, &std::env::temp_dir(), "state on disk").await);
            if Path::new("/dev/shm").is_dir() {
                rows.extend(
                    latency::latency(&o, tasks, Path::new("/dev/shm"), "state on tmpfs").await,
                );
            }
            rows.extend(latency::ws_floor(200).await);
            rows.extend(latency::spawn_floor(200).await);
        }
        if run(4) {
            eprintln!("bench: 4 progress flood");
            rows.extend(output::flood(&o).await);
        }
        if run(5) {
            eprintln!("bench: 5 trickle");
            rows.extend(output::trickle(&o).await);
        }
        if run(6) {
            eprintln!("bench: 6 check timeout");
            rows.extend(verify::check_timeout(&o).await);
        }
        if run(7) {
            eprintln!("bench: 7 verification overhead");
            rows.extend(verify::verify_overhead(&o, overhead_runs).await);
        }
        if run(10) {
            eprintln!("bench: 10 seq 1 20000000 through the shell executor");
            rows.extend(output::big_output(&o, 3).await);
        }
        if run(11) {
            eprintln!("bench: 11 ten daemons side by side");
            rows.extend(startup::side_by_side(&o, 10).await);
        }
        if run(12) {
            eprintln!("bench: 12 fifty tasks on one managed clone");
            rows.extend(clone::managed_clone(&o, 50).await);
        }
        if run(13) {
            // --quick leaves out the 100,000-file rows (their fixtures take the most time).
            let sizes: &[usize] = if o.quick {
                &[1_000, 10_000]
            } else {
                &[1_000, 10_000, 100_000]
            };
            eprintln!("bench: 13 scaling with the workspace ({sizes:?} files × 4 shapes)");
            rows.extend(scaling::scaling(&o, sizes).await);
        }
        if run(15) {
            eprintln!("bench: 15 push scan (an everyday change, a 64 MiB one)");
            rows.extend(push_scan::push_scan().await);
        }
        if run(14) {
            match node::node_sidecar() {
                Some(src) => {
                    eprintln!("bench: 14 the Node sidecar in {} side by side", src.display());
                    rows.extend(node::compare(&o, &src, 50).await);
                }
                None => eprintln!(
                    "bench: 14 skipped: set NODE_SIDECAR to a Node sidecar with its dependencies (BENCHMARKS.md)"
                ),
            }
        }
        if run(9) {
            eprintln!("bench: 9 backlog of 1000 × 64 KB results");
            rows.extend(latency::backlog(&o, 1000).await);
        }
        runs.push(rows);
    }
    let mut rows = merge_runs(runs);
    // Figure 8 was measured with figure 2; keep the table in figure order.
    rows.sort_by_key(|r| {
        let n: String = r.figure.chars().take_while(char::is_ascii_digit).collect();
        n.parse::<u32>().unwrap_or(99)
    });

    let layout = match harness::link_order_coverage(&o.bin) {
        Some((found, listed)) => format!(
            "\nLink order: {found} of the {listed} functions in scripts/link-order.txt are in \
             the binary (when this falls, rerun scripts/link-order.sh).\n"
        ),
        None => String::new(),
    };
    let text = format!(
        "{}\nDriver wall time: {:.0} s{}.\n{layout}",
        table(&rows),
        started.elapsed().as_secs_f64(),
        if o.quick { " (--quick)" } else { "" }
    );
    println!("{text}");
    if let Some(out) = &o.out {
        if let Err(e) = std::fs::write(out, &text) {
            eprintln!("bench: cannot write {}: {e}", out.display());
            std::process::exit(1);
        }
    }
}
