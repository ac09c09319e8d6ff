//! The one step from what the operator wrote ([`RawConfig`]) to what the daemon runs with
//! ([`Config`]): every default is filled in here and every check is made here, so a config
//! that loads is one the daemon can use.

use std::path::PathBuf;

use reqwest::Url;

use crate::task::MAX_VERIFICATION_RETRIES;

use super::raw::{
    RawCaches, RawConfig, RawEnv, RawExecutor, RawGit, RawNetwork, RawProgress, RawRecorder,
    RawSandbox, RawVerification,
};
use super::{
    warm_cache_entry, CachesConfig, Config, ConfigError, EnvConfig, ExecutorConfig, GitConfig,
    JudgeBackend, NetworkConfig, ProgressConfig, RecorderConfig, SandboxConfig, VerificationConfig,
};

/// Fill in defaults, then check. `origin` says where the keys were looked for.
pub(super) fn validate(mut raw: RawConfig, origin: &str) -> Result<Config, ConfigError> {
    let d = Config::default();
    let mut unknown = raw.unknown;
    let sections = [
        ("progress", std::mem::take(&mut raw.progress.unknown)),
        ("executor", std::mem::take(&mut raw.executor.unknown)),
        (
            "verification",
            std::mem::take(&mut raw.verification.unknown),
        ),
        ("env", std::mem::take(&mut raw.env.unknown)),
        ("git", std::mem::take(&mut raw.git.unknown)),
        ("sandbox", std::mem::take(&mut raw.sandbox.unknown)),
        ("recorder", std::mem::take(&mut raw.recorder.unknown)),
        ("caches", std::mem::take(&mut raw.caches.unknown)),
        ("network", std::mem::take(&mut raw.network.unknown)),
        ("publish", std::mem::take(&mut raw.publish.unknown)),
        ("otel", std::mem::take(&mut raw.otel.unknown)),
    ];
    for (section, keys) in sections {
        unknown.extend(keys.into_iter().map(|(k, v)| (format!("{section}.{k}"), v)));
    }
    let agent_id = required("agent_id", raw.agent_id, origin)?;
    let token = required("token", raw.token, origin)?;
    let hub_url = hub_url(&required("hub_url", raw.hub_url, origin)?, origin)?;
    if let Some(api) = raw.git.hub_api_url.as_deref().filter(|u| !u.is_empty()) {
        http_url("git.hub_api_url", api, origin)?;
    }
    // Kept as written (the identify frame announces it as is); `host:port` means http.
    if let Some(ollama) = raw.ollama_url.as_deref().filter(|u| !u.is_empty()) {
        if ollama.contains("://") {
            http_url("ollama_url", ollama, origin)?;
        } else {
            http_url("ollama_url", &format!("http://{ollama}"), origin)?;
        }
    }
    let cfg = Config {
        agent_id,
        token,
        hub_url,
        name: raw.name.or(d.name),
        capabilities: raw.capabilities.unwrap_or(d.capabilities),
        // An empty `ollama_url` (a Node config.json writes "") means unset.
        ollama_url: raw.ollama_url.filter(|u| !u.is_empty()).or(d.ollama_url),
        repo_dir: raw.repo_dir.or(d.repo_dir),
        state_dir: raw.state_dir.unwrap_or(d.state_dir),
        state_file: raw.state_file.or(d.state_file),
        ca_file: raw.ca_file.or(d.ca_file),
        ping_interval_secs: raw.ping_interval_secs.unwrap_or(d.ping_interval_secs),
        pong_timeout_secs: raw.pong_timeout_secs.unwrap_or(d.pong_timeout_secs),
        reconnect_min_ms: raw.reconnect_min_ms.unwrap_or(d.reconnect_min_ms),
        reconnect_max_ms: raw.reconnect_max_ms.unwrap_or(d.reconnect_max_ms),
        resource_report_interval_secs: raw
            .resource_report_interval_secs
            .unwrap_or(d.resource_report_interval_secs),
        max_frame_bytes: raw.max_frame_bytes.unwrap_or(d.max_frame_bytes),
        drain_timeout_secs: raw.drain_timeout_secs.unwrap_or(d.drain_timeout_secs),
        fence_timeout_secs: raw.fence_timeout_secs.unwrap_or(d.fence_timeout_secs),
        outbox_max_entries: raw.outbox_max_entries.unwrap_or(d.outbox_max_entries),
        outbox_expiry_secs: raw.outbox_expiry_secs.unwrap_or(d.outbox_expiry_secs),
        metrics_addr: raw.metrics_addr.or(d.metrics_addr),
        secrets: raw.secrets.unwrap_or(d.secrets),
        progress: progress(raw.progress),
        executor: executor(raw.executor),
        verification: verification(raw.verification, origin)?,
        env: env(raw.env),
        git: git(raw.git),
        containment: raw.containment.or(d.containment),
        sandbox: sandbox(raw.sandbox),
        recorder: recorder(raw.recorder),
        caches: caches(raw.caches),
        network: network(raw.network),
        publish: super::publish::publish(raw.publish, origin)?,
        otel: super::otel::otel(raw.otel, origin)?,
        unknown,
        origin: None::<PathBuf>,
    };
    check(&cfg, origin)?;
    Ok(cfg)
}

fn progress(r: RawProgress) -> ProgressConfig {
    let d = ProgressConfig::default();
    ProgressConfig {
        capacity: r.capacity.unwrap_or(d.capacity),
        refill_per_minute: r.refill_per_minute.unwrap_or(d.refill_per_minute),
        reserve: r.reserve.unwrap_or(d.reserve),
        min_interval_ms: r.min_interval_ms.unwrap_or(d.min_interval_ms),
        max_text_bytes: r.max_text_bytes.unwrap_or(d.max_text_bytes),
        heartbeat_secs: r.heartbeat_secs.unwrap_or(d.heartbeat_secs),
    }
}

fn executor(r: RawExecutor) -> ExecutorConfig {
    let d = ExecutorConfig::default();
    ExecutorConfig {
        claude_path: r.claude_path.or(d.claude_path),
        claude_model: r.claude_model.unwrap_or(d.claude_model),
        claude_extra_args: r.claude_extra_args.unwrap_or(d.claude_extra_args),
        claude_allowed_tools: r.claude_allowed_tools.unwrap_or(d.claude_allowed_tools),
        claude_max_turns: r.claude_max_turns.unwrap_or(d.claude_max_turns),
        claude_api_max_retries: r.claude_api_max_retries.unwrap_or(d.claude_api_max_retries),
        claude_idle_timeout_secs: r
            .claude_idle_timeout_secs
            .unwrap_or(d.claude_idle_timeout_secs),
        claude_result_grace_ms: r.claude_result_grace_ms.unwrap_or(d.claude_result_grace_ms),
        claude_retry_delays_ms: r.claude_retry_delays_ms.unwrap_or(d.claude_retry_delays_ms),
        ollama_model: r.ollama_model.unwrap_or(d.ollama_model),
        ollama_num_ctx: r.ollama_num_ctx.unwrap_or(d.ollama_num_ctx),
        ollama_allow_insecure_remote: r
            .ollama_allow_insecure_remote
            .unwrap_or(d.ollama_allow_insecure_remote),
        ollama_timeout_secs: r.ollama_timeout_secs.unwrap_or(d.ollama_timeout_secs),
        ollama_retries: r.ollama_retries.unwrap_or(d.ollama_retries),
        shell_timeout_ms: r.shell_timeout_ms.unwrap_or(d.shell_timeout_ms),
        shell_retries: r.shell_retries.unwrap_or(d.shell_retries),
        trivial_timeout_secs: r.trivial_timeout_secs.unwrap_or(d.trivial_timeout_secs),
        standard_timeout_secs: r.standard_timeout_secs.unwrap_or(d.standard_timeout_secs),
        kill_grace_ms: r.kill_grace_ms.unwrap_or(d.kill_grace_ms),
        output_cap_bytes: r.output_cap_bytes.unwrap_or(d.output_cap_bytes),
    }
}

fn verification(r: RawVerification, origin: &str) -> Result<VerificationConfig, ConfigError> {
    let d = VerificationConfig::default();
    let judge_backend = match r.judge_backend.as_deref() {
        None => d.judge_backend,
        Some(v) => JudgeBackend::parse(v).ok_or_else(|| ConfigError::Invalid {
            key: "verification.judge_backend".into(),
            origin: origin.to_string(),
            message: format!("`{v}` is not a judge backend: use \"ollama\" or \"claude\""),
        })?,
    };
    Ok(VerificationConfig {
        timeout_ms: r.timeout_ms.unwrap_or(d.timeout_ms),
        default_max_retries: r.default_max_retries.unwrap_or(d.default_max_retries),
        flaky_rerun: r.flaky_rerun.unwrap_or(d.flaky_rerun),
        check_output_cap_bytes: r.check_output_cap_bytes.unwrap_or(d.check_output_cap_bytes),
        max_cost_usd_per_task: r.max_cost_usd_per_task.or(d.max_cost_usd_per_task),
        max_cost_usd_per_day: r.max_cost_usd_per_day.or(d.max_cost_usd_per_day),
        retry_ceiling: r.retry_ceiling.unwrap_or(d.retry_ceiling),
        judge_backend,
        judge_configured: r.judge_backend.is_some() || d.judge_configured,
        judge_model: r.judge_model.or(d.judge_model),
        judge_min_confidence: r.judge_min_confidence.unwrap_or(d.judge_min_confidence),
    })
}

fn env(r: RawEnv) -> EnvConfig {
    let d = EnvConfig::default();
    EnvConfig {
        allow: r.allow.unwrap_or(d.allow),
        deny: r.deny.unwrap_or(d.deny),
        agent: r.agent.unwrap_or(d.agent),
        publish: r.publish.unwrap_or(d.publish),
    }
}

fn git(r: RawGit) -> GitConfig {
    let d = GitConfig::default();
    GitConfig {
        enabled: r.enabled.unwrap_or(d.enabled),
        author_name: r.author_name.unwrap_or(d.author_name),
        author_email: r.author_email.unwrap_or(d.author_email),
        push_drafts: r.push_drafts.unwrap_or(d.push_drafts),
        reviewer: r.reviewer.or(d.reviewer),
        clone_timeout_secs: r.clone_timeout_secs.unwrap_or(d.clone_timeout_secs),
        command_timeout_secs: r.command_timeout_secs.unwrap_or(d.command_timeout_secs),
        gh_path: r.gh_path.or(d.gh_path),
        hub_api_url: r.hub_api_url.or(d.hub_api_url),
        warm_cache: r.warm_cache.unwrap_or(d.warm_cache),
    }
}

fn sandbox(r: RawSandbox) -> SandboxConfig {
    let d = SandboxConfig::default();
    SandboxConfig {
        read_paths: r.read_paths.unwrap_or(d.read_paths),
        write_paths: r.write_paths.unwrap_or(d.write_paths),
        max_memory_mb: r.max_memory_mb.unwrap_or(d.max_memory_mb),
        max_processes: r.max_processes.unwrap_or(d.max_processes),
        max_file_size_mb: r.max_file_size_mb.unwrap_or(d.max_file_size_mb),
        max_open_files: r.max_open_files.unwrap_or(d.max_open_files),
        npmrc: r.npmrc.or(d.npmrc),
        sockets: r.sockets.unwrap_or(d.sockets),
    }
}

fn caches(r: RawCaches) -> CachesConfig {
    let d = CachesConfig::default();
    CachesConfig {
        enabled: r.enabled.unwrap_or(d.enabled),
        max_size_mb: r.max_size_mb.unwrap_or(d.max_size_mb),
    }
}

fn network(r: RawNetwork) -> NetworkConfig {
    let d = NetworkConfig::default();
    NetworkConfig {
        mode: r.mode.unwrap_or(d.mode),
        allow: r.allow.unwrap_or(d.allow),
    }
}

fn recorder(r: RawRecorder) -> RecorderConfig {
    let d = RecorderConfig::default();
    RecorderConfig {
        enabled: r.enabled.unwrap_or(d.enabled),
        max_tasks: r.max_tasks.unwrap_or(d.max_tasks),
        max_total_bytes: r.max_total_bytes.or(d.max_total_bytes),
        max_task_bytes: r.max_task_bytes.or(d.max_task_bytes),
    }
}

/// A required key's value, or [`ConfigError::Missing`] when it is unset or blank.
fn required(key: &'static str, value: Option<String>, origin: &str) -> Result<String, ConfigError> {
    match value {
        Some(v) if !v.trim().is_empty() => Ok(v),
        _ => Err(ConfigError::Missing {
            key,
            env: key.to_ascii_uppercase(),
            flag: key.replace('_', "-"),
            origin: origin.to_string(),
        }),
    }
}

/// `hub_url`: a `ws://` or `wss://` URL with a host.
fn hub_url(value: &str, origin: &str) -> Result<Url, ConfigError> {
    let bad = |message: String| ConfigError::BadUrl {
        key: "hub_url".into(),
        origin: origin.to_string(),
        message,
    };
    let url = Url::parse(value.trim()).map_err(|e| {
        bad(format!(
            "`{value}` does not parse ({e}); write it as wss://hub.example:4000/ws"
        ))
    })?;
    if !matches!(url.scheme(), "ws" | "wss") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad(format!(
            "`{value}` must start with ws:// or wss:// and name a host, e.g. wss://hub.example:4000/ws"
        )));
    }
    Ok(url)
}

/// An `http://` or `https://` URL with a host, e.g. `git.hub_api_url`.
fn http_url(key: &str, value: &str, origin: &str) -> Result<Url, ConfigError> {
    let bad = |message: String| ConfigError::BadUrl {
        key: key.to_string(),
        origin: origin.to_string(),
        message,
    };
    let url = Url::parse(value.trim()).map_err(|e| {
        bad(format!(
            "`{value}` does not parse ({e}); write it as https://hub.example:4000"
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad(format!(
            "`{value}` must start with http:// or https:// and name a host, e.g. https://hub.example:4000"
        )));
    }
    Ok(url)
}

/// Every check a loaded config must pass, first failure reported.
fn check(cfg: &Config, origin: &str) -> Result<(), ConfigError> {
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        key: key.to_string(),
        origin: origin.to_string(),
        message,
    };
    let range = |key: &str, message: &str| ConfigError::OutOfRange {
        key: key.to_string(),
        origin: origin.to_string(),
        message: message.to_string(),
    };
    if let Some(p) = cfg
        .git
        .warm_cache
        .iter()
        .find(|p| warm_cache_entry(p).is_none())
    {
        return Err(invalid(
            "git.warm_cache",
            format!("`{p}` is not a plain path inside the clone (like `target/`); fix the entry"),
        ));
    }
    if let Some(why) = cfg
        .network
        .allow
        .iter()
        .find_map(|e| crate::config::allow::Entry::parse(e).err())
    {
        return Err(invalid(
            "network.allow",
            format!("{why}; write `host`, `host:port`, `host:*` or `*.domain`"),
        ));
    }
    if let Some((p, why)) = cfg
        .sandbox
        .sockets
        .iter()
        .find_map(|p| bad_socket(p).map(|w| (p, w)))
    {
        return Err(invalid(
            "sandbox.sockets",
            format!(
                "`{}` {why}; name each socket file by its absolute path, like \"/run/docker.sock\"",
                p.display()
            ),
        ));
    }
    if cfg.agent_id.chars().count() > 128 {
        return Err(invalid(
            "agent_id",
            "longer than the hub's 128 characters; pick a shorter id".into(),
        ));
    }
    if cfg.token.chars().count() > 256 {
        return Err(invalid(
            "token",
            "longer than the hub's 256 characters; copy the token the hub issued for this agent"
                .into(),
        ));
    }
    if cfg.ping_interval_secs == 0 || cfg.ping_interval_secs >= 55 {
        return Err(range(
            "ping_interval_secs",
            "must be 1..54: the hub closes a socket silent for 60 s",
        ));
    }
    if cfg.reconnect_min_ms == 0 || cfg.reconnect_min_ms > cfg.reconnect_max_ms {
        return Err(range(
            "reconnect_min_ms",
            "must be > 0 and ≤ reconnect_max_ms",
        ));
    }
    if cfg.progress.refill_per_minute == 0 {
        return Err(range(
            "progress.refill_per_minute",
            "must be at least 1: with no refill the hub link would wait forever for a token (the hub refills 60 a minute)",
        ));
    }
    if cfg.progress.reserve >= cfg.progress.capacity {
        return Err(range("progress.reserve", "must be below progress.capacity"));
    }
    if cfg.pong_timeout_secs == 0 {
        return Err(range(
            "pong_timeout_secs",
            "must be at least 1: with 0 every ping would count as unanswered and the link would reset at once",
        ));
    }
    let v = &cfg.verification;
    if v.default_max_retries > MAX_VERIFICATION_RETRIES {
        return Err(range(
            "verification.default_max_retries",
            "must be 0..5, the hub's own cap on corrective retries",
        ));
    }
    if !(0.0..=1.0).contains(&v.judge_min_confidence) {
        return Err(range(
            "verification.judge_min_confidence",
            "must be 0.0..1.0: the judge answers with a confidence in that range (above 1 no check could pass)",
        ));
    }
    for (key, cap) in [
        (
            "verification.max_cost_usd_per_task",
            v.max_cost_usd_per_task,
        ),
        ("verification.max_cost_usd_per_day", v.max_cost_usd_per_day),
    ] {
        // TOML's nan and inf cannot reach here: the JSON merge turns them into null (unset).
        if cap.is_some_and(|c| c < 0.0) {
            return Err(range(
                key,
                "must be a number of US dollars ≥ 0 (0 allows no paid call); leave it unset for no per-task cap",
            ));
        }
    }
    if let Some(bad) = bypass_flag(&cfg.executor.claude_extra_args) {
        return Err(invalid(
            "executor.claude_extra_args",
            format!("`{bad}` bypasses claude's permission checks for repository-controlled work (and claude refuses it as root); allow specific tools in executor.claude_allowed_tools instead"),
        ));
    }
    Ok(())
}

/// Why `p` cannot be a `[sandbox] sockets` entry: each names one socket file, so a grant
/// never opens a tree (a directory, `/`, a path through `..`).
fn bad_socket(p: &std::path::Path) -> Option<&'static str> {
    use std::path::Component;
    if !p.is_absolute() {
        return Some("is not an absolute path");
    }
    if p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Some("goes through `.` or `..`");
    }
    if p.parent().is_none() || std::fs::metadata(p).is_ok_and(|m| m.is_dir()) {
        return Some("is a directory, not a socket");
    }
    None
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
