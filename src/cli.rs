//! The command line: clap definitions and the dispatch to each subcommand.
//!
//! Raw flags live here; [`crate::config::Config::load`] turns them (with the file and the
//! environment) into the validated configuration, once.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::commands::check::CheckArgs;
use crate::commands::run_task::RunTaskArgs;
use crate::commands::verify::VerifyArgs;
pub use crate::commands::ConfigArgs;
use crate::config;
use crate::daemon::{self, ExitReason, Shutdown};
pub use crate::demo::DemoArgs;
use crate::ops::Ops;
use crate::redact::{RedactingWriter, Redactor};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A worker daemon for an AgentCom hub: takes tasks over one WebSocket, runs them with a
/// shell, Claude Code or Ollama executor, verifies them, and reports every result.
#[derive(Debug, Parser)]
#[command(name = "hub-sidecar", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    /// The subcommand; none means `run`.
    pub command: Option<Command>,
    /// `run`'s flags, for the default command (`hub-sidecar --config FILE`); before `run`
    /// or `check` they apply to it where it gives none itself.
    #[command(flatten)]
    pub run: RunArgs,
    /// Log format: `text` for people, `json` for journald/collectors.
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level (RUST_LOG, when set, wins).
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

impl Cli {
    /// The log level to start with: the flag, else `warn` for the interactive commands
    /// (their output is the table, the progress line or the conversation, not the daemon's
    /// log), else `info`.
    pub fn log_level(&self) -> &str {
        match (&self.log_level, &self.command) {
            (Some(l), _) => l,
            (
                None,
                Some(
                    Command::Demo(_)
                    | Command::Check(_)
                    | Command::RunTask(_)
                    | Command::Verify(_)
                    | Command::Tasks(_)
                    | Command::Show(_)
                    | Command::Status(_),
                ),
            ) => "warn",
            _ => "info",
        }
    }
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
// clap shows a variant's doc comment as help, which turns every `--help` into the long
// layout; the option's own help already says what `text` and `json` are.
#[allow(missing_docs)]
pub enum LogFormat {
    Text,
    Json,
}

/// The subcommands. Without one, `run` is assumed.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (the default): connect to the hub, take tasks, report results.
    ///
    /// Stop with SIGTERM/SIGINT: the first drains (no new tasks, the running one finishes and
    /// its result is delivered), the second cancels the task and keeps it for recovery, the
    /// third exits at once.
    Run(RunArgs),
    /// Validate the config and probe the hub, claude, Ollama, git and the directories.
    ///
    /// Connects and identifies with the configured token (like a short reconnect of this
    /// agent). Exits non-zero when a required item (config, hub, state dir) fails. The token
    /// is never printed.
    Check(CheckArgs),
    /// Run one task offline (no hub): executor, checks, corrective retries; print the result.
    ///
    /// The result is the task_complete/task_failed frame the hub would receive. Exit 0 iff
    /// verified.
    RunTask(RunTaskArgs),
    /// Run only a task's verification steps against a workspace and print the report JSON.
    ///
    /// Exit 0 iff the report is pass, skip or auto_pass.
    Verify(VerifyArgs),
    /// Run the real daemon against an embedded mock hub with a sample task, and print the result.
    Demo(DemoArgs),
    /// List recent tasks from the flight records: when, executor, duration, attempts,
    /// status, cost. Reads only files; works whether the daemon runs or not.
    Tasks(crate::commands::show::TasksArgs),
    /// Tell one task's story from its flight record: each attempt's prompt, what changed,
    /// which checks failed, why the loop stopped, the result and its acknowledgement.
    Show(crate::commands::show::ShowArgs),
    /// Ask the running daemon (on its loopback metrics_addr) for the link state, the
    /// current task and attempt, and today's spend against the daily budget.
    Status(crate::commands::status::StatusArgs),
}

impl Default for Command {
    fn default() -> Self {
        Command::Run(RunArgs::default())
    }
}

/// `run` flags.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    #[command(flatten)]
    /// Where the configuration comes from.
    pub config: ConfigArgs,
}

/// Run the parsed command line.
///
/// `logs` is the log writer from [`init_tracing`]: once a config is loaded its secrets are
/// added, so no log line can carry them.
pub async fn run(cli: Cli, logs: RedactingWriter) -> anyhow::Result<ExitCode> {
    let top = cli.run.config;
    match cli.command.unwrap_or_default() {
        Command::Run(args) => {
            let config = args.config.or(top);
            run_daemon(RunArgs { config }, logs).await
        }
        Command::Check(mut args) => {
            args.config = args.config.or(top);
            crate::commands::check::run(args).await
        }
        Command::RunTask(args) => crate::commands::run_task::run(args).await,
        Command::Verify(args) => crate::commands::verify::run(args).await,
        Command::Demo(args) => crate::demo::run(args).await,
        Command::Tasks(args) => crate::commands::show::run_tasks(args).await,
        Command::Show(args) => crate::commands::show::run_show(args).await,
        Command::Status(args) => crate::commands::status::run(args).await,
    }
}

async fn run_daemon(args: RunArgs, logs: RedactingWriter) -> anyhow::Result<ExitCode> {
    let cfg = args.config.load()?;
    logs.set(Redactor::from_config(&cfg));
    config::warn_about(&cfg);
    tracing::info!(agent_id = %cfg.agent_id, hub = %cfg.hub_url, state = %cfg.state_file().display(), "hub-sidecar starting");
    let shutdown = Shutdown::new();
    let ops = Ops::new();
    // Side services live exactly as long as the daemon: cancelled and awaited on every exit.
    let services = CancellationToken::new();
    let tracker = TaskTracker::new();
    tracker.spawn(stage_signals(shutdown.clone(), services.clone()));
    if let Some(addr) = cfg.metrics_addr {
        crate::ops::http::start(addr, ops.clone(), services.clone(), &tracker).await?;
    }
    // `hub-sidecar status` without metrics_addr; a failure only costs that command.
    let socket = crate::ops::socket::path(&cfg.state_dir);
    if let Err(e) = crate::ops::socket::start(socket, ops.clone(), services.clone(), &tracker).await
    {
        tracing::warn!(error = %format!("{e:#}"), "no status socket: `hub-sidecar status` needs metrics_addr");
    }
    // Fed only while the last pong is younger than two ping intervals.
    tracker.spawn(crate::ops::systemd::watchdog(
        ops.clone(),
        cfg.ping_interval() * 2,
        services.clone(),
    ));
    let result = daemon::run(cfg, shutdown, ops).await;
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

/// Set up tracing: human text or JSON on stderr, secrets scrubbed from every line.
pub fn init_tracing(format: LogFormat, level: &str, secrets: Vec<String>) -> RedactingWriter {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let writer = RedactingWriter::new(Redactor::new(secrets));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer.clone())
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
    writer
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn config_flags_work_without_the_default_run_subcommand() {
        let cli = Cli::try_parse_from(["hub-sidecar", "--config", "f.toml"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.config.config, Some(PathBuf::from("f.toml")));
        let cli = Cli::try_parse_from(["hub-sidecar", "run", "-c", "g.toml"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Run(ref r)) if r.config.config == Some(PathBuf::from("g.toml")))
        );
        assert!(Cli::try_parse_from(["hub-sidecar", "check", "--config", "f.toml"]).is_ok());
        // Global flags still go before a subcommand; run flags there fill in for it.
        let cli = Cli::try_parse_from([
            "hub-sidecar",
            "--log-format",
            "json",
            "--config",
            "h.toml",
            "check",
        ])
        .unwrap();
        let Some(Command::Check(args)) = cli.command else {
            panic!("check expected")
        };
        let merged = args.config.or(cli.run.config);
        assert_eq!(merged.config, Some(PathBuf::from("h.toml")));
    }
}
