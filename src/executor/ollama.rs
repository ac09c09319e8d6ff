//! The Ollama executor: `/api/chat` as a plain streamed chat, or as an agentic tool loop
//! over the workspace ([`super::tools`]).
//!
//! The executor lives for the whole task and keeps the chat `messages` across attempts, as the
//! specification asks: a corrective attempt continues the same chat with a **short**
//! corrective turn (what failed: [`Attempt::followup`]), so the model keeps its tool
//! transcript, its plan and its own answer. Only a chat that is gone (a new executor after a
//! restart) starts from the self-contained corrective prompt ([`Attempt::prompt`]).
//!
//! The chat is kept within the model's window by `fit_context` before every call: the
//! system prompt and the task (the first user message) stay, the newest turns stay whole,
//! and older tool results and answers are summarised (then, if that is not enough, folded
//! into one line each), so 20 iterations of 16 KiB tool results never push the task out.
//! The estimate is deliberately conservative (3 characters a token, a quarter of `num_ctx`
//! left for the answer). Every call sets `options.num_ctx` (`executor.ollama_num_ctx`), and a
//! prompt that still fills it (Ollama's `prompt_eval_count` reaching `num_ctx`: it cut the
//! beginning) is reported.
//!
//! # Wire format (Ollama `/api/chat`)
//!
//! Request: `{"model", "messages": [{"role", "content", "tool_calls"?, "tool_name"?}],
//! "stream", "tools"?}`. Response: NDJSON lines `{"model", "created_at", "message":
//! {"role": "assistant", "content", "tool_calls"?: [{"function": {"name", "arguments":
//! {…}}}]}, "done": false}`, the last one with `"done": true`, `prompt_eval_count` and
//! `eval_count`. With `stream: false` the body is that last line alone, message complete.
//! A failure mid-stream is a line `{"error": "…"}`.
//!
//! # Agentic loop: when it stops (`termination_reason`)
//!
//! - `final_answer`: an assistant message without tool calls, once at least one tool round
//!   has happened. Before any tool round such a message is answered with a nudge to use the
//!   tools (a model that only describes a change has not made it);
//! - `no_tool_calls`: still no tool call after 2 nudges;
//! - `repetition`: the same tool calls (names and arguments) as the previous round;
//! - `stall`: 5 iterations without a successful `write_file` since the last one;
//! - `max_iterations`: the tier's cap (trivial 5, standard 10, complex 20) of LLM calls;
//! - `cancelled`, `timeout` (the tier's execution timeout), `error` (HTTP failures after
//!   retries). Only the last three are not [`ExecStatus::Succeeded`]: whether the work is
//!   good is for verification to say.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::Config;
use crate::cost;
use crate::progress::{EventKind, ProgressEvent};
use crate::task::{Task, Tier};
use crate::util::truncate_chars;

use super::ollama_context::{fit_context, report_context_overflow};
use super::ollama_message::{one_line, parse_call};
use super::ollama_stream::{ChatError, ChatReply, LineParser, MAX_LINE_BYTES, MAX_RESPONSE_BYTES};
use super::tools::{self, Tools};
use super::{Attempt, ExecContext, ExecOutcome, ExecStatus, ExecutorError};

/// Used when neither the routing decision nor `ollama_url` names an endpoint.
pub const DEFAULT_URL: &str = "http://localhost:11434";

/// Nudges (user messages asking for tool use) before giving up with `no_tool_calls`.
const MAX_NUDGES: u32 = 2;
/// Iterations without a successful write (after the first one) that count as a stall.
const STALL_ITERATIONS: u32 = 5;

const SYSTEM_PROMPT: &str = "You are a coding agent working inside a project workspace. \
Use the tools to inspect and change it: read_file, write_file, list_directory, search_files, \
run_command. Paths are relative to the workspace root and cannot leave it; network and \
privilege tools are not available. Make the change the task asks for by writing files, check \
it (for example by running the tests), then reply with a short summary of what you did and \
no tool calls.";

const NUDGE: &str = "You have not used any tool yet. Do the task with the tools (write_file to \
change files, run_command to check them) instead of describing the change.";

/// The one place a task's Ollama endpoint is resolved (executor and judge): the routing
/// decision's `selected_endpoint` (`host:port`), else `ollama_url`, else [`DEFAULT_URL`], as
/// a base URL without a trailing slash.
pub fn endpoint(task: &Task, cfg: &Config) -> String {
    let chosen = task
        .routing_decision
        .as_ref()
        .and_then(|r| r.selected_endpoint.as_deref())
        .filter(|s| !s.trim().is_empty())
        .or(cfg.ollama_url.as_deref())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or(DEFAULT_URL);
    crate::util::http_base_url(chosen)
}

/// Why the agentic loop stopped (see the module docs); recorded as `termination_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentStop {
    FinalAnswer,
    NoToolCalls,
    Repetition,
    Stall,
    MaxIterations,
    Cancelled,
    Timeout,
    Error,
}

impl AgentStop {
    fn as_str(self) -> &'static str {
        match self {
            AgentStop::FinalAnswer => "final_answer",
            AgentStop::NoToolCalls => "no_tool_calls",
            AgentStop::Repetition => "repetition",
            AgentStop::Stall => "stall",
            AgentStop::MaxIterations => "max_iterations",
            AgentStop::Cancelled => "cancelled",
            AgentStop::Timeout => "timeout",
            AgentStop::Error => "error",
        }
    }
}

/// Runs a task against one Ollama endpoint and model, keeping the conversation.
pub struct OllamaExecutor {
    /// Built on first use, off the runtime (it reads the system's root certificates).
    client: Option<reqwest::Client>,
    base_url: String,
    model: String,
    agentic: bool,
    /// The chat so far, across attempts.
    messages: Vec<Value>,
    /// Built on first agentic use (it canonicalizes the workspace, off the runtime).
    tools: Option<Tools>,
}

/// Why a chat call did not produce a message.
enum CallError {
    /// HTTP or protocol failure after all retries; the text says what and where.
    Failed(String),
    Cancelled,
    TimedOut,
}

impl OllamaExecutor {
    /// Endpoint: `routing_decision.selected_endpoint` (`host:port`), else `ollama_url`, else
    /// [`DEFAULT_URL`]. Model: `routing_decision.selected_model`, else `executor.ollama_model`.
    /// Agentic unless `metadata.agentic` is false (every task has a workspace to work in).
    pub fn new(ctx: &ExecContext) -> Result<OllamaExecutor, ExecutorError> {
        let rd = ctx.task.routing_decision.as_ref();
        let base_url = endpoint(&ctx.task, &ctx.config);
        let agentic = ctx.task.metadata.agentic.unwrap_or(true);
        // An agentic loop executes what the answer says: the answer must come from this
        // host or over TLS, not from whoever sits on the network path.
        if agentic
            && base_url.starts_with("http://")
            && !crate::util::is_loopback_url(&base_url)
            && !ctx.config.executor.ollama_allow_insecure_remote
        {
            return Err(ExecutorError::InsecureOllama { url: base_url });
        }
        let model = rd
            .and_then(|r| r.selected_model.as_deref())
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(&ctx.config.executor.ollama_model)
            .to_string();
        Ok(OllamaExecutor {
            client: None,
            base_url,
            model,
            agentic,
            messages: Vec::new(),
            tools: None,
        })
    }

    /// `http://host:port` this executor talks to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The model every call of this task uses.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Whether attempts run the tool loop (else a plain chat reply).
    pub fn is_agentic(&self) -> bool {
        self.agentic
    }

    /// Run one attempt: the prompt as a new user message, then a plain reply or the tool loop.
    pub async fn execute(&mut self, ctx: &ExecContext, attempt: &Attempt) -> ExecOutcome {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + ctx.llm_timeout();
        if self.client.is_none() {
            let built = tokio::task::spawn_blocking(|| reqwest::Client::builder().build()).await;
            match built {
                Ok(Ok(c)) => self.client = Some(c),
                Ok(Err(e)) => {
                    return ExecOutcome::failed(format!(
                        "cannot build the HTTP client for Ollama: {e}"
                    ))
                }
                Err(e) => {
                    return ExecOutcome::failed(format!(
                        "building the HTTP client for Ollama panicked: {e}"
                    ))
                }
            }
        }
        let mut out = if self.agentic {
            self.run_agentic(ctx, attempt, deadline).await
        } else {
            self.run_plain(ctx, attempt, deadline).await
        };
        out.model_used = Some(self.model.clone());
        out.cost_usd = 0.0;
        out.equivalent_claude_cost_usd =
            cost::equivalent_claude_cost(out.tokens_in, out.tokens_out);
        out.execution_ms = started.elapsed().as_millis() as u64;
        out
    }

    /// Whether the chat of earlier attempts is here to continue (a new executor, after a
    /// restart, has none).
    pub fn continues_chat(&self) -> bool {
        self.messages.iter().any(|m| m["role"] == "user")
    }

    /// The user message that opens an attempt: the short corrective turn when the chat of
    /// the earlier attempts is still here, else the full prompt.
    fn open_attempt(&mut self, ctx: &ExecContext, attempt: &Attempt) {
        let text = match &attempt.followup {
            Some(turn) if self.continues_chat() => {
                ctx.progress.emit(ProgressEvent::status(format!(
                    "attempt {}: continuing the chat ({} messages) with a corrective turn",
                    attempt.number,
                    self.messages.len()
                )));
                turn.clone()
            }
            _ => attempt.prompt.clone(),
        };
        self.messages.push(json!({"role": "user", "content": text}));
    }

    async fn run_plain(
        &mut self,
        ctx: &ExecContext,
        attempt: &Attempt,
        deadline: tokio::time::Instant,
    ) -> ExecOutcome {
        self.open_attempt(ctx, attempt);
        fit_context(ctx, &mut self.messages);
        ctx.progress.emit(ProgressEvent::status(format!(
            "asking {} ({})",
            self.model, self.base_url
        )));
        let body = json!({"model": self.model, "messages": self.messages, "stream": true,
                          "options": options(ctx)});
        match self.chat(ctx, &body, deadline, 0).await {
            Ok(r) => {
                self.messages
                    .push(json!({"role": "assistant", "content": r.content}));
                let mut out = ExecOutcome::new(ExecStatus::Succeeded, r.content.clone(), None);
                out.narrative = truncate_chars(&r.content, NARRATIVE_HEAD_CHARS);
                out.tokens_in = r.tokens_in;
                out.tokens_out = r.tokens_out;
                out
            }
            Err(e) => call_error_outcome(e, ctx),
        }
    }

    async fn run_agentic(
        &mut self,
        ctx: &ExecContext,
        attempt: &Attempt,
        deadline: tokio::time::Instant,
    ) -> ExecOutcome {
        let tools = match &self.tools {
            Some(t) => t.clone(),
            None => {
                let cfg = &ctx.config.executor;
                match Tools::new(
                    &ctx.workspace,
                    ctx.env.clone(),
                    Duration::from_millis(cfg.kill_grace_ms),
                    cfg.output_cap_bytes,
                )
                .await
                {
                    Ok(t) => self.tools.insert(t).clone(),
                    Err(e) => return ExecOutcome::failed(e.to_string()),
                }
            }
        };
        if self.messages.is_empty() {
            self.messages
                .push(json!({"role": "system", "content": SYSTEM_PROMPT}));
        }
        self.open_attempt(ctx, attempt);
        let cap = match ctx.task.tier() {
            Tier::Trivial => 5,
            Tier::Standard => 10,
            Tier::Complex => 20,
        };
        ctx.progress.emit(ProgressEvent::status(format!(
            "agentic loop with {} ({}), up to {cap} iterations",
            self.model, self.base_url
        )));
        let schemas = tools::schemas();
        let (mut tokens_in, mut tokens_out) = (0u64, 0u64);
        let (mut iterations, mut nudges, mut tool_rounds) = (0u32, 0u32, 0u32);
        let mut last_write: Option<u32> = None;
        let mut prev_calls: Option<String> = None;
        let mut final_text = String::new();
        let mut narrative = String::new();
        let mut error = None;
        let reason = 'run: loop {
            if iterations >= cap {
                break AgentStop::MaxIterations;
            }
            iterations += 1;
            fit_context(ctx, &mut self.messages);
            let body = json!({"model": self.model, "messages": self.messages,
                              "tools": schemas, "stream": false, "options": options(ctx)});
            let r = match self.chat(ctx, &body, deadline, tokens_out).await {
                Ok(r) => r,
                Err(CallError::Cancelled) => break AgentStop::Cancelled,
                Err(CallError::TimedOut) => break AgentStop::Timeout,
                Err(CallError::Failed(e)) => {
                    error = Some(e);
                    break AgentStop::Error;
                }
            };
            tokens_in += r.tokens_in;
            tokens_out += r.tokens_out;
            if !r.content.trim().is_empty() {
                final_text = r.content.clone();
                if narrative.len() < NARRATIVE_HEAD_CHARS {
                    narrative.push_str(&r.content);
                    narrative.push('\n');
                    narrative = truncate_chars(&narrative, NARRATIVE_HEAD_CHARS);
                }
                ctx.progress.emit(
                    ProgressEvent::new(EventKind::Token, r.content.clone())
                        .with_tokens(tokens_out, Some(&self.model)),
                );
            }
            let mut msg = json!({"role": "assistant", "content": r.content});
            if !r.tool_calls.is_empty() {
                msg["tool_calls"] = Value::Array(r.tool_calls.clone());
            }
            self.messages.push(msg);

            if r.tool_calls.is_empty() {
                if tool_rounds > 0 {
                    break AgentStop::FinalAnswer;
                }
                if nudges >= MAX_NUDGES {
                    break AgentStop::NoToolCalls;
                }
                nudges += 1;
                self.messages
                    .push(json!({"role": "user", "content": NUDGE}));
                continue;
            }

            let calls: Vec<(String, Value)> = r.tool_calls.iter().map(parse_call).collect();
            let signature = serde_json::to_string(&calls).unwrap_or_default();
            if prev_calls.as_deref() == Some(signature.as_str()) {
                // Answer every call so the history stays well-formed for a corrective attempt.
                for (name, _) in &calls {
                    self.messages.push(json!({"role": "tool", "tool_name": name,
                        "content": "not run: identical to your previous call"}));
                }
                break AgentStop::Repetition;
            }
            prev_calls = Some(signature);
            tool_rounds += 1;
            for (name, args) in &calls {
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                let res = tokio::select! {
                    _ = ctx.cancel.cancelled() => break 'run AgentStop::Cancelled,
                    _ = tokio::time::sleep_until(deadline) => break 'run AgentStop::Timeout,
                    res = tools.call(name, args, &ctx.cancel, remaining) => res,
                };
                if res.wrote {
                    last_write = Some(iterations);
                }
                let args_summary = truncate_chars(&one_line(&args.to_string()), 200);
                let result_summary = truncate_chars(&one_line(&res.output), 200);
                tracing::debug!(task_id = %ctx.task.task_id, iteration = iterations, tool = %name, ok = res.ok, "tool call");
                ctx.progress.emit(
                    ProgressEvent::new(EventKind::ToolCall, format!("{name} {args_summary}"))
                        .with("tool_name", name.as_str())
                        .with("args_summary", args_summary)
                        .with("result_summary", result_summary)
                        .with("iteration", iterations)
                        .with_tokens(tokens_out, Some(&self.model)),
                );
                self.messages
                    .push(json!({"role": "tool", "tool_name": name, "content": res.output}));
            }
            if ctx.cancel.is_cancelled() {
                break AgentStop::Cancelled;
            }
            if tokio::time::Instant::now() >= deadline {
                break AgentStop::Timeout;
            }
            if last_write.is_some_and(|w| iterations - w >= STALL_ITERATIONS) {
                break AgentStop::Stall;
            }
        };
        let status = match reason {
            AgentStop::Cancelled => ExecStatus::Cancelled,
            AgentStop::Timeout => ExecStatus::TimedOut,
            AgentStop::Error => ExecStatus::Failed,
            _ => ExecStatus::Succeeded,
        };
        let error = match reason {
            AgentStop::Cancelled => Some("cancelled".to_string()),
            AgentStop::Timeout => Some(format!(
                "the agentic loop timed out after {} s (executor timeout for this tier)",
                ctx.llm_timeout().as_secs()
            )),
            _ => error,
        };
        if final_text.is_empty() {
            final_text = format!(
                "agentic loop ended ({}) after {iterations} iterations",
                reason.as_str()
            );
        }
        tracing::info!(task_id = %ctx.task.task_id, reason = reason.as_str(), iterations, tokens_in, tokens_out, "agentic loop done");
        let mut out = ExecOutcome::new(status, final_text, error);
        out.tokens_in = tokens_in;
        out.tokens_out = tokens_out;
        out.termination_reason = Some(reason.as_str().to_string());
        out.iterations_used = Some(iterations);
        out.narrative = narrative;
        out
    }

    /// One `/api/chat` call, retried `ollama_retries` times on HTTP failure; cancellation
    /// and the attempt's deadline interrupt it at any point.
    async fn chat(
        &self,
        ctx: &ExecContext,
        body: &Value,
        deadline: tokio::time::Instant,
        tokens_base: u64,
    ) -> Result<ChatReply, CallError> {
        let tries = ctx.config.executor.ollama_retries + 1;
        let mut last: Option<ChatError> = None;
        for n in 1..=tries {
            if n > 1 {
                let delay = Duration::from_millis(200 << (n - 2).min(5));
                ctx.progress.emit(ProgressEvent::new(
                    EventKind::Error,
                    format!(
                        "ollama call failed ({}); retry {} in {} ms",
                        last.as_ref().map(ToString::to_string).unwrap_or_default(),
                        n - 1,
                        delay.as_millis()
                    ),
                ));
                tokio::select! {
                    _ = ctx.cancel.cancelled() => return Err(CallError::Cancelled),
                    _ = tokio::time::sleep_until(deadline) => return Err(CallError::TimedOut),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            tokio::select! {
                _ = ctx.cancel.cancelled() => return Err(CallError::Cancelled),
                _ = tokio::time::sleep_until(deadline) => return Err(CallError::TimedOut),
                r = self.chat_once(ctx, body, tokens_base) => match r {
                    Ok(reply) => {
                        report_context_overflow(ctx, &self.model, reply.tokens_in);
                        return Ok(reply);
                    }
                    Err(e) => {
                        tracing::warn!(task_id = %ctx.task.task_id, try_ = n, error = %e, "ollama call failed");
                        last = Some(e);
                    }
                },
            }
        }
        Err(CallError::Failed(format!(
            "ollama /api/chat at {} (model {}) failed after {tries} tries: {}; check that Ollama is running there and has the model",
            self.base_url,
            self.model,
            last.as_ref().map(ToString::to_string).unwrap_or_default()
        )))
    }

    /// One HTTP call; NDJSON lines parsed as they arrive (a non-streamed body is one line).
    async fn chat_once(
        &self,
        ctx: &ExecContext,
        body: &Value,
        tokens_base: u64,
    ) -> Result<ChatReply, ChatError> {
        let url = format!("{}/api/chat", self.base_url);
        let timeout = Duration::from_secs(ctx.config.executor.ollama_timeout_secs.max(1));
        let client = self.client.as_ref().ok_or(ChatError::NoClient)?;
        let mut resp = client
            .post(&url)
            .timeout(timeout)
            .json(body)
            .send()
            .await
            .map_err(ChatError::Request)?;
        let status = resp.status();
        if !status.is_success() {
            // Only the start of the body is reported: read no more than that.
            let mut body = Vec::new();
            while body.len() < 4096 {
                match resp.chunk().await {
                    Ok(Some(c)) => body.extend_from_slice(&c),
                    _ => break,
                }
            }
            let text = String::from_utf8_lossy(&body);
            return Err(ChatError::Status {
                status,
                body: truncate_chars(text.trim(), 500),
            });
        }
        let streaming = body.get("stream").and_then(Value::as_bool) == Some(true);
        let mut parse = LineParser {
            reply: ChatReply::default(),
            done: false,
            chunks: 0,
            on_token: |t: &str, n: u64| {
                if streaming {
                    ctx.progress.emit(
                        ProgressEvent::new(EventKind::Token, t)
                            .with_tokens(tokens_base + n, Some(&self.model)),
                    );
                }
            },
        };
        let mut buf: Vec<u8> = Vec::new();
        let mut total = 0usize;
        while let Some(chunk) = resp.chunk().await.map_err(ChatError::Read)? {
            // A server that never stops (or never ends a line) must not grow the daemon.
            total += chunk.len();
            if total > MAX_RESPONSE_BYTES || buf.len() + chunk.len() > MAX_LINE_BYTES {
                return Err(ChatError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
            while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                parse.line(&line)?;
            }
        }
        parse.line(&buf)?;
        let LineParser { reply, done, .. } = parse;
        if !done {
            return Err(ChatError::NoDone);
        }
        Ok(reply)
    }
}

/// Characters of the model's words kept for the loop to find the plan in.
const NARRATIVE_HEAD_CHARS: usize = crate::plan::NARRATIVE_HEAD_BYTES;

/// `options` of every chat request.
fn options(ctx: &ExecContext) -> Value {
    json!({"num_ctx": ctx.config.executor.ollama_num_ctx})
}

fn call_error_outcome(e: CallError, ctx: &ExecContext) -> ExecOutcome {
    match e {
        CallError::Failed(msg) => ExecOutcome::new(ExecStatus::Failed, String::new(), Some(msg)),
        CallError::Cancelled => ExecOutcome::new(
            ExecStatus::Cancelled,
            String::new(),
            Some("cancelled".into()),
        ),
        CallError::TimedOut => ExecOutcome::new(
            ExecStatus::TimedOut,
            String::new(),
            Some(format!(
                "ollama timed out after {} s (executor timeout for this tier)",
                ctx.llm_timeout().as_secs()
            )),
        ),
    }
}
