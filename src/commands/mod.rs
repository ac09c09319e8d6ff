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

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::config::{self, Config, Layers};
use crate::task::Task;

/// Settings shared by commands that load a config.
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    /// Config file: TOML, or the Node sidecar's config.json.
    #[arg(long, short = 'c', env = "HUB_SIDECAR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`.
    #[arg(long, hide = true)]
    pub token: Option<String>,
    /// Hub WebSocket URL, e.g. ws://hub:4000/ws.
    #[arg(long)]
    pub hub_url: Option<String>,
    /// State directory (state file, workspaces).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Workspace for tasks without a repository.
    #[arg(long)]
    pub repo_dir: Option<PathBuf>,
    /// Serve /healthz and /metrics here, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics_addr: Option<String>,
}

impl ConfigArgs {
    /// Each flag from `self`, else from `fallback` (flags given before the subcommand).
    pub fn or(self, fallback: ConfigArgs) -> ConfigArgs {
        ConfigArgs {
            config: self.config.or(fallback.config),
            agent_id: self.agent_id.or(fallback.agent_id),
            token: self.token.or(fallback.token),
            hub_url: self.hub_url.or(fallback.hub_url),
            state_dir: self.state_dir.or(fallback.state_dir),
            repo_dir: self.repo_dir.or(fallback.repo_dir),
            metrics_addr: self.metrics_addr.or(fallback.metrics_addr),
        }
    }

    /// Load and validate the configuration from file, environment and these flags.
    pub fn load(&self) -> Result<Config, config::ConfigError> {
        let mut flags = Vec::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                flags.push((k.to_string(), v));
            }
        };
        put("agent_id", self.agent_id.clone());
        put("token", self.token.clone());
        put("hub_url", self.hub_url.clone());
        put(
            "state_dir",
            self.state_dir.as_ref().map(|p| p.display().to_string()),
        );
        put(
            "repo_dir",
            self.repo_dir.as_ref().map(|p| p.display().to_string()),
        );
        put("metrics_addr", self.metrics_addr.clone());
        Config::load(&Layers::from_process(self.config.clone(), flags))
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
