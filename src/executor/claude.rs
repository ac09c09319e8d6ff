//! The Claude Code CLI executor: runs `claude -p` with the prompt on **stdin** (a prompt in
//! argv fails with E2BIG over 128 KiB and could be read as an option), an argv never a shell
//! string, in the workspace; parses its `stream-json` lines as they arrive
//! ([`super::claude_stream`]) into progress, usage and a typed failure.
//!
//! # Flags, and why
//!
//! - `--permission-mode acceptEdits` (+ `--allowedTools` from `executor.claude_allowed_tools`):
//!   under `-p` the default mode denies every Write, Edit and Bash call and the run still ends
//!   `success`. A bypass mode is never used (config validation refuses it; the CLI itself
//!   refuses `--dangerously-skip-permissions` as root).
//! - `--setting-sources user` and `--strict-mcp-config`: the repository is untrusted; without
//!   them the CLI runs the workspace's `.claude/settings.json` hooks and honours its `env`
//!   (including `ANTHROPIC_BASE_URL`, which would send the API key where the repo chose) and
//!   its `.mcp.json`.
//! - `--no-session-persistence`: no transcript of task data left under HOME. So every attempt
//!   is a fresh run: the loop carries the work forward itself (a self-contained corrective
//!   prompt with the plan the first run made, [`crate::plan`]); the first assistant
//!   text of a run is returned as [`ExecOutcome::narrative`] for the loop to find that plan.
//! - `--max-turns` (`executor.claude_max_turns`), `--max-budget-usd` (the task's remaining
//!   budget, [`ExecContext::remaining_budget_usd`]).
//! - `CLAUDE_CODE_MAX_RETRIES` (`executor.claude_api_max_retries`) in the child env: the CLI
//!   retries 429/5xx/network errors itself (about ten times over ~3 min by default), reporting
//!   each try as a `system/api_retry` line. That is the one retry layer for API errors; this
//!   executor only starts a fresh process after a crash (no result line), per
//!   `claude_retry_delays_ms`, within the same tier deadline.
//!
//! # Ending a run
//!
//! After the `result` line the process gets `claude_result_grace_ms` to exit, then its group
//! is stopped: a lingering CLI must not turn a finished run into a timeout. A stream silent for
//! `claude_idle_timeout_secs` is killed (the reason says so); while a tool call runs (a build
//! in the Bash tool prints nothing until it ends) ten more minutes of silence are allowed. A run killed at the timeout
//! reports the cost estimated from the per-message usage seen so far, not zero.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::cost;
use crate::process::{self, ChildEnv, CommandSpec, Exit, Limits};
use crate::progress::{EventKind, ProgressEvent};

use super::claude_stream::{ClaudeFailure, StreamState};
use super::{Attempt, ExecContext, ExecOutcome, ExecStatus};

/// Runs tasks through the `claude` CLI found at construction.
pub struct ClaudeExecutor {
    program: PathBuf,
}

/// Why the `claude` CLI was not found.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// `executor.claude_path` names no file.
    #[error("executor.claude_path {} does not exist or is not a file; install Claude Code (`npm install -g @anthropic-ai/claude-code`) or fix executor.claude_path", .0.display())]
    BadPath(PathBuf),
    /// No `claude` on the children's PATH.
    #[error("the `claude` CLI was not found on PATH ({0}); install it with `npm install -g @anthropic-ai/claude-code` or set executor.claude_path")]
    NotOnPath(which::Error),
}

/// The one way `claude` is found (executor, judge, `check`): `executor.claude_path`, else
/// the PATH of the child environment `env` (so what a child would find is what runs), with
/// relative PATH entries taken from `cwd`. Blocking (stat calls), and cheap.
pub fn locate(cfg: &Config, env: &ChildEnv, cwd: &Path) -> Result<PathBuf, LocateError> {
    if let Some(p) = &cfg.executor.claude_path {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            Err(LocateError::BadPath(p.clone()))
        };
    }
    let path = env
        .get("PATH")
        .map(std::ffi::OsString::from)
        .or_else(|| std::env::var_os("PATH"));
    which::which_in("claude", path, cwd).map_err(LocateError::NotOnPath)
}

impl ClaudeExecutor {
    /// Locate `claude` (see [`locate`]). `Err` says how to fix it.
    pub fn new(ctx: &ExecContext) -> Result<ClaudeExecutor, LocateError> {
        let program = locate(&ctx.config, &ctx.env, &ctx.workspace)?;
        Ok(ClaudeExecutor { program })
    }

    /// The binary this executor runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Run one attempt: the CLI, started again after `claude_retry_delays_ms` only when it
    /// crashed (never on a classified failure, cancellation or timeout). Tokens and cost are
    /// summed over the tries.
    pub async fn execute(&mut self, ctx: &ExecContext, attempt: &Attempt) -> ExecOutcome {
        let started = Instant::now();
        let cfg = &ctx.config.executor;
        let model = select_model(ctx);
        // One deadline for the attempt, retries included: a task's timeout bounds its wall time.
        let timeout = ctx.llm_timeout();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut totals = Totals::default();
        let delays = cfg.claude_retry_delays_ms.clone();
        let mut tries = 0usize;
        let end = loop {
            tries += 1;
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let spec = build_spec(&self.program, ctx, &attempt.prompt, &model);
            let run = match run_once(ctx, spec, &model, remaining, totals.tokens_out).await {
                Ok(r) => r,
                Err(e) => {
                    break End::Failed(format!(
                        "could not start `{}` in {}: {e}",
                        self.program.display(),
                        ctx.workspace.display()
                    ))
                }
            };
            totals.add(&run.stream);
            totals.last_output = run.stream.output();
            match run.end {
                RunEnd::TimedOut => break End::TimedOut(timeout_detail(&run.stream)),
                RunEnd::Cancelled => break End::Cancelled,
                RunEnd::Idle(secs) => {
                    break End::Failed(format!(
                        "claude printed nothing for {secs} s and was killed (executor.claude_idle_timeout_secs){}",
                        timeout_detail(&run.stream)
                    ))
                }
                RunEnd::Exited { .. } => {}
            }
            let Some(failure) = run.failure() else {
                break End::Ok;
            };
            if !failure.retryable() {
                tracing::warn!(task_id = %ctx.task.task_id, attempt = attempt.number, class = failure.class(), %failure, "claude run failed; not retried");
                break End::Failed(failure.to_string());
            }
            let Some(&delay) = delays.get(tries - 1) else {
                break End::Failed(format!("{failure} (gave up after {tries} tries)"));
            };
            tracing::warn!(task_id = %ctx.task.task_id, attempt = attempt.number, tries, delay_ms = delay, %failure, "claude crashed; retrying");
            ctx.progress.emit(ProgressEvent::new(
                EventKind::Error,
                format!("{failure}; retry {tries} in {delay} ms"),
            ));
            tokio::select! {
                _ = ctx.cancel.cancelled() => break End::Cancelled,
                _ = tokio::time::sleep_until(deadline) => break End::TimedOut(String::new()),
                _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
            }
        };
        let mut output = totals.last_output.clone();
        if !totals.denials.is_empty() {
            // Some changes went through, some were denied: the result says which, so a
            // reviewer (or the verification checks) knows what is missing.
            output.push_str(&format!(
                "\n[permission denied by claude: {}; allow them in executor.claude_allowed_tools]",
                totals.denials.join(", ")
            ));
        }
        let (status, error) = match end {
            End::Ok => (ExecStatus::Succeeded, None),
            End::Failed(e) => (ExecStatus::Failed, Some(e)),
            End::TimedOut(detail) => (
                ExecStatus::TimedOut,
                Some(format!(
                    "claude timed out after {} s (executor timeout for this tier); its process group was killed{detail}",
                    timeout.as_secs()
                )),
            ),
            End::Cancelled => (ExecStatus::Cancelled, Some("cancelled".into())),
        };
        if totals.subscription && totals.cost_usd > 0.0 {
            ctx.progress.emit(ProgressEvent::status(format!(
                "claude cost ${:.4} is an API-equivalent estimate (subscription login), not spend",
                totals.cost_usd
            )));
        }
        ExecOutcome {
            status,
            output,
            model_used: Some(totals.model.clone().unwrap_or(model)),
            tokens_in: totals.tokens_in,
            tokens_out: totals.tokens_out,
            cost_usd: totals.cost_usd,
            equivalent_claude_cost_usd: totals.cost_usd,
            cost_is_estimate: totals.subscription || totals.estimated,
            error,
            execution_ms: started.elapsed().as_millis() as u64,
            termination_reason: None,
            iterations_used: totals.turns,
            permission_denials: totals.denials,
            narrative: totals.narrative,
            shell_runs: Vec::new(),
        }
    }
}

/// The argv, cwd, env and stdin of one run (see the module docs for the flags).
pub fn build_spec(program: &Path, ctx: &ExecContext, prompt: &str, model: &str) -> CommandSpec {
    let cfg = &ctx.config.executor;
    // The agent's own credential (`[env] agent`) reaches the agent, no other child.
    let mut spec = CommandSpec::new(program, &ctx.workspace, ctx.env.for_agent())
        .args(["-p", "--output-format", "stream-json", "--verbose"])
        .args(["--model", model])
        .args(["--permission-mode", "acceptEdits"])
        .args(safety_args())
        .arg("--max-turns")
        .arg(cfg.claude_max_turns.to_string());
    if let Some(budget) = ctx.remaining_budget_usd {
        spec = spec
            .arg("--max-budget-usd")
            .arg(format!("{:.4}", budget.max(0.0)));
    }
    if !cfg.claude_allowed_tools.is_empty() {
        // Variadic option: one value per tool; the next `--flag` ends the list.
        spec = spec.arg("--allowedTools").args(&cfg.claude_allowed_tools);
    }
    spec = spec.args(&cfg.claude_extra_args);
    spec.env.set(
        "CLAUDE_CODE_MAX_RETRIES",
        &cfg.claude_api_max_retries.to_string(),
    );
    spec.stdin = Some(prompt.as_bytes().to_vec());
    spec
}

/// Flags that keep repository content from configuring the CLI, and no transcript on disk.
pub fn safety_args() -> [&'static str; 4] {
    [
        "--setting-sources",
        "user",
        "--strict-mcp-config",
        "--no-session-persistence",
    ]
}

/// Extra silence allowed while a tool call runs: the CLI's Bash tool may run 10 minutes.
const TOOL_SILENCE: Duration = Duration::from_secs(600);

/// How one process ended, as far as this executor is concerned.
enum RunEnd {
    /// It exited, or was stopped after its result line (`after_result`).
    Exited {
        after_result: bool,
    },
    TimedOut,
    Cancelled,
    /// Killed by the no-output watchdog after this many seconds of silence.
    Idle(u64),
}

struct RunResult {
    end: RunEnd,
    exit: Exit,
    stderr: String,
    stream: StreamState,
}

impl RunResult {
    fn failure(&self) -> Option<ClaudeFailure> {
        let exit_ok =
            self.exit.success() || matches!(self.end, RunEnd::Exited { after_result: true });
        self.stream.failure(exit_ok, &self.stderr)
    }
}

/// Run `spec` once: stream its lines, stop it a grace period after the result line, kill it
/// when silent for too long.
async fn run_once(
    ctx: &ExecContext,
    spec: CommandSpec,
    model: &str,
    timeout: Duration,
    tokens_base: u64,
) -> std::io::Result<RunResult> {
    let cfg = &ctx.config.executor;
    let limits = Limits {
        timeout: Some(timeout),
        grace: Duration::from_millis(cfg.kill_grace_ms),
        output_cap: cfg.output_cap_bytes,
    };
    ctx.progress
        .emit(ProgressEvent::status(format!("running claude ({model})")));
    let stream = Mutex::new(StreamState::new(ctx.progress.clone(), model, tokens_base));
    // Our own stop (result seen, or silence) cancels only this child, not the task.
    let child_cancel = ctx.cancel.child_token();
    let result_seen = CancellationToken::new();
    let last_line = Mutex::new(tokio::time::Instant::now());
    let idle_killed = AtomicBool::new(false);
    let after_result = AtomicBool::new(false);
    let mut on_line = |line: &str| {
        *last_line.lock().expect("not poisoned") = tokio::time::Instant::now();
        if stream.lock().expect("not poisoned").line(line) {
            result_seen.cancel();
        }
    };
    let idle = Duration::from_secs(cfg.claude_idle_timeout_secs.max(1));
    let result_grace = Duration::from_millis(cfg.claude_result_grace_ms);
    // Silence while a tool runs is normal up to the Bash tool's own 10 min limit.
    let quiet_limit = || {
        if stream.lock().expect("not poisoned").tool_running() {
            idle + TOOL_SILENCE
        } else {
            idle
        }
    };
    let watchdog = async {
        loop {
            let quiet_until = *last_line.lock().expect("not poisoned") + quiet_limit();
            tokio::select! {
                _ = result_seen.cancelled() => {
                    tokio::time::sleep(result_grace).await;
                    after_result.store(true, Ordering::SeqCst);
                    child_cancel.cancel();
                    return std::future::pending::<()>().await;
                }
                _ = tokio::time::sleep_until(quiet_until) => {
                    if *last_line.lock().expect("not poisoned") + quiet_limit() <= tokio::time::Instant::now() {
                        idle_killed.store(true, Ordering::SeqCst);
                        child_cancel.cancel();
                        return std::future::pending::<()>().await;
                    }
                }
            }
        }
    };
    let out = tokio::select! {
        out = process::run_with(&spec, &limits, &child_cancel, None, Some(&mut on_line)) => out?,
        _ = watchdog => unreachable!("the watchdog never completes"),
    };
    let mut stream = stream.into_inner().expect("not poisoned");
    stream.flush_pending_tools();
    let end = match out.exit {
        Exit::TimedOut => RunEnd::TimedOut,
        Exit::Cancelled if ctx.cancel.is_cancelled() => RunEnd::Cancelled,
        Exit::Cancelled if idle_killed.load(Ordering::SeqCst) => RunEnd::Idle(idle.as_secs()),
        Exit::Cancelled => RunEnd::Exited {
            after_result: after_result.load(Ordering::SeqCst),
        },
        _ => RunEnd::Exited {
            after_result: false,
        },
    };
    if matches!(end, RunEnd::Exited { after_result: true }) {
        tracing::debug!(task_id = %ctx.task.task_id, "claude lingered after its result line; stopped");
    }
    Ok(RunResult {
        end,
        exit: out.exit,
        stderr: out.stderr,
        stream,
    })
}

/// For a run that was killed: what it was doing (the API retrying?) and the estimated cost.
fn timeout_detail(s: &StreamState) -> String {
    let mut d = String::new();
    if let Some((status, error)) = &s.last_retry {
        d.push_str(&format!(
            "; the API was failing ({error}, status {}) and the CLI had retried {} times",
            status.map_or("none".into(), |s| s.to_string()),
            s.retries_seen
        ));
    }
    let (_, _, usd) = s.usage();
    if usd > 0.0 {
        d.push_str(&format!("; estimated cost so far ${usd:.4}"));
    }
    d
}

/// `routing_decision.selected_model` when it names a Claude model, else `executor.claude_model`.
fn select_model(ctx: &ExecContext) -> String {
    ctx.task
        .routing_decision
        .as_ref()
        .and_then(|r| r.selected_model.as_deref())
        .map(str::trim)
        .filter(|m| is_claude_model(m))
        .map(str::to_string)
        .unwrap_or_else(|| ctx.config.executor.claude_model.clone())
}

/// Whether `--model` would accept this name: a priced Claude model or any `claude…` name.
fn is_claude_model(m: &str) -> bool {
    !m.is_empty() && (cost::price(m).is_some() || m.to_ascii_lowercase().contains("claude"))
}

/// Sums over the tries of one attempt.
#[derive(Default)]
struct Totals {
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: f64,
    turns: Option<u32>,
    model: Option<String>,
    last_output: String,
    denials: Vec<String>,
    /// A subscription login (`apiKeySource: none`): the CLI's cost is an estimate.
    subscription: bool,
    /// Some run had no result line: its cost is estimated from the usage seen.
    estimated: bool,
    /// The first run's opening words (its plan), kept when a crashed run is retried.
    narrative: String,
}

impl Totals {
    fn add(&mut self, s: &StreamState) {
        let (tin, tout, usd) = s.usage();
        self.tokens_in += tin;
        self.tokens_out += tout;
        self.cost_usd += usd;
        self.estimated |= s.result.is_none() && usd > 0.0;
        self.subscription |= s.api_key_source.as_deref() == Some("none");
        if self.narrative.is_empty() {
            self.narrative = s.head_text.clone();
        }
        // Per message id (one message arrives as one event per content block); the result's
        // `num_turns` only when no message was seen.
        let turns = match s.turns() {
            0 => s.result.as_ref().and_then(|r| r.num_turns).unwrap_or(0),
            n => n,
        };
        if turns > 0 {
            self.turns = Some(self.turns.unwrap_or(0) + turns);
        }
        if let Some(r) = &s.result {
            self.denials.extend(r.denials.iter().cloned());
        }
        if let Some(m) = s
            .result
            .as_ref()
            .and_then(|r| r.model.clone())
            .or(s.model.clone())
        {
            self.model = Some(m);
        }
    }
}

enum End {
    Ok,
    Failed(String),
    /// With what the run was doing when killed.
    TimedOut(String),
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::process::ChildEnv;
    use crate::progress::ProgressSink;
    use std::sync::Arc;

    fn ctx(edit: impl FnOnce(&mut Config), budget: Option<f64>) -> ExecContext {
        let mut config = Config::default();
        edit(&mut config);
        let task: crate::task::Task =
            serde_json::from_value(serde_json::json!({"task_id": "t", "description": "d"}))
                .unwrap();
        ExecContext {
            task: Arc::new(task),
            workspace: PathBuf::from("/w"),
            config: Arc::new(config),
            env: ChildEnv::default(),
            progress: ProgressSink::new(1024),
            cancel: CancellationToken::new(),
            remaining_budget_usd: budget,
        }
    }

    fn argv(spec: &CommandSpec) -> Vec<String> {
        spec.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_prompt_goes_on_stdin_and_the_safety_flags_are_always_there() {
        let c = ctx(|_| {}, None);
        let prompt = "-p --dangerously-skip-permissions ".repeat(10_000);
        let spec = build_spec(Path::new("claude"), &c, &prompt, "claude-sonnet-4-5");
        let a = argv(&spec);
        assert_eq!(spec.stdin.as_deref(), Some(prompt.as_bytes()));
        assert!(!a.iter().any(|x| x.contains("dangerously")), "{a:?}");
        let joined = a.join(" ");
        for flag in [
            "-p --output-format stream-json --verbose",
            "--model claude-sonnet-4-5",
            "--permission-mode acceptEdits",
            "--setting-sources user --strict-mcp-config --no-session-persistence",
            "--max-turns 50",
        ] {
            assert!(joined.contains(flag), "missing `{flag}` in {joined}");
        }
        assert!(!joined.contains("--max-budget-usd"), "{joined}");
        assert!(!joined.contains("--allowedTools"), "{joined}");
        assert!(spec
            .env
            .vars()
            .iter()
            .any(|(k, v)| k == "CLAUDE_CODE_MAX_RETRIES" && v == "4"));
    }

    #[test]
    fn budget_turns_and_allowed_tools_come_from_config_and_context() {
        let c = ctx(
            |c| {
                c.executor.claude_allowed_tools = vec!["Bash(cargo:*)".into(), "Edit".into()];
                c.executor.claude_max_turns = 7;
                c.executor.claude_api_max_retries = 1;
                c.executor.claude_extra_args = vec!["--effort".into(), "low".into()];
            },
            Some(0.25),
        );
        let spec = build_spec(Path::new("claude"), &c, "hi", "m");
        let joined = argv(&spec).join(" ");
        assert!(joined.contains("--max-turns 7"), "{joined}");
        assert!(joined.contains("--max-budget-usd 0.2500"), "{joined}");
        // The tool list is followed by a flag, which ends the variadic option.
        assert!(
            joined.ends_with("--allowedTools Bash(cargo:*) Edit --effort low"),
            "{joined}"
        );
        assert!(spec
            .env
            .vars()
            .iter()
            .any(|(k, v)| k == "CLAUDE_CODE_MAX_RETRIES" && v == "1"));
    }

    #[test]
    fn claude_model_detection() {
        assert!(is_claude_model("claude-opus-4-6"));
        assert!(is_claude_model("sonnet"));
        assert!(!is_claude_model("qwen3:8b"));
        assert!(!is_claude_model(""));
    }
}
