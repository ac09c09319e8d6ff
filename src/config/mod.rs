//! Configuration in two layers: `raw` is what the file (TOML, or the Node sidecar's
//! `config.json`), the `HUB_SIDECAR_*` environment and the flags say, every key optional;
//! `validate` turns it into the [`Config`] the rest of the crate reads, with defaults filled
//! in, URLs and enums parsed and ranges checked, or a [`ConfigError`] naming the key, where it
//! was looked for and what to do.
//!
//! Precedence is flags > env (`HUB_SIDECAR_*`, nested keys with `__`) > file > defaults.
//!
//! # Layout
//!
//! - `mod.rs`: [`Config`], [`Config::load`], [`ConfigError`], the start-up warnings.
//! - `raw`: [`Layers`] and the merge of file, environment and flags into raw tables.
//! - `validate`: raw → [`Config`]; every default and every check is there.
//! - `publish`: `[publish]`, the staged-change scan's allowed paths.
//! - `otel`: `[otel]`, OpenTelemetry export of task traces.
//! - [`allow`]: one `[network] allow` entry, parsed for the validation and the proxy.
//! - `sections`: the validated `[progress]`, `[executor]`, `[caches]`, `[network]`, … sections and their defaults.

pub mod allow;
mod otel;
mod publish;
mod raw;
mod sections;
#[cfg(test)]
mod tests;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Url;
use serde_json::Value;

pub use otel::OtelConfig;
pub use publish::PublishConfig;
pub use raw::Layers;
pub use sections::{
    warm_cache_entry, CachesConfig, Containment, EnvConfig, ExecutorConfig, GitConfig,
    JudgeBackend, NetworkConfig, NetworkMode, ProgressConfig, RecorderConfig, SandboxConfig,
    VerificationConfig, DEFAULT_MAX_COST_USD_PER_DAY, DEFAULT_NETWORK_ALLOW, DEFAULT_RETRY_CEILING,
};

/// Why the configuration cannot be used. Every message names the key (or the file), where it
/// was looked for, and what to do; none ever contains the token.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file cannot be read.
    #[error("cannot read config file {path}: {source}; check the path given with --config (or HUB_SIDECAR_CONFIG) and that the service user may read it")]
    Read {
        /// The file named by `--config`.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The file is not valid TOML / JSON.
    #[error("config file {path} is not valid {format}: {message}; fix the syntax (config/hub-sidecar.example.toml shows every key)")]
    Parse {
        /// The file named by `--config`.
        path: PathBuf,
        /// `TOML` or `JSON` (by the file's extension).
        format: &'static str,
        /// The parser's own words, with the line.
        message: String,
    },
    /// A required key is set nowhere.
    #[error("required config key `{key}` is missing (looked in {origin}); set it in the file, as HUB_SIDECAR_{env} or with --{flag}")]
    Missing {
        /// The key, e.g. `hub_url`.
        key: &'static str,
        /// Its environment variable without the `HUB_SIDECAR_` prefix.
        env: String,
        /// Its flag without the leading `--`.
        flag: String,
        /// Where it was looked for.
        origin: String,
    },
    /// A value of the wrong kind (a string where a number belongs, a list where a table does).
    #[error("config key `{key}` has the wrong type ({origin}): {message}; see config/hub-sidecar.example.toml for its form")]
    WrongType {
        /// The dotted key, e.g. `executor.claude_max_turns`.
        key: String,
        /// Where it was read from.
        origin: String,
        /// What was expected (serde's words; never the token's value).
        message: String,
    },
    /// A URL that does not parse or has the wrong scheme.
    #[error("config key `{key}` is not a usable URL ({origin}): {message}")]
    BadUrl {
        /// The dotted key, e.g. `hub_url`.
        key: String,
        /// Where it was read from.
        origin: String,
        /// What is wrong and what the key must look like.
        message: String,
    },
    /// A number outside the range the daemon can work with.
    #[error("config key `{key}` is out of range ({origin}): {message}")]
    OutOfRange {
        /// The dotted key, e.g. `ping_interval_secs`.
        key: String,
        /// Where it was read from.
        origin: String,
        /// The range allowed and why.
        message: String,
    },
    /// A value that parses but cannot be used (too long, a refused flag, an unknown name).
    #[error("config key `{key}` is invalid ({origin}): {message}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// Where it was read from.
        origin: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// The validated configuration the daemon runs with.
#[derive(Clone)]
pub struct Config {
    /// This agent's id at the hub (≤ 128 chars).
    pub agent_id: String,
    /// Hub token. Never printed: see the `Debug` impl.
    pub token: String,
    /// The hub's WebSocket endpoint, `ws://host:4000/ws` or `wss://…` (scheme checked at load).
    pub hub_url: Url,
    /// Display name sent with `identify` (defaults to `agent_id`).
    pub name: Option<String>,
    /// Capabilities announced in `identify` (e.g. `code`, `shell`); the hub routes by them.
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
    /// Seconds between pings; under the hub's 60 s silence limit (checked: 1..54).
    pub ping_interval_secs: u64,
    /// No pong this many seconds after a ping: the link is dead and is reopened.
    pub pong_timeout_secs: u64,
    /// Smallest reconnect delay (ms); the backoff doubles from here, with full jitter.
    pub reconnect_min_ms: u64,
    /// Largest reconnect delay (ms).
    pub reconnect_max_ms: u64,
    /// Seconds between `resource_report` frames (CPU, RAM, Ollama VRAM).
    pub resource_report_interval_secs: u64,
    /// Inbound frames larger than this are refused (and the link reset).
    pub max_frame_bytes: usize,
    /// How long a graceful stop waits for the running task.
    pub drain_timeout_secs: u64,
    /// How long a task paused by a dropped link (see [`crate::process::Fence`]) waits for
    /// the hub to say it is still ours before it is killed and dropped.
    pub fence_timeout_secs: u64,
    /// Most results kept waiting for the hub's acknowledgement; past it the oldest is dropped.
    pub outbox_max_entries: usize,
    /// A result the hub has not acknowledged after this long is dropped.
    pub outbox_expiry_secs: u64,
    /// `127.0.0.1:9090` to serve `/healthz` and `/metrics`; off when unset.
    pub metrics_addr: Option<SocketAddr>,
    /// More secret values to redact from everything that leaves the process.
    pub secrets: Vec<String>,
    /// `[progress]`: how progress frames share the hub's rate budget.
    pub progress: ProgressConfig,
    /// `[executor]`: how claude, Ollama and shell tasks are run.
    pub executor: ExecutorConfig,
    /// `[verification]`: checks, corrective retries, cost caps, the judge.
    pub verification: VerificationConfig,
    /// `[env]`: what children inherit from the daemon's environment.
    pub env: EnvConfig,
    /// `[git]`: managed clones and branch → commit → push → pull request.
    pub git: GitConfig,
    /// How hard tasks are confined; unset: strict (see [`crate::sandbox::Policy`]).
    pub containment: Option<Containment>,
    /// Paths and limits of containment.
    pub sandbox: SandboxConfig,
    /// `[recorder]`: the per-task flight record under `state_dir/tasks`.
    pub recorder: RecorderConfig,
    /// `[caches]`: per-repository dependency caches under `state_dir/caches`.
    pub caches: CachesConfig,
    /// `[network]`: what network a task's children get.
    pub network: NetworkConfig,
    /// `[publish]`: what the scan before a commit and push lets through.
    pub publish: PublishConfig,
    /// `[otel]`: OpenTelemetry export of one trace per task (off by default).
    pub otel: OtelConfig,
    /// Keys this build does not know, dotted (`wake_command` from a Node sidecar's
    /// `config.json`, a misspelt `executor.claude_modle`): warned about at start, ignored.
    pub unknown: BTreeMap<String, Value>,
    /// The config file the file layer came from, for messages.
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

/// The hub URL of [`Config::default`] (tests, offline tools): a loaded config always has one
/// from the operator, since `hub_url` is required.
const PLACEHOLDER_HUB_URL: &str = "ws://127.0.0.1:4000/ws";

impl Default for Config {
    fn default() -> Self {
        Config {
            agent_id: String::new(),
            token: String::new(),
            hub_url: Url::parse(PLACEHOLDER_HUB_URL).expect("a valid URL literal"),
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
            // The hub's own bound (4718a58, `Scheduler`): a task assigned to an agent that
            // sent no progress for 600 s is reclaimed by the first stuck sweep after the
            // hub restarts, so a pause longer than that can no longer end in "still ours".
            fence_timeout_secs: 600,
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
            caches: CachesConfig::default(),
            network: NetworkConfig::default(),
            publish: PublishConfig::default(),
            otel: OtelConfig::default(),
            unknown: BTreeMap::new(),
            origin: None,
        }
    }
}

impl Config {
    /// Merge the layers and validate. The one place a `Config` is made from user input.
    pub fn load(layers: &Layers) -> Result<Config, ConfigError> {
        let origin = describe_origin(layers.file.as_deref());
        let raw = raw::RawConfig::from_layers(layers, &origin)?;
        let mut cfg = validate::validate(raw, &origin)?;
        cfg.origin = layers.file.clone();
        Ok(cfg)
    }

    /// The state file path.
    pub fn state_file(&self) -> PathBuf {
        self.state_file
            .clone()
            .unwrap_or_else(|| self.state_dir.join("queue.json"))
    }

    /// `ping_interval_secs` as a [`Duration`].
    pub fn ping_interval(&self) -> Duration {
        Duration::from_secs(self.ping_interval_secs)
    }

    /// `pong_timeout_secs` as a [`Duration`].
    pub fn pong_timeout(&self) -> Duration {
        Duration::from_secs(self.pong_timeout_secs)
    }

    /// The hub's HTTP API base (no trailing slash): `git.hub_api_url`, else `hub_url` with
    /// `ws` → `http`, `wss` → `https` and the path dropped.
    pub fn hub_api_url(&self) -> String {
        if let Some(u) = self.git.hub_api_url.as_deref().filter(|u| !u.is_empty()) {
            return u.trim_end_matches('/').to_string();
        }
        let mut api = self.hub_url.clone();
        let scheme = if api.scheme() == "wss" {
            "https"
        } else {
            "http"
        };
        // ws/wss and http/https are all "special" schemes, between which a URL may switch.
        let _ = api.set_scheme(scheme);
        api.set_path("");
        api.set_query(None);
        api.set_fragment(None);
        api.as_str().trim_end_matches('/').to_string()
    }

    /// Every secret value to scrub from output: the token, `secrets` and `[otel] headers`.
    pub fn secret_values(&self) -> Vec<String> {
        let mut v = vec![self.token.clone()];
        v.extend(self.secrets.iter().cloned());
        // A collector's API key travels in a header: as secret as the hub token.
        v.extend(self.otel.headers.values().cloned());
        v
    }

    /// A config for tests and the demo: required keys set, everything else default.
    ///
    /// Panics when `hub_url` is not a URL: callers pass the mock hub's own.
    pub fn for_hub(hub_url: &str, state_dir: &Path) -> Config {
        Config {
            agent_id: "sidecar-test".into(),
            token: "test-token".into(),
            hub_url: Url::parse(hub_url).expect("for_hub needs a ws:// or wss:// URL"),
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
