//! Configuration: raw layers (file, environment, flags) merged into one validated [`Config`].
//!
//! Precedence is flags > env (`HUB_SIDECAR_*`) > file > defaults. The file is TOML, or the
//! Node sidecar's `config.json` (same key names), chosen by extension. All layers are merged
//! as a JSON tree first and deserialized once, so every key has one definition: the field
//! of [`Config`] or of its sections.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

/// Why the configuration cannot be used. Each message names the key and the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid {format}: {message}")]
    Parse {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error("required config key `{key}` is missing (looked in {origin}); set it in the file, as HUB_SIDECAR_{env} or with --{flag}")]
    Missing {
        key: &'static str,
        env: String,
        flag: String,
        origin: String,
    },
    #[error("config key `{key}` is invalid ({origin}): {message}")]
    Invalid {
        key: String,
        origin: String,
        message: String,
    },
}

/// The validated configuration the daemon runs with.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// This agent's id at the hub (≤ 128 chars).
    pub agent_id: String,
    /// Hub token. Never printed: see the `Debug` impl.
    pub token: String,
    /// `ws://host:4000/ws` or `wss://…`.
    pub hub_url: String,
    /// Display name sent with `identify` (defaults to `agent_id`).
    pub name: Option<String>,
    pub capabilities: Vec<String>,
    /// Local Ollama, announced in `identify` and used when a task names no endpoint.
    pub ollama_url: Option<String>,
    /// Workspace for tasks without a `repo`.
    pub repo_dir: Option<PathBuf>,
    /// Where state, outbox and workspaces live.
    pub state_dir: PathBuf,
    /// State file; default `state_dir/queue.json`.
    pub state_file: Option<PathBuf>,
    /// Extra CA bundle (PEM) trusted for `wss://`, on top of the system roots.
    pub ca_file: Option<PathBuf>,
    pub ping_interval_secs: u64,
    pub pong_timeout_secs: u64,
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    pub resource_report_interval_secs: u64,
    /// Inbound frames larger than this are refused (and the link reset).
    pub max_frame_bytes: usize,
    /// How long a graceful stop waits for the running task.
    pub drain_timeout_secs: u64,
    /// Most results kept waiting for the hub's acknowledgement; past it the oldest is dropped.
    pub outbox_max_entries: usize,
    /// A result the hub has not acknowledged after this long is dropped.
    pub outbox_expiry_secs: u64,
    /// `127.0.0.1:9090` to serve `/healthz` and `/metrics`; off when unset.
    pub metrics_addr: Option<SocketAddr>,
    /// More secret values to redact from everything that leaves the process.
    pub secrets: Vec<String>,
    pub progress: ProgressConfig,
    pub executor: ExecutorConfig,
    pub verification: VerificationConfig,
    pub env: EnvConfig,
    pub git: GitConfig,
    /// How hard tasks are confined; unset: strict where the kernel supports it.
    pub containment: Option<Containment>,
    /// Paths and limits of containment.
    pub sandbox: SandboxConfig,
    /// `[recorder]`: the per-task flight record under `state_dir/tasks`.
    pub recorder: RecorderConfig,
    /// Keys this build does not know (e.g. the Node sidecar's `wake_command`): warned, ignored.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
    /// Where the file layer came from, for messages.
    #[serde(skip)]
    pub origin: Option<PathBuf>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("agent_id", &self.agent_id)
            .field("token", &"[REDACTED]")
            .field("hub_url", &self.hub_url)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            agent_id: String::new(),
            token: String::new(),
            hub_url: String::new(),
            name: None,
            capabilities: Vec::new(),
            ollama_url: None,
            repo_dir: None,
            state_dir: PathBuf::from("/var/lib/hub-sidecar"),
            state_file: None,
            ca_file: None,
            ping_interval_secs: 30,
            pong_timeout_secs: 10,
            reconnect_min_ms: 1_000,
            reconnect_max_ms: 60_000,
            resource_report_interval_secs: 30,
            max_frame_bytes: 16 * 1024 * 1024,
            drain_timeout_secs: 30 * 60,
            outbox_max_entries: 10_000,
            // Covers a hub down over a weekend; the hub re-queued such a task long ago.
            outbox_expiry_secs: 3 * 24 * 3600,
            metrics_addr: None,
            secrets: Vec::new(),
            progress: ProgressConfig::default(),
            executor: ExecutorConfig::default(),
            verification: VerificationConfig::default(),
            env: EnvConfig::default(),
            git: GitConfig::default(),
            containment: None,
            sandbox: SandboxConfig::default(),
            recorder: RecorderConfig::default(),
            unknown: BTreeMap::new(),
            origin: None,
        }
    }
}

/// `[progress]`: coalescing of `task_progress` under the hub's shared "normal" budget.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ProgressConfig {
    /// Bucket size, as the hub's (60).
    pub capacity: u32,
    /// Refill per minute, as the hub's (60).
    pub refill_per_minute: u32,
    /// Tokens progress may never use: kept for accepted/complete/failed frames.
    pub reserve: u32,
    /// Minimum gap between two progress frames.
    pub min_interval_ms: u64,
    /// Cap on one frame's text (tail kept).
    pub max_text_bytes: usize,
    /// A quiet task still sends a progress frame this often (hub stale-task sweep).
    pub heartbeat_secs: u64,
}

impl Default for ProgressConfig {
    fn default() -> Self {
        ProgressConfig {
            capacity: 60,
            refill_per_minute: 60,
            reserve: 12,
            min_interval_ms: 1_500,
            max_text_bytes: 8 * 1024,
            heartbeat_secs: 45,
        }
    }
}

/// `[recorder]`: the flight record each task leaves under `state_dir/tasks/<task id>/`
/// (read with `hub-sidecar tasks` / `show`). Retention removes the oldest records first.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct RecorderConfig {
    /// Record tasks at all.
    pub enabled: bool,
    /// Most task records kept.
    pub max_tasks: usize,
    /// Most bytes all task records may take together.
    pub max_total_bytes: u64,
    /// Most bytes of streamed output and events one task's record keeps (its prompts,
    /// reports, decisions and result are always kept, each string capped at 32 KiB).
    pub max_task_bytes: u64,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            enabled: true,
            max_tasks: 500,
            max_total_bytes: 256 * 1024 * 1024,
            max_task_bytes: 4 * 1024 * 1024,
        }
    }
}

/// `[executor]`: how tasks are run.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ExecutorConfig {
    /// Path to `claude`; found on PATH when unset.
    pub claude_path: Option<PathBuf>,
    /// Model passed to `claude --model` when the task names none.
    pub claude_model: String,
    /// Extra CLI args (a bypass permission mode is refused).
    pub claude_extra_args: Vec<String>,
    /// Tools allowed beyond what `--permission-mode acceptEdits` allows, passed as
    /// `--allowedTools`, e.g. `["Bash(cargo:*)", "Bash(git diff:*)"]`.
    pub claude_allowed_tools: Vec<String>,
    /// `--max-turns` of one claude run.
    pub claude_max_turns: u32,
    /// `CLAUDE_CODE_MAX_RETRIES` in claude's env: the CLI's own retries of 429/5xx/network.
    pub claude_api_max_retries: u32,
    /// Kill a claude run whose stdout stays silent this long.
    pub claude_idle_timeout_secs: u64,
    /// After the `result` line, how long claude may take to exit before it is stopped.
    pub claude_result_grace_ms: u64,
    /// Model for Ollama when the routing decision names none.
    /// `options.num_ctx` of every Ollama call: the context window the model gets. Ollama
    /// silently cuts the beginning of a longer prompt, so it is set explicitly and a prompt
    /// that fills it is reported.
    pub ollama_num_ctx: u32,
    /// Let the agentic Ollama loop use a plain `http://` endpoint on another host. Off: tool
    /// calls come from whoever answers on the network path, so only loopback or `https://`.
    pub ollama_allow_insecure_remote: bool,
    pub ollama_model: String,
    /// Per-HTTP-call timeout for Ollama.
    pub ollama_timeout_secs: u64,
    /// Shell default timeout when `metadata.timeout_ms` is absent.
    pub shell_timeout_ms: u64,
    /// Re-runs of a shell command that exited non-zero (not on timeout or cancel).
    pub shell_retries: u32,
    /// Execution timeout for trivial tasks (LLM executors).
    pub trivial_timeout_secs: u64,
    /// Execution timeout for standard and complex tasks (LLM executors).
    pub standard_timeout_secs: u64,
    /// SIGTERM → SIGKILL grace for a process group.
    pub kill_grace_ms: u64,
    /// Captured output kept per execution (head and tail).
    pub output_cap_bytes: usize,
    /// Retry delays for a failed `claude` process (ms).
    pub claude_retry_delays_ms: Vec<u64>,
    /// Retries of a failed Ollama HTTP call.
    pub ollama_retries: u32,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            claude_path: None,
            claude_model: "claude-sonnet-4-5".into(),
            claude_extra_args: Vec::new(),
            claude_allowed_tools: Vec::new(),
            claude_max_turns: 50,
            claude_api_max_retries: 4,
            claude_idle_timeout_secs: 300,
            claude_result_grace_ms: 2_000,
            ollama_model: "qwen3:8b".into(),
            ollama_num_ctx: 16_384,
            ollama_allow_insecure_remote: false,
            ollama_timeout_secs: 120,
            shell_timeout_ms: 60_000,
            shell_retries: 1,
            trivial_timeout_secs: 600,
            standard_timeout_secs: 1_800,
            kill_grace_ms: 5_000,
            output_cap_bytes: 1024 * 1024,
            claude_retry_delays_ms: vec![2_000, 4_000, 8_000],
            ollama_retries: 2,
        }
    }
}

/// The daily cost cap when the config sets none (USD).
pub const DEFAULT_MAX_COST_USD_PER_DAY: f64 = 20.0;
/// Corrective retries allowed when the config sets no ceiling.
pub const DEFAULT_RETRY_CEILING: u32 = 3;

/// `[verification]`: checks and the corrective-retry loop.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct VerificationConfig {
    /// Global deadline of one verification run when the task gives none.
    pub timeout_ms: u64,
    /// Corrective retries for `run-task` when the task file gives none. Hub tasks always
    /// carry the hub's own value (5 when the submitter gave none), which wins.
    pub default_max_retries: u32,
    /// Re-run a failed command check once before blaming the LLM.
    pub flaky_rerun: bool,
    /// Captured output kept per check.
    pub check_output_cap_bytes: usize,
    /// Per-task cost cap (USD) when the task gives none.
    pub max_cost_usd_per_task: Option<f64>,
    /// Daily cost cap (USD, UTC day) for this daemon, persisted across restarts.
    /// On by default ([`DEFAULT_MAX_COST_USD_PER_DAY`]).
    pub max_cost_usd_per_day: Option<f64>,
    /// Local ceiling on corrective retries, whatever the task asks (the hub fills in 5).
    pub retry_ceiling: u32,
    /// `ollama` or `claude`: who answers `llm_judge` checks.
    pub judge_backend: String,
    pub judge_model: Option<String>,
    /// `llm_judge` passes only at or above this confidence.
    pub judge_min_confidence: f64,
}

impl Default for VerificationConfig {
    fn default() -> Self {
        VerificationConfig {
            timeout_ms: 120_000,
            default_max_retries: 0,
            flaky_rerun: true,
            check_output_cap_bytes: 64 * 1024,
            max_cost_usd_per_task: None,
            max_cost_usd_per_day: Some(DEFAULT_MAX_COST_USD_PER_DAY),
            retry_ceiling: DEFAULT_RETRY_CEILING,
            judge_backend: "ollama".into(),
            judge_model: None,
            judge_min_confidence: 0.85,
        }
    }
}

/// How hard the daemon confines what tasks run (`containment` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Containment {
    /// Every layer or no task: a task that cannot be confined fully is refused.
    Strict,
    /// Every layer the kernel supports; the missing ones are logged once at start.
    BestEffort,
    /// No confinement beyond process groups and environment scrubbing.
    Off,
}

/// `[sandbox]`: the paths and limits of containment.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct SandboxConfig {
    /// More trees children may read (and execute), e.g. a toolchain outside PATH.
    pub read_paths: Vec<PathBuf>,
    /// More trees children may write, e.g. a shared build cache. Each one widens what a
    /// hostile agent can change: keep it short.
    pub write_paths: Vec<PathBuf>,
    /// Private writable memory per process (RLIMIT_DATA), MiB; 0: no limit.
    pub max_memory_mb: u64,
    /// Processes and threads of the service user (RLIMIT_NPROC); 0: no limit.
    pub max_processes: u64,
    /// Largest file a child may write (RLIMIT_FSIZE), MiB; 0: no limit.
    pub max_file_size_mb: u64,
    /// Open files per process (RLIMIT_NOFILE); 0: no limit.
    pub max_open_files: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            max_memory_mb: 8 * 1024,
            max_processes: 4096,
            max_file_size_mb: 4 * 1024,
            max_open_files: 4096,
        }
    }
}

/// `[env]`: what child processes inherit.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct EnvConfig {
    /// When non-empty, only these variables pass to children (plus PATH, HOME, LANG, TERM).
    pub allow: Vec<String>,
    /// Never passed to children (on top of the daemon's own `HUB_SIDECAR_*`).
    pub deny: Vec<String>,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            allow: Vec::new(),
            deny: vec!["AWS_SECRET_ACCESS_KEY".into(), "GITHUB_TOKEN".into()],
        }
    }
}

/// `[git]`: managed workspaces and the branch → commit → push → pull request workflow.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct GitConfig {
    /// Branch, commit, push and open a PR when the workspace is a git repo with a remote.
    pub enabled: bool,
    /// Commit author name (passed as `-c user.name=`, so no global git config is needed).
    pub author_name: String,
    /// Commit author email.
    pub author_email: String,
    /// Push `partial_pass` work too, as a draft pull request.
    pub push_drafts: bool,
    /// GitHub user or team asked to review every pull request (`gh pr create --reviewer`).
    pub reviewer: Option<String>,
    /// Bound on network git calls: clone, fetch, push (seconds).
    pub clone_timeout_secs: u64,
    /// Bound on local git calls and `gh` (seconds).
    pub command_timeout_secs: u64,
    /// Path to `gh`; found on the child PATH when unset. No `gh`: no pull request.
    pub gh_path: Option<PathBuf>,
    /// Hub HTTP API for risk classification; default derived from `hub_url`
    /// (`ws` → `http`, `wss` → `https`, path dropped).
    pub hub_api_url: Option<String>,
    /// Warm caches: paths relative to a managed clone's root (`"target/"`,
    /// `"node_modules/"`) that the clean before each task keeps. Empty by default. Risk: what
    /// one task left there (a build artefact, a poisoned cache) reaches the next task on the
    /// same clone and can decide whether it verifies.
    pub warm_cache: Vec<String>,
}

impl Default for GitConfig {
    fn default() -> Self {
        GitConfig {
            enabled: true,
            author_name: "hub-sidecar".into(),
            author_email: "hub-sidecar@localhost".into(),
            push_drafts: false,
            reviewer: None,
            clone_timeout_secs: 300,
            command_timeout_secs: 120,
            gh_path: None,
            hub_api_url: None,
            warm_cache: Vec::new(),
        }
    }
}

/// Keys whose env/flag values are always strings, even when they look like numbers.
const STRING_KEYS: &[&str] = &[
    "agent_id",
    "token",
    "hub_url",
    "name",
    "ollama_url",
    "repo_dir",
    "state_dir",
    "state_file",
    "ca_file",
    "metrics_addr",
];

/// The layers before merging: what the CLI hands over.
#[derive(Debug, Default, Clone)]
pub struct Layers {
    /// `--config FILE`.
    pub file: Option<PathBuf>,
    /// Process environment (only `HUB_SIDECAR_*` is read).
    pub env: Vec<(String, String)>,
    /// Flag values by config key (e.g. `("hub_url", "ws://…")`).
    pub flags: Vec<(String, String)>,
}

impl Layers {
    /// The layers from this process's environment plus the given file and flags.
    pub fn from_process(file: Option<PathBuf>, flags: Vec<(String, String)>) -> Layers {
        Layers {
            file,
            env: std::env::vars().collect(),
            flags,
        }
    }
}

impl Config {
    /// Merge the layers and validate. The one place a `Config` is made from user input.
    pub fn load(layers: &Layers) -> Result<Config, ConfigError> {
        let mut tree = Map::new();
        if let Some(path) = &layers.file {
            if let Value::Object(m) = read_file(path)? {
                tree = m;
            }
        }
        for (k, v) in &layers.env {
            let Some(key) = k.strip_prefix("HUB_SIDECAR_") else {
                continue;
            };
            // HUB_SIDECAR_EXECUTOR__CLAUDE_PATH → [executor] claude_path
            let path: Vec<String> = key.split("__").map(|p| p.to_ascii_lowercase()).collect();
            insert_path(&mut tree, &path, v);
        }
        for (k, v) in &layers.flags {
            let path: Vec<String> = k.split('.').map(str::to_string).collect();
            insert_path(&mut tree, &path, v);
        }
        let origin = describe_origin(layers.file.as_deref());
        let mut cfg: Config =
            serde_json::from_value(Value::Object(tree)).map_err(|e| ConfigError::Invalid {
                key: "(file)".into(),
                origin: origin.clone(),
                message: e.to_string(),
            })?;
        cfg.origin = layers.file.clone();
        cfg.validate(&origin)?;
        Ok(cfg)
    }

    fn validate(&mut self, origin: &str) -> Result<(), ConfigError> {
        for (key, value) in [
            ("agent_id", &self.agent_id),
            ("token", &self.token),
            ("hub_url", &self.hub_url),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::Missing {
                    key,
                    env: key.to_ascii_uppercase(),
                    flag: key.replace('_', "-"),
                    origin: origin.to_string(),
                });
            }
        }
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            key: key.to_string(),
            origin: origin.to_string(),
            message,
        };
        if self.agent_id.chars().count() > 128 {
            return Err(invalid(
                "agent_id",
                "longer than the hub's 128 characters".into(),
            ));
        }
        if self.token.chars().count() > 256 {
            return Err(invalid(
                "token",
                "longer than the hub's 256 characters".into(),
            ));
        }
        if !(self.hub_url.starts_with("ws://") || self.hub_url.starts_with("wss://")) {
            return Err(invalid(
                "hub_url",
                format!("`{}` must start with ws:// or wss://", self.hub_url),
            ));
        }
        if self.ping_interval_secs == 0 || self.ping_interval_secs >= 55 {
            return Err(invalid(
                "ping_interval_secs",
                "must be 1..54: the hub closes a socket silent for 60 s".into(),
            ));
        }
        if self.reconnect_min_ms == 0 || self.reconnect_min_ms > self.reconnect_max_ms {
            return Err(invalid(
                "reconnect_min_ms",
                "must be > 0 and ≤ reconnect_max_ms".into(),
            ));
        }
        if self.progress.refill_per_minute == 0 {
            return Err(invalid(
                "progress.refill_per_minute",
                "must be at least 1: with no refill the hub link would wait forever for a token (the hub refills 60 a minute)".into(),
            ));
        }
        if self.progress.reserve >= self.progress.capacity {
            return Err(invalid(
                "progress.reserve",
                "must be below progress.capacity".into(),
            ));
        }
        if let Some(bad) = bypass_flag(&self.executor.claude_extra_args) {
            return Err(invalid(
                "executor.claude_extra_args",
                format!("`{bad}` bypasses claude's permission checks for repository-controlled work (and claude refuses it as root); allow specific tools in executor.claude_allowed_tools instead"),
            ));
        }
        if self.ollama_url.as_deref() == Some("") {
            self.ollama_url = None;
        }
        Ok(())
    }

    /// The state file path.
    pub fn state_file(&self) -> PathBuf {
        self.state_file
            .clone()
            .unwrap_or_else(|| self.state_dir.join("queue.json"))
    }

    pub fn ping_interval(&self) -> Duration {
        Duration::from_secs(self.ping_interval_secs)
    }

    pub fn pong_timeout(&self) -> Duration {
        Duration::from_secs(self.pong_timeout_secs)
    }

    /// The hub's HTTP API base (no trailing slash): `git.hub_api_url`, else `hub_url` with
    /// `ws` → `http`, `wss` → `https` and the path dropped.
    pub fn hub_api_url(&self) -> String {
        if let Some(u) = self.git.hub_api_url.as_deref().filter(|u| !u.is_empty()) {
            return u.trim_end_matches('/').to_string();
        }
        let (scheme, rest) = match self.hub_url.split_once("://") {
            Some(("wss", rest)) => ("https", rest),
            Some((_, rest)) => ("http", rest),
            None => ("http", self.hub_url.as_str()),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        format!("{scheme}://{authority}")
    }

    /// Every secret value to scrub from output: the token and `secrets`.
    pub fn secret_values(&self) -> Vec<String> {
        let mut v = vec![self.token.clone()];
        v.extend(self.secrets.iter().cloned());
        v
    }

    /// A config for tests and the demo: required keys set, everything else default.
    pub fn for_hub(hub_url: &str, state_dir: &Path) -> Config {
        Config {
            agent_id: "sidecar-test".into(),
            token: "test-token".into(),
            hub_url: hub_url.into(),
            state_dir: state_dir.to_path_buf(),
            ..Config::default()
        }
    }
}

fn describe_origin(file: Option<&Path>) -> String {
    match file {
        Some(p) => format!(
            "config file {}, HUB_SIDECAR_* environment, flags",
            p.display()
        ),
        None => "HUB_SIDECAR_* environment and flags (no --config file given)".into(),
    }
}

fn read_file(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    if is_json {
        serde_json::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            format: "JSON",
            message: e.to_string(),
        })
    } else {
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            format: "TOML",
            message: e.message().to_string(),
        })
    }
}

/// Put a string from env or a flag at `path`, typed by what it looks like.
fn insert_path(tree: &mut Map<String, Value>, path: &[String], raw: &str) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = tree;
    for p in parents {
        let entry = node
            .entry(p.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        node = entry.as_object_mut().expect("just made an object");
    }
    let value = if parents.is_empty() && STRING_KEYS.contains(&last.as_str()) {
        Value::String(raw.to_string())
    } else {
        serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
    };
    node.insert(last.clone(), value);
}

/// Warn about config keys this build does not use, and about a config file others can read.
pub fn warn_about(cfg: &Config) {
    for key in cfg.unknown.keys() {
        tracing::warn!(key = %key, file = ?cfg.origin, "unknown config key ignored");
    }
    #[cfg(unix)]
    if let Some(path) = &cfg.origin {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    "config file holds the hub token but is readable by group/others; fix with: chmod 600 {}",
                    path.display()
                );
            }
        }
    }
}

/// The first argument of `args` that would switch claude's permission checks off.
fn bypass_flag(args: &[String]) -> Option<String> {
    let mut prev = "";
    for a in args {
        let a_l = a.to_ascii_lowercase();
        if a_l.contains("dangerously-skip-permissions")
            || a_l == "--permission-mode=bypasspermissions"
            || (prev == "--permission-mode" && a_l == "bypasspermissions")
        {
            return Some(a.clone());
        }
        prev = a.as_str();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(file: Option<PathBuf>, env: &[(&str, &str)], flags: &[(&str, &str)]) -> Layers {
        Layers {
            file,
            env: env
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            flags: flags
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        }
    }

    #[test]
    fn precedence_is_flags_over_env_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(
            &f,
            "agent_id = \"file\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\nping_interval_secs = 20\n[executor]\nclaude_model = \"m\"\n",
        )
        .unwrap();
        let c = Config::load(&layers(Some(f.clone()), &[], &[])).unwrap();
        assert_eq!(c.agent_id, "file");
        assert_eq!(c.ping_interval_secs, 20);
        assert_eq!(c.executor.claude_model, "m");
        let c = Config::load(&layers(
            Some(f.clone()),
            &[
                ("HUB_SIDECAR_AGENT_ID", "env"),
                ("HUB_SIDECAR_EXECUTOR__CLAUDE_MODEL", "e"),
            ],
            &[],
        ))
        .unwrap();
        assert_eq!(c.agent_id, "env");
        assert_eq!(c.executor.claude_model, "e");
        let c = Config::load(&layers(
            Some(f),
            &[("HUB_SIDECAR_AGENT_ID", "env")],
            &[("agent_id", "flag")],
        ))
        .unwrap();
        assert_eq!(c.agent_id, "flag");
    }

    #[test]
    fn node_config_json_is_accepted_and_numeric_token_stays_a_string() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config.json");
        std::fs::write(
            &f,
            r#"{"agent_id":"a","token":"x","hub_url":"ws://h:4000/ws","capabilities":["code"],"wake_command":"echo","repo_dir":"/tmp"}"#,
        )
        .unwrap();
        let c = Config::load(&layers(Some(f), &[("HUB_SIDECAR_TOKEN", "12345")], &[])).unwrap();
        assert_eq!(c.token, "12345");
        assert_eq!(c.capabilities, vec!["code"]);
        assert!(c.unknown.contains_key("wake_command"));
    }

    #[test]
    fn missing_key_names_key_and_file_and_never_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "agent_id = \"a\"\ntoken = \"tok-UNIQUE-99\"\n").unwrap();
        let e = Config::load(&layers(Some(f.clone()), &[], &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hub_url"), "{e}");
        assert!(e.contains(&f.display().to_string()), "{e}");
        assert!(!e.contains("tok-UNIQUE-99"));
        let e = Config::load(&layers(Some(f), &[], &[("hub_url", "http://x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ws://"), "{e}");
    }

    #[test]
    fn hub_api_url_is_derived_from_hub_url_unless_set() {
        let mut c = Config::for_hub("wss://hub.example:4000/ws?x=1", Path::new("/tmp"));
        assert_eq!(c.hub_api_url(), "https://hub.example:4000");
        c.hub_url = "ws://127.0.0.1:4000/ws".into();
        assert_eq!(c.hub_api_url(), "http://127.0.0.1:4000");
        c.git.hub_api_url = Some("http://api:9/".into());
        assert_eq!(c.hub_api_url(), "http://api:9");
        assert!(c.git.enabled && !c.git.push_drafts);
        assert_eq!(c.git.clone_timeout_secs, 300);
    }

    #[test]
    fn example_config_loads_and_documents_the_git_section() {
        let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/hub-sidecar.example.toml");
        let c = Config::load(&layers(Some(f.clone()), &[], &[])).unwrap();
        assert!(c.unknown.is_empty(), "{:?}", c.unknown.keys());
        let text = std::fs::read_to_string(f).unwrap();
        for key in [
            "enabled",
            "author_name",
            "author_email",
            "push_drafts",
            "reviewer",
            "clone_timeout_secs",
            "command_timeout_secs",
            "gh_path",
            "hub_api_url",
        ] {
            assert!(
                text.contains(&format!("{key} =")),
                "[git] {key} undocumented"
            );
        }
        assert_eq!(c.hub_api_url(), "https://hub.example.internal:4000");
    }

    #[test]
    fn debug_hides_token() {
        let c = Config::for_hub("ws://x/ws", Path::new("/tmp"));
        assert!(!format!("{c:?}").contains("test-token"));
    }

    #[test]
    fn a_bypass_permission_mode_in_claude_extra_args_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        for extra in [
            r#"["--dangerously-skip-permissions"]"#,
            r#"["--allow-dangerously-skip-permissions"]"#,
            r#"["--permission-mode", "bypassPermissions"]"#,
            r#"["--permission-mode=bypassPermissions"]"#,
        ] {
            std::fs::write(
                &f,
                format!("agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n[executor]\nclaude_extra_args = {extra}\n"),
            )
            .unwrap();
            let e = Config::load(&layers(Some(f.clone()), &[], &[]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("claude_extra_args") && e.contains("claude_allowed_tools"),
                "{e}"
            );
        }
        std::fs::write(
            &f,
            "agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n[executor]\nclaude_extra_args = [\"--permission-mode\", \"plan\"]\n",
        )
        .unwrap();
        assert!(Config::load(&layers(Some(f), &[], &[])).is_ok());
    }

    #[test]
    fn a_zero_refill_rate_is_refused_with_the_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(
            &f,
            "agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\n[progress]\nrefill_per_minute = 0\n",
        )
        .unwrap();
        let e = Config::load(&layers(Some(f), &[], &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("progress.refill_per_minute") && e.contains("at least 1"),
            "{e}"
        );
    }

    #[test]
    fn log_level_is_not_a_config_key_and_is_reported_as_unknown() {
        // The log level is set before any config is read: `--log-level` or RUST_LOG.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(
            &f,
            "agent_id = \"a\"\ntoken = \"t\"\nhub_url = \"ws://h/ws\"\nlog_level = \"debug\"\n",
        )
        .unwrap();
        let c = Config::load(&layers(Some(f), &[], &[])).unwrap();
        assert!(
            c.unknown.contains_key("log_level"),
            "{:?}",
            c.unknown.keys()
        );
    }
}
