//! The Claude Code CLI executor: runs `claude -p PROMPT --output-format stream-json --verbose
//! --model MODEL` (an argv, never a shell string) in the workspace, parses the stream-json
//! lines as they arrive into progress events, and retries a failed run with backoff.
//!
//! # The stream-json lines it understands
//!
//! One JSON object per stdout line, tagged by `type`:
//! - `system` (`subtype: "init"`): carries the `model` actually used.
//! - `assistant`: `message.content[]` of `text` blocks (→ `token` progress) and `tool_use`
//!   blocks (`id`, `name`, `input`), `message.usage.output_tokens`.
//! - `user`: `message.content[]` of `tool_result` blocks (`tool_use_id`, `content`,
//!   `is_error`) → one `tool_call` progress event per tool call, with its result summary.
//! - `result` (last): `subtype`, `is_error`, `result` (the final text), `num_turns`,
//!   `total_cost_usd`, `usage.{input_tokens, output_tokens, cache_creation_input_tokens,
//!   cache_read_input_tokens}`.
//!
//! Anything else (other types, unparseable lines) is logged at debug and skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cost;
use crate::process::{self, CommandSpec, Exit, Limits};
use crate::progress::{EventKind, ProgressEvent, ProgressSink};
use crate::util::{tail_bytes, truncate_chars};

use super::{Attempt, ExecContext, ExecOutcome, ExecStatus};

/// Runs tasks through the `claude` CLI found at construction.
pub struct ClaudeExecutor {
    program: PathBuf,
}

impl ClaudeExecutor {
    /// Locate `claude`: `executor.claude_path`, else the PATH of the child environment
    /// (`ctx.env`, so what the child would find is what we run). `Err` says how to fix it.
    pub fn new(ctx: &ExecContext) -> Result<ClaudeExecutor, String> {
        if let Some(p) = &ctx.config.executor.claude_path {
            return if p.is_file() {
                Ok(ClaudeExecutor { program: p.clone() })
            } else {
                Err(format!(
                    "executor.claude_path {} does not exist or is not a file; install Claude Code (`npm install -g @anthropic-ai/claude-code`) or fix executor.claude_path",
                    p.display()
                ))
            };
        }
        let path = ctx
            .env
            .vars()
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| std::ffi::OsString::from(v))
            .or_else(|| std::env::var_os("PATH"));
        match which::which_in("claude", path, &ctx.workspace) {
            Ok(program) => Ok(ClaudeExecutor { program }),
            Err(e) => Err(format!(
                "the `claude` CLI was not found on PATH ({e}); install it with `npm install -g @anthropic-ai/claude-code` or set executor.claude_path"
            )),
        }
    }

    /// The binary this executor runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Run one attempt: the CLI, retried after `claude_retry_delays_ms` on failure (never on
    /// cancellation or timeout). Tokens and cost are summed over the tries.
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
            let run = self
                .run_once(ctx, attempt, &model, remaining, &totals)
                .await;
            let run = match run {
                Ok(r) => r,
                Err(e) => {
                    break End::Failed(format!(
                        "could not start `{}` in {}: {e}",
                        self.program.display(),
                        ctx.workspace.display()
                    ))
                }
            };
            totals.add(&run.stream, &model);
            match run.exit {
                Exit::TimedOut => break End::TimedOut,
                Exit::Cancelled => break End::Cancelled,
                _ => {}
            }
            let error = run.failure();
            let Some(error) = error else {
                break End::Ok(run.stream.output());
            };
            totals.last_output = run.stream.output();
            let Some(&delay) = delays.get(tries - 1) else {
                break End::Failed(format!("{error} (gave up after {tries} tries)"));
            };
            tracing::warn!(task_id = %ctx.task.task_id, attempt = attempt.number, tries, delay_ms = delay, %error, "claude run failed; retrying");
            ctx.progress.emit(ProgressEvent::new(
                EventKind::Error,
                format!("claude failed ({error}); retry {tries} in {delay} ms"),
            ));
            tokio::select! {
                _ = ctx.cancel.cancelled() => break End::Cancelled,
                _ = tokio::time::sleep_until(deadline) => break End::TimedOut,
                _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
            }
        };
        let (status, output, error) = match end {
            End::Ok(out) => (ExecStatus::Succeeded, out, None),
            End::Failed(e) => (ExecStatus::Failed, totals.last_output.clone(), Some(e)),
            End::TimedOut => (
                ExecStatus::TimedOut,
                totals.last_output.clone(),
                Some(format!(
                    "claude timed out after {} s (executor timeout for this tier); its process group was killed",
                    timeout.as_secs()
                )),
            ),
            End::Cancelled => (
                ExecStatus::Cancelled,
                totals.last_output.clone(),
                Some("cancelled".into()),
            ),
        };
        let cost_usd = totals.cost_usd;
        ExecOutcome {
            status,
            output,
            model_used: Some(totals.model.clone().unwrap_or(model)),
            tokens_in: totals.tokens_in,
            tokens_out: totals.tokens_out,
            cost_usd,
            equivalent_claude_cost_usd: cost_usd,
            error,
            execution_ms: started.elapsed().as_millis() as u64,
            termination_reason: None,
            iterations_used: totals.turns,
        }
    }

    async fn run_once(
        &self,
        ctx: &ExecContext,
        attempt: &Attempt,
        model: &str,
        timeout: Duration,
        totals: &Totals,
    ) -> std::io::Result<RunResult> {
        let cfg = &ctx.config.executor;
        let spec = CommandSpec::new(&self.program, &ctx.workspace, ctx.env.clone())
            .arg("-p")
            .arg(prompt_arg(&attempt.prompt))
            .args([
                "--output-format",
                "stream-json",
                "--verbose",
                "--model",
                model,
            ])
            .args(&cfg.claude_extra_args);
        let limits = Limits {
            timeout: Some(timeout),
            grace: Duration::from_millis(cfg.kill_grace_ms),
            output_cap: cfg.output_cap_bytes,
        };
        let mut stream = StreamState::new(ctx.progress.clone(), model, totals.tokens_out);
        ctx.progress
            .emit(ProgressEvent::status(format!("running claude ({model})")));
        let mut on_line = |line: &str| stream.line(line);
        let out = process::run_with(&spec, &limits, &ctx.cancel, None, Some(&mut on_line)).await?;
        stream.flush_pending_tools();
        Ok(RunResult {
            exit: out.exit,
            stderr: out.stderr,
            stream,
        })
    }
}

/// The prompt as the CLI's positional argument. A prompt starting with `-` would be parsed
/// as an option (task text choosing CLI flags), so it gets a leading space, which the
/// option parser treats as a plain argument and the model ignores.
fn prompt_arg(prompt: &str) -> String {
    if prompt.starts_with('-') {
        format!(" {prompt}")
    } else {
        prompt.to_string()
    }
}

/// Assistant text kept per run (the tail), for the output when no result line comes.
const MAX_TEXT_BYTES: usize = 1024 * 1024;

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

enum End {
    Ok(String),
    Failed(String),
    TimedOut,
    Cancelled,
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
}

impl Totals {
    fn add(&mut self, s: &StreamState, requested_model: &str) {
        let model = s.model.as_deref().unwrap_or(requested_model);
        let (tin, tout) = match &s.result {
            Some(r) => (r.tokens_in, r.tokens_out),
            // No result line (crash, kill): count what the assistant messages reported.
            None => (0, s.tokens_out_seen),
        };
        self.tokens_in += tin;
        self.tokens_out += tout;
        self.cost_usd += s
            .result
            .as_ref()
            .and_then(|r| r.cost_usd)
            .unwrap_or_else(|| cost::claude_cost(model, tin, tout));
        if let Some(n) = s.result.as_ref().and_then(|r| r.num_turns) {
            self.turns = Some(self.turns.unwrap_or(0) + n);
        }
        if s.model.is_some() {
            self.model = s.model.clone();
        }
    }
}

struct RunResult {
    exit: Exit,
    stderr: String,
    stream: StreamState,
}

impl RunResult {
    /// `None` on success: a non-error `result` line, or exit 0 without any error signal.
    fn failure(&self) -> Option<String> {
        let stderr_tail = || tail_bytes(self.stderr.trim_end(), 1000);
        match &self.stream.result {
            Some(r) if r.is_error => Some(format!(
                "claude reported an error (subtype {}, {}): {}; stderr tail: {}",
                r.subtype.as_deref().unwrap_or("unknown"),
                self.exit.describe(),
                truncate_chars(&r.text, 500),
                stderr_tail()
            )),
            Some(_) => None,
            None if self.exit.success() => None,
            None => Some(format!(
                "claude failed with {} without a result line; stderr tail: {}",
                self.exit.describe(),
                stderr_tail()
            )),
        }
    }
}

/// The final `result` line.
#[derive(Debug, Default)]
struct ResultLine {
    subtype: Option<String>,
    is_error: bool,
    text: String,
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: Option<f64>,
    num_turns: Option<u32>,
}

/// Parser state for one run's stdout; emits progress as lines arrive.
struct StreamState {
    progress: ProgressSink,
    requested_model: String,
    model: Option<String>,
    /// Text of the assistant blocks, the output when no result line came.
    text: String,
    /// Output tokens seen in assistant messages (progress `tokens_so_far`).
    tokens_out_seen: u64,
    /// Tokens of earlier tries, so progress counts keep rising across retries.
    tokens_base: u64,
    turns_seen: u32,
    /// tool_use id → (name, args summary, turn), until its result arrives.
    pending_tools: HashMap<String, (String, String, u32)>,
    result: Option<ResultLine>,
}

impl StreamState {
    fn new(progress: ProgressSink, requested_model: &str, tokens_base: u64) -> StreamState {
        StreamState {
            progress,
            requested_model: requested_model.to_string(),
            model: None,
            text: String::new(),
            tokens_out_seen: 0,
            tokens_base,
            turns_seen: 0,
            pending_tools: HashMap::new(),
            result: None,
        }
    }

    fn output(&self) -> String {
        match &self.result {
            Some(r) if !r.text.is_empty() => r.text.clone(),
            _ => self.text.clone(),
        }
    }

    fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or(&self.requested_model)
    }

    fn line(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, line = %truncate_chars(line, 200), "skipping a claude stdout line that is not JSON");
                return;
            }
        };
        match v.get("type").and_then(Value::as_str) {
            Some("system") => {
                if let Some(m) = v.get("model").and_then(Value::as_str) {
                    self.model = Some(m.to_string());
                }
            }
            Some("assistant") => self.assistant(&v),
            Some("user") => self.user(&v),
            Some("result") => self.result(&v),
            other => {
                tracing::debug!(kind = ?other, "skipping a claude stream-json line of unknown type")
            }
        }
    }

    fn assistant(&mut self, v: &Value) {
        self.turns_seen += 1;
        let msg = &v["message"];
        if let Some(n) = msg.pointer("/usage/output_tokens").and_then(Value::as_u64) {
            self.tokens_out_seen += n;
        }
        if let Some(m) = msg.get("model").and_then(Value::as_str) {
            self.model.get_or_insert_with(|| m.to_string());
        }
        let Some(blocks) = msg.get("content").and_then(Value::as_array) else {
            return;
        };
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => {
                    let t = b.get("text").and_then(Value::as_str).unwrap_or_default();
                    if t.is_empty() {
                        continue;
                    }
                    if !self.text.is_empty() {
                        self.text.push('\n');
                    }
                    self.text.push_str(t);
                    if self.text.len() > 2 * MAX_TEXT_BYTES {
                        self.text = tail_bytes(&self.text, MAX_TEXT_BYTES);
                    }
                    let ev = ProgressEvent::new(EventKind::Token, t).with_tokens(
                        self.tokens_base + self.tokens_out_seen,
                        Some(self.model_name()),
                    );
                    self.progress.emit(ev);
                }
                Some("tool_use") => {
                    let id = b.get("id").and_then(Value::as_str).unwrap_or_default();
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_string();
                    let args = summarize_args(b.get("input").unwrap_or(&Value::Null));
                    self.pending_tools
                        .insert(id.to_string(), (name, args, self.turns_seen));
                }
                _ => {}
            }
        }
    }

    fn user(&mut self, v: &Value) {
        let Some(blocks) = v.pointer("/message/content").and_then(Value::as_array) else {
            return;
        };
        for b in blocks {
            if b.get("type").and_then(Value::as_str) != Some("tool_result") {
                continue;
            }
            let id = b
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let (name, args, turn) = self
                .pending_tools
                .remove(id)
                .unwrap_or_else(|| ("unknown".into(), String::new(), self.turns_seen));
            let mut summary = summarize_result(b.get("content").unwrap_or(&Value::Null));
            if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                summary = format!("error: {summary}");
            }
            self.emit_tool(&name, &args, &summary, turn);
        }
    }

    fn result(&mut self, v: &Value) {
        let u = |k: &str| {
            v.pointer(&format!("/usage/{k}"))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        self.result = Some(ResultLine {
            subtype: v.get("subtype").and_then(Value::as_str).map(str::to_string),
            is_error: v.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            text: v
                .get("result")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            // Cache writes and reads are input the model processed: they count as input.
            tokens_in: u("input_tokens")
                + u("cache_creation_input_tokens")
                + u("cache_read_input_tokens"),
            tokens_out: u("output_tokens"),
            cost_usd: v.get("total_cost_usd").and_then(Value::as_f64),
            num_turns: v
                .get("num_turns")
                .and_then(Value::as_u64)
                .map(|n| n.min(u32::MAX as u64) as u32),
        });
    }

    /// Tool calls whose result never came (killed run) still get their event.
    fn flush_pending_tools(&mut self) {
        let mut pending: Vec<_> = self.pending_tools.drain().collect();
        pending.sort_by_key(|(_, (_, _, turn))| *turn);
        for (_, (name, args, turn)) in pending {
            self.emit_tool(&name, &args, "(no result)", turn);
        }
    }

    fn emit_tool(&self, name: &str, args: &str, result: &str, turn: u32) {
        let ev = ProgressEvent::new(EventKind::ToolCall, format!("{name}({args})"))
            .with("tool_name", name)
            .with("args_summary", args)
            .with("result_summary", result)
            .with("iteration", turn)
            .with_tokens(
                self.tokens_base + self.tokens_out_seen,
                Some(self.model_name()),
            );
        self.progress.emit(ev);
    }
}

/// A short, one-line view of a tool's input: the usual key when there is one, else compact JSON.
fn summarize_args(input: &Value) -> String {
    for key in ["command", "file_path", "path", "pattern", "url", "query"] {
        if let Some(s) = input.get(key).and_then(Value::as_str) {
            return one_line(s, 120);
        }
    }
    one_line(&input.to_string(), 120)
}

/// A tool result is a string or a list of `{type: text, text}` blocks.
fn summarize_result(content: &Value) -> String {
    let text = match content {
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|i| i.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    one_line(&text, 200)
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!("{}…", truncate_chars(&flat, max))
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_stream_json_lines() {
        let sink = ProgressSink::new(8192);
        let mut s = StreamState::new(sink.clone(), "claude-sonnet-4-5", 0);
        s.line(r#"{"type":"system","subtype":"init","model":"claude-sonnet-4-5-20250929","tools":["Bash"]}"#);
        s.line(r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"Looking"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls -la"}}],"usage":{"output_tokens":7}}}"#);
        s.line("not json");
        s.line(r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a\nb"}]}}"#);
        s.line(r#"{"type":"result","subtype":"success","is_error":false,"result":"done","num_turns":2,"total_cost_usd":0.5,"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":3,"output_tokens":20}}"#);
        assert_eq!(s.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
        let r = s.result.as_ref().unwrap();
        assert_eq!((r.tokens_in, r.tokens_out, r.num_turns), (18, 20, Some(2)));
        assert_eq!(s.output(), "done");
        assert!(s.pending_tools.is_empty());
        assert_eq!(sink.emitted(), 2);
        let ev = sink.take_event().unwrap();
        assert_eq!(ev["tool_name"], "Bash");
        assert_eq!(ev["args_summary"], "ls -la");
        assert_eq!(ev["result_summary"], "a b");
    }

    #[test]
    fn claude_model_detection() {
        assert!(is_claude_model("claude-opus-4-6"));
        assert!(is_claude_model("sonnet"));
        assert!(!is_claude_model("qwen3:8b"));
        assert!(!is_claude_model(""));
    }
}
