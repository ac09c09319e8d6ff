//! One `/api/chat` response: its NDJSON lines folded into one reply (streamed content,
//! tool calls, token counts), the bounds on reading it, and how reading it fails.

use serde_json::Value;

use crate::util::truncate_chars;

/// Why one `/api/chat` call gave no reply (each is retried up to `ollama_retries`).
#[derive(Debug, thiserror::Error)]
pub(super) enum ChatError {
    #[error("the HTTP client was not built")]
    NoClient,
    #[error("request failed: {0}")]
    Request(reqwest::Error),
    /// A non-2xx answer, with the start of its body.
    #[error("HTTP {status}: {body}")]
    Status {
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("reading the response failed: {0}")]
    Read(reqwest::Error),
    #[error("the response exceeded {} MiB (or a line {} MiB); refusing to read more", MAX_RESPONSE_BYTES >> 20, MAX_LINE_BYTES >> 20)]
    TooLarge,
    #[error("unparseable response line ({source}): {line}")]
    BadLine {
        source: serde_json::Error,
        /// The start of the line.
        line: String,
    },
    /// Ollama's own `{"error": ...}`.
    #[error("ollama error: {0}")]
    Ollama(String),
    #[error("the response ended without a `done: true` line")]
    NoDone,
}

/// One assistant message and its token counts.
#[derive(Default)]
pub(super) struct ChatReply {
    pub(super) content: String,
    pub(super) tool_calls: Vec<Value>,
    pub(super) tokens_in: u64,
    pub(super) tokens_out: u64,
}

/// Bounds on one `/api/chat` response: a long answer is a few MiB; more is an endpoint that
/// misbehaves.
pub(super) const MAX_RESPONSE_BYTES: usize = 64 << 20;
pub(super) const MAX_LINE_BYTES: usize = 8 << 20;

/// Folds `/api/chat` NDJSON lines into one reply.
pub(super) struct LineParser<F: FnMut(&str, u64)> {
    pub(super) reply: ChatReply,
    pub(super) done: bool,
    /// Content chunks so far (≈ tokens, for progress before the final counts arrive).
    pub(super) chunks: u64,
    pub(super) on_token: F,
}

impl<F: FnMut(&str, u64)> LineParser<F> {
    pub(super) fn line(&mut self, raw: &[u8]) -> Result<(), ChatError> {
        let line = String::from_utf8_lossy(raw);
        let line = line.trim();
        if line.is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(line).map_err(|source| ChatError::BadLine {
            source,
            line: truncate_chars(line, 200),
        })?;
        if let Some(err) = v.get("error") {
            let msg = err
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            return Err(ChatError::Ollama(msg));
        }
        let msg = &v["message"];
        if let Some(t) = msg.get("content").and_then(Value::as_str) {
            if !t.is_empty() {
                self.reply.content.push_str(t);
                self.chunks += 1;
                (self.on_token)(t, self.chunks);
            }
        }
        if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
            self.reply.tool_calls.extend(calls.iter().cloned());
        }
        if v.get("done").and_then(Value::as_bool) == Some(true) {
            self.done = true;
            let count = |k: &str| v.get(k).and_then(Value::as_u64);
            self.reply.tokens_in = count("prompt_eval_count").unwrap_or(0);
            self.reply.tokens_out = count("eval_count").unwrap_or(self.chunks);
        }
        Ok(())
    }
}
