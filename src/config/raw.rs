//! The raw layer: what the file, the `HUB_SIDECAR_*` environment and the flags say, before
//! any default or check. Every key is optional here; [`super::validate`] fills in defaults,
//! parses and checks ranges.
//!
//! The three sources are merged as one JSON tree (flags over env over file), then each table
//! is deserialized on its own so a wrongly typed value is reported with its dotted key.
//! Keys no struct here names are kept in `unknown` (top level and each section) and warned
//! about at start, never refused: a Node sidecar `config.json` carries keys such as
//! `wake_command` that this daemon has no use for.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{ConfigError, Containment};

/// The layers before merging: what the CLI hands over.
#[derive(Debug, Default, Clone)]
pub struct Layers {
    /// `--config FILE` (TOML, or JSON when it ends in `.json`).
    pub file: Option<PathBuf>,
    /// Process environment; only `HUB_SIDECAR_*` is read.
    pub env: Vec<(String, String)>,
    /// Flag values by dotted config key, e.g. `("hub_url", "ws://…")`.
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

    /// Whether the file, the environment or the flags name `state_dir` (an operator's
    /// choice to honour, rather than the built-in default). False when they cannot be read:
    /// loading them reports that.
    pub fn names_state_dir(&self) -> bool {
        RawConfig::from_layers(self, "")
            .map(|r| r.state_dir.is_some())
            .unwrap_or(false)
    }
}

/// Top-level keys whose env/flag values are always strings, even when they look like numbers
/// (a numeric token or agent id must stay a string).
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

/// `HUB_SIDECAR_*` variables that are not config keys: `HUB_SIDECAR_CONFIG` is the
/// `--config` flag's own variable (clap reads it), naming the file rather than a key in it.
const NOT_KEYS: &[&str] = &["CONFIG"];

/// What the top level of the file may say; sections are parsed separately.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawConfig {
    pub agent_id: Option<String>,
    pub token: Option<String>,
    pub hub_url: Option<String>,
    pub name: Option<String>,
    pub capabilities: Option<Vec<String>>,
    pub ollama_url: Option<String>,
    pub repo_dir: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub state_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub ping_interval_secs: Option<u64>,
    pub pong_timeout_secs: Option<u64>,
    pub reconnect_min_ms: Option<u64>,
    pub reconnect_max_ms: Option<u64>,
    pub resource_report_interval_secs: Option<u64>,
    pub max_frame_bytes: Option<usize>,
    pub drain_timeout_secs: Option<u64>,
    pub fence_timeout_secs: Option<u64>,
    pub outbox_max_entries: Option<usize>,
    pub outbox_expiry_secs: Option<u64>,
    pub metrics_addr: Option<SocketAddr>,
    pub secrets: Option<Vec<String>>,
    pub containment: Option<Containment>,
    #[serde(skip)]
    pub progress: RawProgress,
    #[serde(skip)]
    pub executor: RawExecutor,
    #[serde(skip)]
    pub verification: RawVerification,
    #[serde(skip)]
    pub env: RawEnv,
    #[serde(skip)]
    pub git: RawGit,
    #[serde(skip)]
    pub sandbox: RawSandbox,
    #[serde(skip)]
    pub recorder: RawRecorder,
    #[serde(skip)]
    pub caches: RawCaches,
    #[serde(skip)]
    pub network: RawNetwork,
    #[serde(skip)]
    pub publish: super::publish::RawPublish,
    #[serde(skip)]
    pub otel: super::otel::RawOtel,
    /// Keys no struct names, dotted (`wake_command`, `executor.claude_modle`).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[progress]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawProgress {
    pub capacity: Option<u32>,
    pub refill_per_minute: Option<u32>,
    pub reserve: Option<u32>,
    pub min_interval_ms: Option<u64>,
    pub max_text_bytes: Option<usize>,
    pub heartbeat_secs: Option<u64>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[executor]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawExecutor {
    pub claude_path: Option<PathBuf>,
    pub claude_model: Option<String>,
    pub claude_extra_args: Option<Vec<String>>,
    pub claude_allowed_tools: Option<Vec<String>>,
    pub claude_max_turns: Option<u32>,
    pub claude_api_max_retries: Option<u32>,
    pub claude_idle_timeout_secs: Option<u64>,
    pub claude_result_grace_ms: Option<u64>,
    pub claude_retry_delays_ms: Option<Vec<u64>>,
    pub ollama_model: Option<String>,
    pub ollama_num_ctx: Option<u32>,
    pub ollama_allow_insecure_remote: Option<bool>,
    pub ollama_timeout_secs: Option<u64>,
    pub ollama_retries: Option<u32>,
    pub shell_timeout_ms: Option<u64>,
    pub shell_retries: Option<u32>,
    pub trivial_timeout_secs: Option<u64>,
    pub standard_timeout_secs: Option<u64>,
    pub kill_grace_ms: Option<u64>,
    pub output_cap_bytes: Option<usize>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[verification]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawVerification {
    pub timeout_ms: Option<u64>,
    pub default_max_retries: Option<u32>,
    pub flaky_rerun: Option<bool>,
    pub check_output_cap_bytes: Option<usize>,
    pub max_cost_usd_per_task: Option<f64>,
    pub max_cost_usd_per_day: Option<f64>,
    pub retry_ceiling: Option<u32>,
    pub judge_backend: Option<String>,
    pub judge_model: Option<String>,
    pub judge_min_confidence: Option<f64>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[env]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawEnv {
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub agent: Option<Vec<String>>,
    pub publish: Option<Vec<String>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[git]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawGit {
    pub enabled: Option<bool>,
    pub author_name: Option<String>,
    pub author_email: Option<String>,
    pub push_drafts: Option<bool>,
    pub reviewer: Option<String>,
    pub clone_timeout_secs: Option<u64>,
    pub command_timeout_secs: Option<u64>,
    pub gh_path: Option<PathBuf>,
    pub hub_api_url: Option<String>,
    pub warm_cache: Option<Vec<String>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[sandbox]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawSandbox {
    pub read_paths: Option<Vec<PathBuf>>,
    pub write_paths: Option<Vec<PathBuf>>,
    pub max_memory_mb: Option<u64>,
    pub max_processes: Option<u64>,
    pub max_file_size_mb: Option<u64>,
    pub max_open_files: Option<u64>,
    pub npmrc: Option<PathBuf>,
    pub sockets: Option<Vec<PathBuf>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[recorder]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawRecorder {
    pub enabled: Option<bool>,
    pub max_tasks: Option<usize>,
    pub max_total_bytes: Option<u64>,
    pub max_task_bytes: Option<u64>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[caches]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawCaches {
    pub enabled: Option<bool>,
    pub max_size_mb: Option<u64>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

/// `[network]` as written.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawNetwork {
    pub mode: Option<super::NetworkMode>,
    pub allow: Option<Vec<String>>,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
}

impl RawConfig {
    /// Read the file (if any), lay the environment and the flags over it and deserialize.
    pub(crate) fn from_layers(layers: &Layers, origin: &str) -> Result<RawConfig, ConfigError> {
        let mut tree = Map::new();
        if let Some(path) = &layers.file {
            match read_file(path)? {
                Value::Object(m) => tree = m,
                _ => {
                    return Err(ConfigError::Parse {
                        path: path.clone(),
                        // TOML's top level is always a table: only JSON gets here.
                        format: "JSON",
                        message: "the top level must be an object of keys".into(),
                    });
                }
            }
        }
        for (k, v) in &layers.env {
            let Some(key) = k.strip_prefix("HUB_SIDECAR_") else {
                continue;
            };
            if NOT_KEYS.contains(&key) {
                continue;
            }
            // HUB_SIDECAR_EXECUTOR__CLAUDE_PATH → [executor] claude_path
            let path: Vec<String> = key.split("__").map(|p| p.to_ascii_lowercase()).collect();
            insert_path(&mut tree, &path, v);
        }
        for (k, v) in &layers.flags {
            let path: Vec<String> = k.split('.').map(str::to_string).collect();
            insert_path(&mut tree, &path, v);
        }
        let progress = take_section(&mut tree, "progress", origin)?;
        let executor = take_section(&mut tree, "executor", origin)?;
        let verification = take_section(&mut tree, "verification", origin)?;
        let env = take_section(&mut tree, "env", origin)?;
        let git = take_section(&mut tree, "git", origin)?;
        let sandbox = take_section(&mut tree, "sandbox", origin)?;
        let recorder = take_section(&mut tree, "recorder", origin)?;
        let caches = take_section(&mut tree, "caches", origin)?;
        let network = take_section(&mut tree, "network", origin)?;
        let publish = take_section(&mut tree, "publish", origin)?;
        let otel = take_section(&mut tree, "otel", origin)?;
        let mut raw: RawConfig = parse_table(None, tree, origin)?;
        raw.progress = progress;
        raw.executor = executor;
        raw.verification = verification;
        raw.env = env;
        raw.git = git;
        raw.sandbox = sandbox;
        raw.recorder = recorder;
        raw.caches = caches;
        raw.network = network;
        raw.publish = publish;
        raw.otel = otel;
        Ok(raw)
    }
}

/// Remove `[name]` from the tree and deserialize it; absent: every key unset.
fn take_section<T: DeserializeOwned + Default>(
    tree: &mut Map<String, Value>,
    name: &str,
    origin: &str,
) -> Result<T, ConfigError> {
    match tree.remove(name) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(Value::Object(m)) => parse_table(Some(name), m, origin),
        Some(_) => Err(ConfigError::WrongType {
            key: name.to_string(),
            origin: origin.to_string(),
            message: format!("must be a table (`[{name}]` in TOML, an object in JSON)"),
        }),
    }
}

/// Deserialize one table. On failure, find the key at fault by parsing each key alone (every
/// field is optional, so a lone key parses unless it is the culprit) and name it.
fn parse_table<T: DeserializeOwned>(
    section: Option<&str>,
    table: Map<String, Value>,
    origin: &str,
) -> Result<T, ConfigError> {
    let whole = match serde_json::from_value::<T>(Value::Object(table.clone())) {
        Ok(t) => return Ok(t),
        Err(e) => e,
    };
    let dotted = |k: &str| match section {
        Some(s) => format!("{s}.{k}"),
        None => k.to_string(),
    };
    let (key, message) = table
        .into_iter()
        .find_map(|(k, v)| {
            let alone = Map::from_iter([(k.clone(), v)]);
            serde_json::from_value::<T>(Value::Object(alone))
                .err()
                .map(|e| (dotted(&k), e.to_string()))
        })
        .unwrap_or_else(|| {
            (
                section.unwrap_or("(top level)").to_string(),
                whole.to_string(),
            )
        });
    // serde quotes the offending value; the token's value must never reach a message.
    let message = if key == "token" {
        "must be a string".to_string()
    } else {
        message
    };
    Err(ConfigError::WrongType {
        key,
        origin: origin.to_string(),
        message,
    })
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

/// Put a string from env or a flag at `path`, typed by what it looks like (`30` a number,
/// `true` a boolean, `["a"]` a list), except the top-level keys that are always strings.
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
        let Value::Object(next) = entry else {
            unreachable!("just made an object");
        };
        node = next;
    }
    let value = if parents.is_empty() && STRING_KEYS.contains(&last.as_str()) {
        Value::String(raw.to_string())
    } else {
        serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
    };
    node.insert(last.clone(), value);
}
