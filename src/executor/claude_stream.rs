//! What the Claude Code CLI says on stdout (`-p --output-format stream-json --verbose`), read
//! line by line into progress events, usage figures and a typed [`ClaudeFailure`].
//!
//! Shared by the executor ([`super::claude`]) and the claude judge.
//!
//! # The lines, as Claude Code 2.1.x prints them (observed against a fake Messages API)
//!
//! - `system`/`init`: `model` (the *requested* model, e.g. `claude-opus-4-8[1m]`),
//!   `permissionMode`, `apiKeySource` (`ANTHROPIC_API_KEY`, or `none` for a subscription
//!   login), `tools`.
//! - `system`/`api_retry`: the CLI retrying a failed API request itself: `attempt`,
//!   `max_retries`, `retry_delay_ms`, `error_status` (HTTP status or null), `error`
//!   (`authentication_failed`, `rate_limit`, `server_error`, `unknown`, …). Bounded by
//!   `CLAUDE_CODE_MAX_RETRIES`; 401s are retried too.
//! - `assistant`: **one event per content block**, all sharing one `message.id`, each carrying
//!   the start-of-message `usage` (so summing them over-counts). A failed API call ends in a
//!   synthetic assistant message (`model: "<synthetic>"`) whose text is the CLI's own words
//!   ("Invalid API key · Fix external API key", "Credit balance is too low", "Not logged in ·
//!   Please run /login") and whose top-level `error` names the class: `authentication_failed`
//!   (401, 403, not logged in), `billing_error`, `model_not_found`, `rate_limit`,
//!   `server_error` (5xx, 529 and connection failures alike), `invalid_request`, `unknown`.
//! - `user`: `tool_result` blocks (`tool_use_id`, `content`, `is_error`). A tool denied by the
//!   permission mode comes back as an `is_error` result ("Claude requested permissions to write
//!   to …, but you haven't granted it yet.").
//! - `rate_limit_event`: `rate_limit_info.{status, resetsAt, rateLimitType}`; `status:
//!   "rejected"` is a subscription's usage limit, which no retry within the timeout cures.
//! - `result` (last): `subtype` (`success`, `error_max_turns`, `error_max_budget_usd`,
//!   `error_during_execution`), `is_error` (**the** failure flag: API failures come as
//!   `subtype: success, is_error: true`, and exit codes differ between versions),
//!   `api_error_status`, `result` (absent for error subtypes, which carry `errors: [..]`),
//!   `num_turns`, `total_cost_usd`, `usage` (the main loop only: under-counts side requests),
//!   `modelUsage` (per model, incl. a fallback model: the full figures), `permission_denials`
//!   (`tool_name`, `tool_use_id`, `tool_input`). A run whose every write was denied still ends
//!   `subtype: success, is_error: false`.

use std::collections::HashMap;

use serde_json::Value;

use crate::cost;
use crate::progress::{EventKind, ProgressEvent, ProgressSink};
use crate::util::{tail_bytes, truncate_chars};

/// Tools whose success means the agent changed the workspace.
const WRITE_TOOLS: [&str; 5] = ["Write", "Edit", "MultiEdit", "NotebookEdit", "Bash"];

/// Assistant text kept per run (the tail), for the output when no result line comes.
const MAX_TEXT_BYTES: usize = 1024 * 1024;

/// Why a claude run failed. Permanent classes fail the task at once; the CLI has already
/// retried the transient ones (`CLAUDE_CODE_MAX_RETRIES`), so nobody retries them again.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClaudeFailure {
    #[error("claude: authentication failed: {0}; log in with `claude auth login` as the daemon's user or set a valid ANTHROPIC_API_KEY in the daemon's environment ([env] passthrough)")]
    /// The API key or login was refused.
    Authentication(String),
    #[error(
        "claude: billing: {0}; add credits or change the plan of the account the key belongs to"
    )]
    /// The account cannot pay for the run.
    Billing(String),
    #[error("claude: model not available: {0}; set executor.claude_model (or the hub's routing) to a model this account can use")]
    /// The model does not exist for this account.
    ModelNotFound(String),
    #[error("claude: usage limit reached{}: {message}; wait for the reset or use an API key", resets_suffix(*.resets_at))]
    /// A subscription's usage limit; no retry within the timeout cures it.
    UsageLimit {
        /// What the CLI said.
        message: String,
        /// When the limit resets (Unix seconds), if the CLI said.
        resets_at: Option<i64>,
    },
    #[error(
        "claude: stopped at max turns: {0}; raise executor.claude_max_turns or split the task"
    )]
    /// The run used `--max-turns`.
    MaxTurns(String),
    #[error("claude: stopped at the task's budget: {0}; raise the task's cost cap if the work is worth more")]
    /// The run used `--max-budget-usd`.
    MaxBudget(String),
    #[error("claude: every change was denied by the permission mode ({0}); allow the tools the task needs in executor.claude_allowed_tools (e.g. \"Bash(cargo:*)\")")]
    /// Every change the run tried was denied by the permission mode.
    PermissionDenied(String),
    #[error("claude refused to run: {0}; fix executor.claude_extra_args")]
    /// The CLI refused its arguments.
    Refused(String),
    #[error("claude: the API rejected the request: {0}")]
    /// The API rejected the request as malformed (HTTP 400).
    InvalidRequest(String),
    #[error("claude: rate limited (after the CLI's own retries){}: {message}", resets_suffix(*.resets_at))]
    /// Still rate limited after the CLI's own retries.
    RateLimited {
        /// What the CLI said.
        message: String,
        /// When the limit resets (Unix seconds), if the CLI said.
        resets_at: Option<i64>,
    },
    #[error("claude: API overloaded (after the CLI's own retries): {0}")]
    /// The API was overloaded (HTTP 529) through the CLI's retries.
    Overloaded(String),
    #[error("claude: API server error (after the CLI's own retries): {0}")]
    /// The API failed (HTTP 5xx) through the CLI's retries.
    Server(String),
    #[error("claude: network error reaching the API (after the CLI's own retries): {0}; check connectivity and ANTHROPIC_BASE_URL")]
    /// The API could not be reached through the CLI's retries.
    Network(String),
    #[error("claude reported an error: {0}")]
    /// Any other error result the CLI reported.
    Execution(String),
    /// No result line and a failing exit: a crash, the one case worth a fresh process.
    #[error("claude failed with {0}")]
    Crashed(String),
}

fn resets_suffix(resets_at: Option<i64>) -> String {
    resets_at
        .map(|t| format!(" (resets at unix time {t})"))
        .unwrap_or_default()
}

impl ClaudeFailure {
    /// Whether a fresh `claude` process may help. Only a crash: API-level transient errors
    /// were already retried inside the CLI, and a second layer would overrun the timeout.
    pub fn retryable(&self) -> bool {
        matches!(self, ClaudeFailure::Crashed(_))
    }

    /// A short class name for logs and metrics.
    pub fn class(&self) -> &'static str {
        match self {
            ClaudeFailure::Authentication(_) => "authentication",
            ClaudeFailure::Billing(_) => "billing",
            ClaudeFailure::ModelNotFound(_) => "model_not_found",
            ClaudeFailure::UsageLimit { .. } => "usage_limit",
            ClaudeFailure::MaxTurns(_) => "max_turns",
            ClaudeFailure::MaxBudget(_) => "max_budget",
            ClaudeFailure::PermissionDenied(_) => "permission_denied",
            ClaudeFailure::Refused(_) => "refused",
            ClaudeFailure::InvalidRequest(_) => "invalid_request",
            ClaudeFailure::RateLimited { .. } => "rate_limited",
            ClaudeFailure::Overloaded(_) => "overloaded",
            ClaudeFailure::Server(_) => "server_error",
            ClaudeFailure::Network(_) => "network",
            ClaudeFailure::Execution(_) => "execution",
            ClaudeFailure::Crashed(_) => "crashed",
        }
    }
}

/// The final `result` line.
#[derive(Debug, Default, Clone)]
pub struct ResultLine {
    /// `subtype`: `success`, `error_max_turns`, `error_during_execution`, …
    pub subtype: Option<String>,
    /// `is_error`.
    pub is_error: bool,
    /// `api_error_status`: the HTTP status of a failed API call.
    pub api_error_status: Option<u64>,
    /// `result`: the final answer, or the error text.
    pub text: String,
    /// `errors` of the error subtypes.
    pub errors: Vec<String>,
    /// `num_turns`.
    pub num_turns: Option<u32>,
    /// `total_cost_usd`.
    pub cost_usd: Option<f64>,
    /// From `modelUsage` (all models, side requests included), else from `usage`.
    pub tokens_in: u64,
    /// Output tokens, from the same source as `tokens_in`.
    pub tokens_out: u64,
    /// The model with the largest share of `modelUsage`.
    pub model: Option<String>,
    /// `Tool(args)` of each denied call.
    pub denials: Vec<String>,
}

/// Parser state for one run's stdout; emits progress as lines arrive.
pub struct StreamState {
    progress: ProgressSink,
    requested_model: String,
    /// From `system/init` or the assistant messages.
    pub model: Option<String>,
    /// `apiKeySource` of `system/init`; `none` means a subscription login.
    pub api_key_source: Option<String>,
    /// Text of the assistant blocks, the output when no result line came.
    text: String,
    /// The first assistant text of the run (up to
    /// [`crate::plan::NARRATIVE_HEAD_BYTES`]): where its plan is, which the tail
    /// kept in `text` may have lost on a long run.
    pub head_text: String,
    /// Tokens of earlier tries, so progress counts keep rising across retries.
    tokens_base: u64,
    /// message id → (input incl. cache, output) from its start-of-message usage: one entry per
    /// message however many content blocks it was split into.
    usage_by_message: HashMap<String, (u64, u64)>,
    message_order: Vec<String>,
    /// tool_use id → (name, args summary, turn), until its result arrives.
    pending_tools: HashMap<String, (String, String, u32)>,
    /// Write-type tool calls that succeeded.
    pub writes_ok: u32,
    /// `error` of the last synthetic assistant message and its text.
    assistant_error: Option<(String, String)>,
    /// `(error_status, error)` of the last `api_retry` event.
    pub last_retry: Option<(Option<u64>, String)>,
    /// `api_retry` events seen: the CLI's own retries.
    pub retries_seen: u32,
    /// `resetsAt` of a `rate_limit_event` with status `rejected`.
    limit_rejected: Option<Option<i64>>,
    /// The final `result` line, once it arrived.
    pub result: Option<ResultLine>,
}

impl StreamState {
    /// A parser reporting to `progress`; `tokens_base` is what earlier tries of the attempt used.
    pub fn new(progress: ProgressSink, requested_model: &str, tokens_base: u64) -> StreamState {
        StreamState {
            progress,
            requested_model: requested_model.to_string(),
            model: None,
            api_key_source: None,
            text: String::new(),
            head_text: String::new(),
            tokens_base,
            usage_by_message: HashMap::new(),
            message_order: Vec::new(),
            pending_tools: HashMap::new(),
            writes_ok: 0,
            assistant_error: None,
            last_retry: None,
            retries_seen: 0,
            limit_rejected: None,
            result: None,
        }
    }

    /// The final text: the result's, else the assistant text seen.
    pub fn output(&self) -> String {
        match &self.result {
            Some(r) if !r.text.is_empty() => r.text.clone(),
            _ => self.text.clone(),
        }
    }

    fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or(&self.requested_model)
    }

    /// Turns: distinct assistant message ids (one message may arrive as several events).
    pub fn turns(&self) -> u32 {
        self.message_order.len() as u32
    }

    fn tokens_out_seen(&self) -> u64 {
        self.usage_by_message.values().map(|(_, o)| o).sum()
    }

    /// Tokens `(in, out)` and USD of this run: the result's figures, else (killed, crashed) an
    /// estimate from the per-message usage seen, priced for the model.
    pub fn usage(&self) -> (u64, u64, f64) {
        if let Some(r) = &self.result {
            let model = r.model.as_deref().unwrap_or(self.model_name());
            let cost = r
                .cost_usd
                .unwrap_or_else(|| cost::claude_cost(model, r.tokens_in, r.tokens_out));
            return (r.tokens_in, r.tokens_out, cost);
        }
        let tin: u64 = self.usage_by_message.values().map(|(i, _)| i).sum();
        let tout = self.tokens_out_seen();
        (tin, tout, cost::claude_cost(self.model_name(), tin, tout))
    }

    /// Whether a tool call is running (its result not yet seen): the CLI prints nothing
    /// while, say, a build runs in its Bash tool.
    pub fn tool_running(&self) -> bool {
        !self.pending_tools.is_empty()
    }

    /// Whether the result line has come (the run's work is over).
    pub fn finished(&self) -> bool {
        self.result.is_some()
    }

    /// Feed one stdout line. Returns true when it was the `result` line.
    pub fn line(&mut self, line: &str) -> bool {
        let line = line.trim();
        if line.is_empty() {
            return false;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, line = %truncate_chars(line, 200), "skipping a claude stdout line that is not JSON");
                return false;
            }
        };
        match v.get("type").and_then(Value::as_str) {
            Some("system") => self.system(&v),
            Some("assistant") => self.assistant(&v),
            Some("user") => self.user(&v),
            Some("rate_limit_event") => {
                let info = &v["rate_limit_info"];
                if info.get("status").and_then(Value::as_str) == Some("rejected") {
                    self.limit_rejected = Some(info.get("resetsAt").and_then(Value::as_i64));
                }
            }
            Some("result") => {
                self.result(&v);
                return true;
            }
            other => {
                tracing::debug!(kind = ?other, "skipping a claude stream-json line of unknown type")
            }
        }
        false
    }

    fn system(&mut self, v: &Value) {
        match v.get("subtype").and_then(Value::as_str) {
            Some("api_retry") => {
                let status = v.get("error_status").and_then(Value::as_u64);
                let error = v
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string();
                self.retries_seen += 1;
                self.progress.emit(ProgressEvent::new(
                    EventKind::Error,
                    format!(
                        "claude API call failed ({error}, status {}); the CLI retries (try {} of {})",
                        status.map_or("none".into(), |s| s.to_string()),
                        v.get("attempt").and_then(Value::as_u64).unwrap_or(0),
                        v.get("max_retries").and_then(Value::as_u64).unwrap_or(0),
                    ),
                ));
                self.last_retry = Some((status, error));
            }
            _ => {
                if let Some(m) = v.get("model").and_then(Value::as_str) {
                    self.model = Some(m.to_string());
                }
                if let Some(s) = v.get("apiKeySource").and_then(Value::as_str) {
                    self.api_key_source = Some(s.to_string());
                }
            }
        }
    }

    fn assistant(&mut self, v: &Value) {
        let msg = &v["message"];
        let text_of = |msg: &Value| {
            msg.get("content")
                .and_then(Value::as_array)
                .map(|b| {
                    b.iter()
                        .filter_map(|b| b.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        };
        if let Some(code) = v.get("error").and_then(Value::as_str) {
            self.assistant_error = Some((code.to_string(), text_of(msg)));
            return;
        }
        let id = msg
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("anon-{}", self.message_order.len()));
        if !self.usage_by_message.contains_key(&id) {
            let u = |k: &str| {
                msg.pointer(&format!("/usage/{k}"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            };
            let tin =
                u("input_tokens") + u("cache_creation_input_tokens") + u("cache_read_input_tokens");
            self.usage_by_message
                .insert(id.clone(), (tin, u("output_tokens")));
            self.message_order.push(id);
        }
        if let Some(m) = msg.get("model").and_then(Value::as_str) {
            self.model.get_or_insert_with(|| m.to_string());
        }
        let turn = self.turns();
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
                    let head_room =
                        crate::plan::NARRATIVE_HEAD_BYTES.saturating_sub(self.head_text.len());
                    if head_room > 0 {
                        if !self.head_text.is_empty() {
                            self.head_text.push('\n');
                        }
                        let mut end = t.len().min(head_room);
                        while !t.is_char_boundary(end) {
                            end -= 1;
                        }
                        self.head_text.push_str(&t[..end]);
                    }
                    if self.text.len() > 2 * MAX_TEXT_BYTES {
                        self.text = tail_bytes(&self.text, MAX_TEXT_BYTES);
                    }
                    let ev = ProgressEvent::new(EventKind::Token, t).with_tokens(
                        self.tokens_base + self.tokens_out_seen(),
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
                        .insert(id.to_string(), (name, args, turn));
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
                .unwrap_or_else(|| ("unknown".into(), String::new(), self.turns()));
            let mut summary = summarize_result(b.get("content").unwrap_or(&Value::Null));
            if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                summary = format!("error: {summary}");
            } else if WRITE_TOOLS.contains(&name.as_str()) {
                self.writes_ok += 1;
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
        // Cache writes and reads are input the model processed: they count as input.
        let (mut tin, mut tout) = (
            u("input_tokens") + u("cache_creation_input_tokens") + u("cache_read_input_tokens"),
            u("output_tokens"),
        );
        let mut model = None;
        if let Some(per_model) = v.get("modelUsage").and_then(Value::as_object) {
            if !per_model.is_empty() {
                let n = |m: &Value, k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
                tin = per_model
                    .values()
                    .map(|m| {
                        n(m, "inputTokens")
                            + n(m, "cacheReadInputTokens")
                            + n(m, "cacheCreationInputTokens")
                    })
                    .sum();
                tout = per_model.values().map(|m| n(m, "outputTokens")).sum();
                model = per_model
                    .iter()
                    .max_by(|a, b| {
                        let c = |m: &Value| m.get("costUSD").and_then(Value::as_f64).unwrap_or(0.0);
                        c(a.1).total_cmp(&c(b.1))
                    })
                    .map(|(k, _)| k.clone());
            }
        }
        let denials = v
            .get("permission_denials")
            .and_then(Value::as_array)
            .map(|d| {
                d.iter()
                    .map(|d| {
                        format!(
                            "{}({})",
                            d.get("tool_name").and_then(Value::as_str).unwrap_or("?"),
                            summarize_args(d.get("tool_input").unwrap_or(&Value::Null))
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.result = Some(ResultLine {
            subtype: v.get("subtype").and_then(Value::as_str).map(str::to_string),
            is_error: v.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            api_error_status: v.get("api_error_status").and_then(Value::as_u64),
            text: v
                .get("result")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            errors: v
                .get("errors")
                .and_then(Value::as_array)
                .map(|e| {
                    e.iter()
                        .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            num_turns: v
                .get("num_turns")
                .and_then(Value::as_u64)
                .map(|n| n.min(u32::MAX as u64) as u32),
            cost_usd: v.get("total_cost_usd").and_then(Value::as_f64),
            tokens_in: tin,
            tokens_out: tout,
            model,
            denials,
        });
    }

    /// Tool calls whose result never came (killed run) still get their event.
    pub fn flush_pending_tools(&mut self) {
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
                self.tokens_base + self.tokens_out_seen(),
                Some(self.model_name()),
            );
        self.progress.emit(ev);
    }

    /// The failure of this run, if it failed; `exit_ok` and `stderr` are the process's.
    pub fn failure(&self, exit_ok: bool, stderr: &str) -> Option<ClaudeFailure> {
        let Some(r) = &self.result else {
            if exit_ok {
                return None;
            }
            let tail = tail_bytes(stderr.trim_end(), 1000);
            // The CLI refuses some flag combinations before doing anything (bypass as root).
            if tail.contains("cannot be used with") || tail.contains("error: unknown option") {
                return Some(ClaudeFailure::Refused(tail));
            }
            return Some(ClaudeFailure::Crashed(format!(
                "no result line; stderr tail: {}",
                if tail.is_empty() { "(empty)" } else { &tail }
            )));
        };
        match r.subtype.as_deref() {
            Some("error_max_turns") => return Some(ClaudeFailure::MaxTurns(self.words(r))),
            Some("error_max_budget_usd") => return Some(ClaudeFailure::MaxBudget(self.words(r))),
            _ => {}
        }
        if !r.is_error {
            if !r.denials.is_empty() && self.writes_ok == 0 {
                return Some(ClaudeFailure::PermissionDenied(r.denials.join(", ")));
            }
            return None;
        }
        Some(self.classify_error(r))
    }

    /// The CLI's own words: the result text, its `errors`, or the synthetic message's text.
    fn words(&self, r: &ResultLine) -> String {
        let w = if !r.text.trim().is_empty() {
            r.text.clone()
        } else if !r.errors.is_empty() {
            r.errors.join("; ")
        } else if let Some((_, t)) = &self.assistant_error {
            t.clone()
        } else {
            format!(
                "subtype {} without a message",
                r.subtype.as_deref().unwrap_or("unknown")
            )
        };
        truncate_chars(w.trim(), 500)
    }

    fn classify_error(&self, r: &ResultLine) -> ClaudeFailure {
        let words = self.words(r);
        let code = self.assistant_error.as_ref().map(|(c, _)| c.as_str());
        let status = r.api_error_status;
        let lower = words.to_ascii_lowercase();
        if let Some(resets_at) = self.limit_rejected {
            return ClaudeFailure::UsageLimit {
                message: words,
                resets_at,
            };
        }
        match (code, status) {
            (Some("authentication_failed"), _) | (_, Some(401 | 403)) => {
                ClaudeFailure::Authentication(words)
            }
            (Some("billing_error"), _) => ClaudeFailure::Billing(words),
            (_, Some(400)) if lower.contains("credit balance") => ClaudeFailure::Billing(words),
            (Some("model_not_found"), _) | (_, Some(404)) => ClaudeFailure::ModelNotFound(words),
            (Some("rate_limit"), _) | (_, Some(429)) => ClaudeFailure::RateLimited {
                message: words,
                resets_at: None,
            },
            (_, Some(529)) | (Some("overloaded"), _) => ClaudeFailure::Overloaded(words),
            _ if lower.contains("unable to connect") || lower.contains("connection") => {
                ClaudeFailure::Network(words)
            }
            (Some("server_error"), _) | (_, Some(500..=599)) => ClaudeFailure::Server(words),
            (Some("invalid_request"), _) | (_, Some(400)) => ClaudeFailure::InvalidRequest(words),
            _ => ClaudeFailure::Execution(words),
        }
    }
}

/// A short, one-line view of a tool's input: the usual key when there is one, else compact JSON.
pub fn summarize_args(input: &Value) -> String {
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
#[path = "claude_stream_tests.rs"]
mod tests;
