//! The command line: the clap types of every subcommand and nothing else.
//!
//! Raw flags live here; [`crate::config::Config::load`] turns them (with the file and the
//! environment) into the validated configuration, once ([`ConfigArgs::load`]). What each
//! subcommand does is in [`crate::commands`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, Config, Layers};

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
    Tasks(TasksArgs),
    /// Tell one task's story from its flight record: each attempt's prompt, what changed,
    /// which checks failed, why the loop stopped, the result and its acknowledgement.
    Show(ShowArgs),
    /// Ask the running daemon (on its loopback metrics_addr) for the link state, the
    /// current task and attempt, and today's spend against the daily budget.
    Status(StatusArgs),
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

/// `check` flags.
#[derive(Debug, Clone, Default, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    /// Where the configuration comes from.
    pub config: ConfigArgs,
}

/// `run-task` flags.
#[derive(Debug, Clone, Args)]
pub struct RunTaskArgs {
    /// The task file: a task object or a task_assign frame (see examples/tasks/).
    pub task: PathBuf,
    /// Run in this directory (default: a new temporary directory, kept and printed).
    #[arg(long, short = 'w')]
    pub workspace: Option<PathBuf>,
    /// Write the result frame here instead of stdout.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Config for executor, verification and env settings (defaults otherwise; the hub keys
    /// are not needed).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
}

/// `verify` flags.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The task file (a task object or a task_assign frame) whose verification_steps run.
    pub task: PathBuf,
    /// The directory the checks run in.
    #[arg(long, short = 'w')]
    pub workspace: PathBuf,
    /// Optional config for [verification] and [env] settings (defaults otherwise).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// What `llm_judge` sees as "changed" in a git work tree: the work since this revision
    /// (its commits and what is uncommitted). Default: the merge base of HEAD with the
    /// default branch (origin's HEAD, else main or master), so a task branch's committed
    /// work is judged. The base used is printed on stderr.
    #[arg(long, value_name = "REV")]
    pub base: Option<String>,
}

/// `tasks` flags.
#[derive(Debug, Clone, Args)]
pub struct TasksArgs {
    #[command(flatten)]
    /// Where the configuration (and so the state directory) comes from.
    pub config: ConfigArgs,
    /// How many tasks to list, newest first.
    #[arg(long, short = 'n', default_value_t = 20)]
    pub limit: usize,
    /// Print JSON (one array) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `show` flags.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The task id (as in `hub-sidecar tasks`).
    pub task_id: String,
    #[command(flatten)]
    /// Where the configuration (and so the state directory) comes from.
    pub config: ConfigArgs,
    /// Print the whole story as JSON (for tools) instead of the timeline.
    #[arg(long)]
    pub json: bool,
    /// Also print each attempt's prompt and recorded output in full.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// `status` flags.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    /// Where the configuration (and so the daemon's addresses) comes from.
    pub config: ConfigArgs,
    /// Print the daemon's JSON answer as is.
    #[arg(long)]
    pub json: bool,
}

/// `demo` flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DemoArgs {
    /// Keep the demo's temporary directory and print where it is.
    #[arg(long)]
    pub keep: bool,
}

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

    /// [`ConfigArgs::load`] for commands that only read local state (`tasks`, `show`): they
    /// never talk to the hub, so a file without `agent_id`, `token` or `hub_url` still
    /// loads (placeholders fill what is missing); any other error is the file's own.
    pub fn load_for_reading(&self) -> Result<Config, config::ConfigError> {
        let first = match self.load() {
            Ok(cfg) => return Ok(cfg),
            Err(e) => e,
        };
        let mut filled = self.clone();
        filled.agent_id.get_or_insert_with(|| "reading-only".into());
        filled.token.get_or_insert_with(|| "reading-only".into());
        filled
            .hub_url
            .get_or_insert_with(|| "ws://127.0.0.1:9/ws".into());
        filled.load().map_err(|_| first)
    }
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
