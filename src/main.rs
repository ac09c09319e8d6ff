//! `hub-sidecar`: parse the command line, set up logging, run the library, map the result
//! to an exit code.

use std::process::ExitCode;

use clap::Parser;
use hub_sidecar::cli::Cli;
use hub_sidecar::{commands, logging};

fn main() -> ExitCode {
    // One malloc arena for the whole process. glibc gives every thread that allocates an
    // arena of its own (up to 8 per core): the blocking pool's short-lived threads left
    // ~0.3 MB of them resident after each task (BENCHMARKS.md, figure 4). The daemon
    // allocates on one runtime thread and a few blocking ones, so one lock costs nothing.
    // SAFETY: mallopt only sets an allocator parameter; no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let cli = Cli::parse();
    // Secrets known from the environment are scrubbed from logs from the first line on;
    // the daemon's own logging never formats the token in the first place.
    let secrets = std::env::var("HUB_SIDECAR_TOKEN").into_iter().collect();
    let logs = logging::init_tracing(cli.log_format, cli.log_level(), secrets);
    // One thread runs the daemon: it runs one task at a time and waits on sockets and
    // children; blocking work goes to tokio's blocking pool. A multi-threaded scheduler
    // bought nothing measurable (BENCHMARKS.md, figures 2 and 3) and its load statistics
    // alone pull libm (0.6 MB resident) into every daemon.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hub-sidecar: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The daemon's future lives on the heap: on the stack it and its moves would leave stack
    // pages resident (touched once) for the daemon's whole life.
    match runtime.block_on(Box::pin(commands::run(cli, logs))) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hub-sidecar: {e:#}");
            ExitCode::FAILURE
        }
    }
}
