//! The validated sections of [`super::Config`]: `[progress]`, `[executor]`, `[verification]`,
//! `[env]`, `[git]`, `[sandbox]` and `[recorder]`, each with its built-in defaults, plus the
//! enums a key is parsed into. What the file may say is in `super::raw`; these are what the
//! rest of the crate reads.

use std::path::PathBuf;

use serde::Deserialize;

/// `[progress]`: coalescing of `task_progress` under the hub's shared "normal" budget.
#[derive(Debug, Clone)]
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
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    /// Record tasks at all.
    pub enabled: bool,
    /// Most task records kept.
    pub max_tasks: usize,
    /// Most bytes all task records may take together; `None`: this agent's share of the
    /// host (`recorder::sizing`: 1 % of the disk split between the agents beside it, at
    /// most 256 MiB).
    pub max_total_bytes: Option<u64>,
    /// Most bytes one task's record takes, every line counted: output and events stop at
    /// it; attempts, verification, decisions, the network summary and the terminal frame
    /// are still written past it, each shrunk to about 12 KiB; `None`: 4 MiB, or a quarter
    /// of `max_total_bytes` when that is less.
    pub max_task_bytes: Option<u64>,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            enabled: true,
            max_tasks: 500,
            max_total_bytes: None,
            max_task_bytes: None,
        }
    }
}

/// `[caches]`: per-repository dependency caches under `state_dir/caches/` (see
/// `sandbox::caches`), which the package managers of a task's children write.
#[derive(Debug, Clone)]
pub struct CachesConfig {
    /// Give tasks per-repository caches at all. Off: the tools find no writable cache and
    /// download into the workspace or fail, as before.
    pub enabled: bool,
    /// Most MiB all repositories' caches may take together; past it the least recently used
    /// repositories' caches are removed when a task starts. 0: no limit.
    pub max_size_mb: u64,
}

impl Default for CachesConfig {
    fn default() -> Self {
        CachesConfig {
            enabled: true,
            max_size_mb: 10 * 1024,
        }
    }
}

/// `[executor]`: how tasks are run.
#[derive(Debug, Clone)]
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
    /// `options.num_ctx` of every Ollama call: the context window the model gets. Ollama
    /// silently cuts the beginning of a longer prompt, so it is set explicitly and a prompt
    /// that fills it is reported.
    pub ollama_num_ctx: u32,
    /// Let the agentic Ollama loop use a plain `http://` endpoint on another host. Off: tool
    /// calls come from whoever answers on the network path, so only loopback or `https://`.
    pub ollama_allow_insecure_remote: bool,
    /// Model for Ollama when the routing decision names none.
    pub ollama_model: String,
    /// Per-HTTP-call timeout for Ollama.
    pub ollama_timeout_secs: u64,
    /// Shell default timeout when `metadata.timeout_ms` is absent.
    pub shell_timeout_ms: u64,
    /// Re-runs of a shell command that exited non-zero (not on timeout or cancel). Default 0:
    /// a command runs once; re-running it (a migration, a deploy, a push) is the operator's
    /// explicit choice, announced in progress and kept run by run in `result.shell_runs`.
    pub shell_retries: u32,
    /// Execution timeout for trivial tasks (LLM executors).
    pub trivial_timeout_secs: u64,
    /// Execution timeout for standard and complex tasks (LLM executors).
    pub standard_timeout_secs: u64,
    /// SIGTERM → SIGKILL grace for a process group.
    pub kill_grace_ms: u64,
    /// Captured output kept per execution (head and tail). What leaves the daemon is less:
    /// `result.output` keeps 64 KiB of it, the flight record 4 MiB of the stream as it
    /// passes, so the default keeps twice `result.output` and no more in memory.
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
            shell_retries: 0,
            trivial_timeout_secs: 600,
            standard_timeout_secs: 1_800,
            kill_grace_ms: 5_000,
            output_cap_bytes: 128 * 1024,
            claude_retry_delays_ms: vec![2_000, 4_000, 8_000],
            ollama_retries: 2,
        }
    }
}

/// The daily cost cap when the config sets none (USD).
pub const DEFAULT_MAX_COST_USD_PER_DAY: f64 = 20.0;
/// Corrective retries allowed when the config sets no ceiling: the specification's cap (5,
/// [`crate::task::MAX_VERIFICATION_RETRIES`]), so a default install gives a task what it asks
/// for; an operator may set a lower ceiling.
pub const DEFAULT_RETRY_CEILING: u32 = crate::task::MAX_VERIFICATION_RETRIES;

/// `[verification]`: checks and the corrective-retry loop.
#[derive(Debug, Clone)]
pub struct VerificationConfig {
    /// Global deadline of one verification run when the task gives none.
    pub timeout_ms: u64,
    /// Corrective retries for a task that carries no `max_verification_retries` (a task file
    /// run by hand, or a hub that sends none). The task's own number wins; the retry loop's
    /// `RetryBudget` says in the result which applied.
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
    /// The operator's ceiling on corrective retries, whatever the task asks; when it lowers
    /// the task's number the result (`retry_budget`) and the progress say so.
    pub retry_ceiling: u32,
    /// Who answers `llm_judge` checks.
    pub judge_backend: JudgeBackend,
    /// The config names a judge (`judge_backend` is set): a task that gives
    /// `success_criteria` and no `verification_steps` then has each criterion checked by the
    /// judge; without one, its result says that nothing was verified (`verify::criteria`).
    pub judge_configured: bool,
    /// Model of the judge; unset: the task's selected model, else the backend's default.
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
            judge_backend: JudgeBackend::Ollama,
            judge_configured: false,
            judge_model: None,
            judge_min_confidence: 0.85,
        }
    }
}

/// Who answers `llm_judge` checks (`verification.judge_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JudgeBackend {
    /// The Ollama endpoint of the task (or `ollama_url`); costs nothing.
    Ollama,
    /// The `claude` CLI; its cost counts against the task's and the day's caps.
    Claude,
}

impl JudgeBackend {
    /// The value as written in the config: `ollama` or `claude`. Empty means `ollama`, as in
    /// the Node sidecar's config.json.
    pub fn parse(value: &str) -> Option<JudgeBackend> {
        match value.trim().to_ascii_lowercase().as_str() {
            "ollama" | "" => Some(JudgeBackend::Ollama),
            "claude" => Some(JudgeBackend::Claude),
            _ => None,
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

impl Containment {
    /// The config's word for the level (also the `containment` label in metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Containment::Strict => "strict",
            Containment::BestEffort => "best-effort",
            Containment::Off => "off",
        }
    }
}

/// `[network] mode`: what network a task's own children (executor, checks) get. The
/// daemon's own connections (hub, Ollama, judge, its git calls) are never affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// The host's network as the daemon has it, loopback services included.
    Open,
    /// Only the hosts in `[network] allow`, through an HTTP proxy the daemon runs: the
    /// task's network namespace has no other way out (see `sandbox::proxy`).
    #[default]
    Allowlist,
    /// None at all: a network namespace of the task's own with only its own loopback.
    /// Enforced by the kernel; needs user namespaces (`RestrictNamespaces=user pid net`).
    None,
}

/// `[network]`: the network policy of a task's children.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// `open` (default), `allowlist` or `none`.
    pub mode: NetworkMode,
    /// What a task may reach under `allowlist`: `host` (ports 80 and 443), `host:port`,
    /// `host:*`, `*.example.com[:port]` for a domain and its subdomains; an address of the
    /// daemon's host only through an entry naming its exact `host:port` (see
    /// `sandbox::allowlist`).
    pub allow: Vec<String>,
}

/// The hosts `allowlist` lets through by default: Claude's API and the public registries of
/// the ecosystems the caches cover.
pub const DEFAULT_NETWORK_ALLOW: &[&str] = &[
    "*.anthropic.com",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "pypi.org",
    "files.pythonhosted.org",
    "proxy.golang.org",
    "sum.golang.org",
    "github.com",
    "codeload.github.com",
    "objects.githubusercontent.com",
];

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            mode: NetworkMode::default(),
            allow: DEFAULT_NETWORK_ALLOW
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

/// `[sandbox]`: the paths and limits of containment.
#[derive(Debug, Clone)]
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
    /// A file copied into each task's HOME as its `.npmrc` (npm, pnpm and yarn read it):
    /// the registries and logins the operator gives tasks on purpose. Unset: an empty one,
    /// never the service user's own `~/.npmrc`.
    pub npmrc: Option<PathBuf>,
    /// Host unix sockets the task's children may connect to, each by its absolute path
    /// (`/run/docker.sock` for testcontainers). Every other socket file of the host is
    /// hidden from them; each one named gives away whatever its server lets its clients do.
    pub sockets: Vec<PathBuf>,
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
            npmrc: None,
            sockets: Vec::new(),
        }
    }
}

/// `[env]`: what child processes inherit. An allowlist: the variables toolchains need
/// (`process::env::BUILT_IN`), plus `allow`; `deny` wins over both.
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// Names passed to every child on top of the built-in toolchain variables.
    pub allow: Vec<String>,
    /// Never passed to children (on top of the daemon's own `HUB_SIDECAR_*`).
    pub deny: Vec<String>,
    /// Names passed to the agent CLI (`claude`, and `claude` as judge) only, never to a
    /// shell task, a check or git: its credential (`ANTHROPIC_API_KEY`).
    pub agent: Vec<String>,
    /// Names passed to the publishing step alone (`git push` and `gh pr create`), never to
    /// a task's children: the pull request's credential (`GH_TOKEN`).
    pub publish: Vec<String>,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            allow: Vec::new(),
            deny: vec!["AWS_SECRET_ACCESS_KEY".into(), "GITHUB_TOKEN".into()],
            agent: vec!["ANTHROPIC_API_KEY".into()],
            publish: vec!["GH_TOKEN".into()],
        }
    }
}

/// `[git]`: managed workspaces and the branch → commit → push → pull request workflow.
#[derive(Debug, Clone)]
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

/// A `git.warm_cache` entry as a path relative to the clone's root (`./target/` →
/// `target/`), or `None` when it could name something outside the clone or the clone's git
/// link (absolute, `..`, `.`, `.git`, a glob). Checked at load and again where it is used.
pub fn warm_cache_entry(entry: &str) -> Option<&str> {
    let rel = entry.trim().trim_start_matches("./");
    let bad = rel.is_empty()
        || rel.starts_with('/')
        || rel.split('/').any(|c| c == ".." || c == ".git" || c == ".")
        || rel.contains(['*', '?', '[', '\\', '!']);
    (!bad).then_some(rel)
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
