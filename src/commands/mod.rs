//! Every subcommand, one file per verb, and the dispatch from the parsed command line.
//!
//! # Layout
//!
//! - [`run`]: `hub-sidecar run` (the default): the daemon and its staged stop.
//! - [`demo`]: `hub-sidecar demo`: the real daemon against an embedded mock hub.
//! - [`check`]: `hub-sidecar check`: validate the config and probe everything it points at.
//! - [`run_task`]: `hub-sidecar run-task`: one task, no hub: executor, checks, retry loop.
//! - [`verify`]: `hub-sidecar verify`: only a task's checks against a workspace.
//! - [`show`]: `hub-sidecar tasks` and `hub-sidecar show`: the flight records, read back.
//! - [`status`]: `hub-sidecar status`: ask the running daemon how it is doing.
//!
//! The flags of each are clap types in [`crate::cli`].

pub mod check;
pub mod demo;
pub mod run;
pub mod run_task;
pub mod show;
pub mod status;
pub mod verify;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::{Cli, Command, RunArgs};
use crate::redact::RedactingWriter;
use crate::task::Task;

/// Run the parsed command line.
///
/// `logs` is the log writer from [`init_tracing`]: once a config is loaded its secrets are
/// added, so no log line can carry them.
pub async fn run(cli: Cli, logs: RedactingWriter) -> anyhow::Result<ExitCode> {
    let top = cli.run.config;
    match cli.command.unwrap_or_default() {
        Command::Run(args) => {
            let config = args.config.or(top);
            run::run(RunArgs { config }, logs).await
        }
        Command::Check(mut args) => {
            args.config = args.config.or(top);
            check::run(args).await
        }
        Command::RunTask(args) => run_task::run(args).await,
        Command::Verify(args) => verify::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Tasks(args) => show::run_tasks(args).await,
        Command::Show(args) => show::run_show(args).await,
        Command::Status(args) => status::run(args).await,
    }
}

/// Read a task file: a bare task object or a whole `task_assign` frame.
pub async fn read_task(path: &Path) -> anyhow::Result<Task> {
    let text = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("reading the task file {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "the task file {} is not valid JSON; see examples/tasks/ for the format",
            path.display()
        )
    })?;
    Task::from_value(value).with_context(|| {
        format!(
            "the task file {} is not a task (it needs at least a string task_id); see examples/tasks/",
            path.display()
        )
    })
}
