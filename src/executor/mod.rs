//! The executors behind one seam: shell, Claude Code CLI, Ollama.
//!
//! An [`Executor`] is created once per task (so the Ollama executor can keep its chat
//! history across corrective attempts) and [`Executor::execute`]d once per attempt with the
//! prompt for that attempt. Every executor honours the cancellation token, its timeout, and
//! reports through the [`ProgressSink`].
//!
//! # Layout
//!
//! - [`shell`]: `metadata.shell_command` via `sh -c`, in a process group.
//! - [`claude`]: the Claude Code CLI: flags, run, stop, retry.
//! - [`claude_stream`]: its `stream-json` lines, usage and typed failures.
//! - [`ollama`]: `/api/chat` calls, and the agentic tool loop; `ollama_stream`: one
//!   response's NDJSON lines folded into a reply, and its bounds; `ollama_context`: the chat
//!   kept inside the context window; `ollama_message`: reading a chat message (tool calls,
//!   one-line summaries), used by both.
//! - [`tools`]: the agentic tools and their workspace sandbox.

pub mod claude;
pub mod claude_stream;
pub mod ollama;
mod ollama_context;
mod ollama_message;
mod ollama_stream;
pub mod shell;
pub mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::process::ChildEnv;
use crate::progress::ProgressSink;
use crate::task::{ExecutorKind, RoutingError, Task, Tier};

/// Why no executor can run a task; the message is the task's `task_failed` reason.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The routing decision names no executor this sidecar has.
    #[error(transparent)]
    Routing(#[from] RoutingError),
    /// A shell task without `metadata.shell_command`.
    #[error("shell task has no metadata.shell_command; the description is prose and is never run as a command. Route the task to an LLM executor or give it a shell_command")]
    NoShellCommand,
    /// The `claude` CLI is not where the config or PATH says.
    #[error(transparent)]
    ClaudeNotFound(#[from] claude::LocateError),
    /// The agentic Ollama loop would take tool calls over plain http from another host.
    #[error("refused: the agentic Ollama loop would run tool calls answered over plain http by {url}; use an https:// endpoint, run Ollama on this host, or set executor.ollama_allow_insecure_remote = true if the network path is trusted")]
    InsecureOllama {
        /// The endpoint's base URL.
        url: String,
    },
}

/// Everything an executor may use; shared by all attempts of one task.
#[derive(Clone)]
pub struct ExecContext {
    /// The task being run.
    pub task: Arc<Task>,
    /// Where the work happens (cwd of every command, root of the tool sandbox).
    pub workspace: PathBuf,
    /// The daemon's configuration.
    pub config: Arc<Config>,
    /// The environment (and sandbox) every child of the task gets.
    pub env: ChildEnv,
    /// Where progress events go.
    pub progress: ProgressSink,
    /// Cancelled on `task_cancelled`, `state_report_ack{abort}` and forced shutdown.
    pub cancel: CancellationToken,
    /// USD this attempt may still spend under the task and daily caps (the smaller), set by
    /// the verification loop before each execution and passed to `claude --max-budget-usd`;
    /// `None` = no cap applies.
    pub remaining_budget_usd: Option<f64>,
}

impl ExecContext {
    /// Execution timeout for LLM executors by tier.
    pub fn llm_timeout(&self) -> Duration {
        let e = &self.config.executor;
        Duration::from_secs(match self.task.tier() {
            Tier::Trivial => e.trivial_timeout_secs,
            Tier::Standard | Tier::Complex => e.standard_timeout_secs,
        })
    }
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    /// The executor ran to its end; verification decides whether the work is good.
    Succeeded,
    /// The executor itself failed (non-zero exit, CLI missing, HTTP errors after retries).
    Failed,
    /// The executor's timeout ended it; its process group was killed.
    TimedOut,
    /// The task was cancelled while it ran.
    Cancelled,
}

/// What one execution produced. Tokens and cost are for this execution only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// How the execution ended.
    pub status: ExecStatus,
    /// What it produced: the command's output or the model's final answer.
    pub output: String,
    /// The model that answered, when an LLM did.
    pub model_used: Option<String>,
    /// Input tokens.
    pub tokens_in: u64,
    /// Output tokens.
    pub tokens_out: u64,
    /// USD, as reported by the CLI or estimated from the cost table; 0 for Ollama.
    pub cost_usd: f64,
    /// What the tokens would have cost on the reference Claude model.
    pub equivalent_claude_cost_usd: f64,
    /// The cost is an estimate, not spend: a subscription login (API-equivalent figure) or a
    /// run killed before it reported its cost.
    #[serde(default)]
    pub cost_is_estimate: bool,
    /// Why it failed, for `task_failed` (≤ 2,000 chars is applied when sending).
    pub error: Option<String>,
    /// Wall time of the execution.
    pub execution_ms: u64,
    /// Agentic loop: why it stopped (`final_answer`, `max_iterations`, `repetition`, `stall`, …).
    pub termination_reason: Option<String>,
    /// Agentic loop: how many model turns it took.
    pub iterations_used: Option<u32>,
    /// Tool calls the agent's permission mode denied, as `Tool(args)`.
    #[serde(default)]
    pub permission_denials: Vec<String>,
    /// The head of what the model said during the attempt (its first messages, up to
    /// [`crate::plan::NARRATIVE_HEAD_BYTES`]): where the loop looks for its plan.
    #[serde(default)]
    pub narrative: String,
    /// Shell: every run of the command, first first (more than one only when the operator
    /// set `executor.shell_retries`); `result.shell_runs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shell_runs: Vec<shell::ShellRun>,
}

impl ExecOutcome {
    /// An outcome with no model, tokens or cost (the executor fills in what it has).
    pub fn new(status: ExecStatus, output: String, error: Option<String>) -> ExecOutcome {
        ExecOutcome {
            status,
            output,
            model_used: None,
            tokens_in: 0,
            tokens_out: 0,
            cost_usd: 0.0,
            equivalent_claude_cost_usd: 0.0,
            cost_is_estimate: false,
            error,
            execution_ms: 0,
            termination_reason: None,
            iterations_used: None,
            permission_denials: Vec::new(),
            narrative: String::new(),
            shell_runs: Vec::new(),
        }
    }

    /// An outcome that never ran (bad routing, missing tool), with an error that says why.
    pub fn failed(error: impl Into<String>) -> ExecOutcome {
        ExecOutcome::new(ExecStatus::Failed, String::new(), Some(error.into()))
    }
}

/// One attempt's input.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1-based.
    pub number: u32,
    /// The full prompt for LLM executors: the initial prompt, or a self-contained corrective
    /// one (task, plan, failures). Shell ignores it.
    pub prompt: String,
    /// For a retry: the short corrective turn (only what failed), for an executor that still
    /// holds the conversation of the earlier attempts and continues it (Ollama). One that
    /// starts afresh (claude, or any executor after a restart) uses `prompt`.
    pub followup: Option<String>,
}

impl Attempt {
    /// A first attempt, or one with no conversation to continue.
    pub fn new(number: u32, prompt: impl Into<String>) -> Attempt {
        Attempt {
            number,
            prompt: prompt.into(),
            followup: None,
        }
    }
}

/// The executor of one task.
pub enum Executor {
    /// `metadata.shell_command` via `sh -c`.
    Shell(shell::ShellExecutor),
    /// The Claude Code CLI.
    Claude(claude::ClaudeExecutor),
    /// An Ollama model, agentic or plain chat.
    Ollama(ollama::OllamaExecutor),
}

impl Executor {
    /// Pick and build the executor for `ctx.task`. An `Err` is a reason for `task_failed`.
    pub fn for_task(ctx: &ExecContext) -> Result<Executor, ExecutorError> {
        let kind = ctx.task.executor_kind()?;
        Ok(match kind {
            ExecutorKind::Shell => Executor::Shell(shell::ShellExecutor::new(ctx)?),
            ExecutorKind::Claude => Executor::Claude(claude::ClaudeExecutor::new(ctx)?),
            ExecutorKind::Ollama => Executor::Ollama(ollama::OllamaExecutor::new(ctx)?),
        })
    }

    /// Which executor this is.
    pub fn kind(&self) -> ExecutorKind {
        match self {
            Executor::Shell(_) => ExecutorKind::Shell,
            Executor::Claude(_) => ExecutorKind::Claude,
            Executor::Ollama(_) => ExecutorKind::Ollama,
        }
    }

    /// Whether the verification loop may re-prompt this executor (never for shell).
    pub fn is_llm(&self) -> bool {
        !matches!(self, Executor::Shell(_))
    }

    /// What `attempt` will be sent as: its short corrective turn when this executor still
    /// holds the conversation of the earlier attempts (Ollama), else its full prompt.
    pub fn prompt_for<'a>(&self, attempt: &'a Attempt) -> &'a str {
        match (self, &attempt.followup) {
            (Executor::Ollama(o), Some(turn)) if o.continues_chat() => turn,
            _ => &attempt.prompt,
        }
    }

    /// Run one attempt.
    pub async fn execute(&mut self, ctx: &ExecContext, attempt: &Attempt) -> ExecOutcome {
        match self {
            Executor::Shell(e) => e.execute(ctx, attempt).await,
            Executor::Claude(e) => e.execute(ctx, attempt).await,
            Executor::Ollama(e) => e.execute(ctx, attempt).await,
        }
    }
}
