//! `hub-sidecar run` (the default): the daemon with its side services (metrics, status
//! socket, systemd watchdog) and the staged stop on SIGTERM/SIGINT.

use std::process::ExitCode;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::RunArgs;
use crate::config;
use crate::daemon::{self, ExitReason, Shutdown};
use crate::ops::Ops;
use crate::process::ChildEnv;
use crate::redact::RedactingWriter;

/// Run the daemon until it is stopped; the exit code says how it stopped.
pub async fn run(args: RunArgs, logs: RedactingWriter) -> anyhow::Result<ExitCode> {
    crate::sandbox::refuse_powerless_root()?;
    // Before anything opens a descriptor: whatever a task does with the proxy, the hub
    // link, /healthz and the status socket keep theirs (see `sandbox::descriptors`).
    let (was, open_files) = crate::sandbox::descriptors::raise_limit();
    let cfg = args.config.load()?;
    // One redactor for the logs and the daemon: the agent's login files are read once.
    let redactor = std::sync::Arc::new(ChildEnv::from_config(&cfg).redactor(&cfg).await);
    logs.set(redactor.clone());
    config::warn_about(&cfg);
    tracing::info!(agent_id = %cfg.agent_id, hub = %cfg.hub_url, state = %cfg.state_file().display(), open_files, "hub-sidecar starting");
    if open_files < 4096 {
        tracing::warn!(open_files, was, "the open-files limit is low: each task's proxy holds fewer connections; set LimitNOFILE=65536 in the unit");
    }
    let shutdown = Shutdown::new();
    let ops = Ops::new();
    // Side services live exactly as long as the daemon: cancelled and awaited on every exit.
    let services = CancellationToken::new();
    let tracker = TaskTracker::new();
    tracker.spawn(stage_signals(shutdown.clone(), services.clone()));
    if let Some(addr) = cfg.metrics_addr {
        crate::ops::http::start(addr, ops.clone(), services.clone(), &tracker).await?;
    }
    // `hub-sidecar status` without metrics_addr; a failure only costs that command. Set up
    // beside the daemon's start (three file-system calls and a bind: on the way to
    // `identify` they were ~0.6 ms).
    let socket = crate::ops::socket::path(&cfg.state_dir);
    tracker.spawn({
        let (ops, services, tracker) = (ops.clone(), services.clone(), tracker.clone());
        async move {
            if let Err(e) = crate::ops::socket::start(socket, ops, services, &tracker).await {
                tracing::warn!(error = %format!("{e:#}"), "no status socket: `hub-sidecar status` needs metrics_addr");
            }
        }
    });
    // Fed only while the last pong is younger than two ping intervals.
    tracker.spawn(crate::ops::systemd::watchdog(
        ops.clone(),
        cfg.ping_interval() * 2,
        services.clone(),
    ));
    let result = daemon::run_with(cfg, shutdown, ops, redactor).await;
    services.cancel();
    tracker.close();
    tracker.wait().await;
    let reason = result.context("the daemon stopped with an error")?;
    tracing::info!(reason = ?reason, "hub-sidecar stopped");
    Ok(match reason {
        ExitReason::Drained | ExitReason::Aborted | ExitReason::RestartRequested => {
            ExitCode::SUCCESS
        }
        // What a shell reports for a process ended by SIGINT; the third signal asked for it.
        ExitReason::Interrupted => ExitCode::from(130),
    })
}

/// First SIGTERM/SIGINT: drain. Second: abort the task (kept for recovery). Third: stop at
/// once ([`Shutdown::immediate`]: the task's processes are killed, the binary exits 130).
/// Ends with the daemon's side services (`services`).
async fn stage_signals(shutdown: Shutdown, services: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the daemon with SIGKILL");
        return;
    };
    let mut count = 0;
    loop {
        tokio::select! {
            _ = services.cancelled() => return,
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        count += 1;
        match count {
            1 => shutdown.drain.cancel(),
            2 => {
                tracing::warn!("second stop signal: cancelling the running task");
                shutdown.abort.cancel();
            }
            _ => {
                // State is already on disk; nothing is lost by leaving now. The daemon kills
                // the task's process groups without a grace period (no orphans), returns
                // `Interrupted`, and the binary exits 130 once its services have stopped.
                tracing::warn!("third stop signal: exiting immediately");
                shutdown.immediate.cancel();
            }
        }
    }
}
