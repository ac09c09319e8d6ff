//! The offline and diagnostic subcommands: one file per verb.
//!
//! # Layout
//!
//! - [`check`]: `hub-sidecar check`: validate the config and probe everything it points at.
//! - [`run_task`]: `hub-sidecar run-task`: one task, no hub: executor, checks, retry loop.
//! - [`verify`]: `hub-sidecar verify`: only a task's checks against a workspace.
//! - [`show`]: `hub-sidecar tasks` and `hub-sidecar show`: the flight records, read back.
//! - [`status`]: `hub-sidecar status`: ask the running daemon how it is doing.
//!
//! `run` (the daemon) and `demo` live in [`crate::cli`] and [`crate::demo`].

pub mod check;
pub mod run_task;
pub mod show;
pub mod status;
pub mod verify;

use std::path::Path;

use anyhow::Context;

use crate::task::Task;

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
