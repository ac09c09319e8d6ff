//! Keeping an Ollama chat inside the model's context window (`executor.ollama_num_ctx`):
//! a conservative token estimate, older turns summarised then folded into one message, and
//! a warning when Ollama says it cut a prompt anyway (it does so silently).
//!
//! Two things are never shortened, whatever the chat's length: the task statement (the
//! system prompt and the first user message) and the plan — the newest message that holds
//! one in the shape the first prompt asked for ([`Plan::find`]): the model's own plan in the
//! first attempt, the corrective turn that hands the stored plan back in a later one. A
//! shortened plan is a different plan; the model would re-plan from a 200-character stub.

use serde_json::{json, Value};

use crate::progress::{EventKind, ProgressEvent};
use crate::util::truncate_chars;

use crate::plan::Plan;

use super::ollama_message::{one_line, parse_call};
use super::ExecContext;

/// Characters counted as one token by the context estimate (conservative: code and JSON
/// run nearer 3 than the 4 of English prose).
const CHARS_PER_TOKEN: usize = 3;
/// Newest messages always kept whole, whatever their size.
const MIN_RECENT: usize = 2;
/// Characters of a summarised message kept as a reminder.
const SUMMARY_CHARS: usize = 200;

/// A conservative token estimate of a chat: its text and tool calls, and a few tokens of
/// framing per message.
fn estimate_tokens(messages: &[Value]) -> usize {
    messages
        .iter()
        .map(|m| {
            let text = m["content"].as_str().map_or(0, |c| c.chars().count());
            let calls = m.get("tool_calls").map_or(0, |c| c.to_string().len());
            (text + calls) / CHARS_PER_TOKEN + 4
        })
        .sum()
}

/// The message holding the plan (module docs): the newest user or assistant message in
/// which a plan in the requested shape is found, after the head.
fn plan_message(messages: &[Value], head_end: usize) -> Option<usize> {
    (head_end..messages.len()).rev().find(|&i| {
        let m = &messages[i];
        matches!(m["role"].as_str(), Some("user" | "assistant"))
            && m["content"]
                .as_str()
                .is_some_and(|c| Plan::find(c, 0).is_some())
    })
}

/// Keep the chat under `num_ctx` (module docs): the system prompt, the task and the plan
/// stay whole, the newest turns stay whole, older tool results and answers are summarised,
/// then folded into one message. Says so in a `status` event when it changed anything.
pub(super) fn fit_context(ctx: &ExecContext, messages: &mut Vec<Value>) {
    let num_ctx = ctx.config.executor.ollama_num_ctx as usize;
    // A quarter of the window is left for the answer.
    let limit = num_ctx * 3 / 4;
    let before = estimate_tokens(messages);
    if num_ctx == 0 || before <= limit {
        return;
    }
    // The head: the system prompt and the first user message (the task and its plan request).
    let head_end = messages
        .iter()
        .position(|m| m["role"] == "user")
        .map_or(0, |i| i + 1);
    let plan_at = plan_message(messages, head_end);
    let pinned = |i: usize| i < head_end || Some(i) == plan_at;
    // The newest turns, whole, within half the budget (at least the last two).
    let mut recent_start = messages.len();
    let mut recent_tokens = 0;
    while recent_start > head_end {
        let t = estimate_tokens(&messages[recent_start - 1..recent_start]);
        let kept = messages.len() - recent_start;
        if kept >= MIN_RECENT && recent_tokens + t > limit / 2 {
            break;
        }
        recent_tokens += t;
        recent_start -= 1;
    }
    let mut summarised = 0usize;
    // 1: older tool results and long answers become one-line reminders.
    for i in head_end..recent_start {
        if estimate_tokens(messages) <= limit {
            break;
        }
        if !pinned(i) && summarise(&mut messages[i]) {
            summarised += 1;
        }
    }
    // 2: still too long: the older turns fold into one message listing what was done; the
    // plan, if it is among them, stays whole just before that message.
    if estimate_tokens(messages) > limit && recent_start > head_end {
        let older: Vec<(usize, Value)> = messages
            .drain(head_end..recent_start)
            .enumerate()
            .map(|(k, m)| (head_end + k, m))
            .collect();
        let mut kept = Vec::new();
        let mut folded = 0usize;
        let mut text = String::new();
        for (i, m) in older {
            if pinned(i) {
                kept.push(m);
            } else {
                text.push_str(&fold_line(&m));
                text.push('\n');
                folded += 1;
            }
        }
        let mut at = head_end;
        for m in kept {
            messages.insert(at, m);
            at += 1;
        }
        if folded > 0 {
            let note = format!(
                "[{folded} earlier messages of this task were folded to fit the context window; what they did:]\n{text}"
            );
            messages.insert(at, json!({"role": "user", "content": note}));
        }
        summarised += folded;
    }
    // 3: the newest turns themselves are too long: all but the last are summarised.
    let plan_at = plan_message(messages, head_end);
    let last = messages.len().saturating_sub(1);
    for i in head_end..last {
        if estimate_tokens(messages) <= limit {
            break;
        }
        if Some(i) != plan_at && summarise(&mut messages[i]) {
            summarised += 1;
        }
    }
    let after = estimate_tokens(messages);
    tracing::debug!(task_id = %ctx.task.task_id, before, after, limit, summarised, "chat fitted to the context window");
    ctx.progress.emit(
        ProgressEvent::status(format!(
            "context: {summarised} older message(s) summarised to stay under num_ctx {num_ctx} (about {before} → {after} tokens)"
        ))
        .with("context_tokens_estimate", after)
        .with("num_ctx", num_ctx),
    );
}

/// Replace a long tool result or answer by a short reminder of it; false when there was
/// nothing to shorten.
fn summarise(m: &mut Value) -> bool {
    let Some(content) = m["content"].as_str() else {
        return false;
    };
    let n = content.chars().count();
    if n <= SUMMARY_CHARS * 2 || content.starts_with("[summarised") {
        return false;
    }
    let what = match m["role"].as_str() {
        Some("tool") => format!(
            "the result of {}",
            m["tool_name"].as_str().unwrap_or("a tool")
        ),
        _ => "an earlier message".to_string(),
    };
    m["content"] = json!(format!(
        "[summarised to fit the context window: {what}, {n} characters; it began: {}]",
        truncate_chars(&one_line(content), SUMMARY_CHARS)
    ));
    true
}

/// One line for a folded message: who, which tool calls, how it began.
fn fold_line(m: &Value) -> String {
    let role = m["role"].as_str().unwrap_or("?");
    let content = one_line(m["content"].as_str().unwrap_or(""));
    let calls: Vec<String> = m["tool_calls"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    let (name, args) = parse_call(c);
                    truncate_chars(&format!("{name} {}", one_line(&args.to_string())), 120)
                })
                .collect()
        })
        .unwrap_or_default();
    match role {
        "tool" => format!(
            "- {} returned: {}",
            m["tool_name"].as_str().unwrap_or("tool"),
            truncate_chars(&content, 80)
        ),
        "assistant" if !calls.is_empty() => format!("- you called: {}", calls.join("; ")),
        _ => format!("- {role}: {}", truncate_chars(&content, 120)),
    }
}

/// Ollama keeps at most `num_ctx` prompt tokens and drops the beginning of a longer prompt
/// without an error; `prompt_eval_count` reaching `num_ctx` is how that shows.
pub(super) fn report_context_overflow(ctx: &ExecContext, model: &str, prompt_tokens: u64) {
    let num_ctx = u64::from(ctx.config.executor.ollama_num_ctx);
    if num_ctx == 0 || prompt_tokens < num_ctx.saturating_sub(CONTEXT_SLACK_TOKENS) {
        return;
    }
    tracing::warn!(task_id = %ctx.task.task_id, model, prompt_tokens, num_ctx,
        "the prompt filled the model's context window: Ollama cut its beginning");
    ctx.progress.emit(ProgressEvent::new(
        EventKind::Error,
        format!(
            "the prompt ({prompt_tokens} tokens) filled the context window of {model} (num_ctx {num_ctx}): Ollama cut its beginning, so the model may not see the task; raise executor.ollama_num_ctx"
        ),
    ));
}

/// Ollama may stop a few tokens short of `num_ctx` when it cuts a prompt.
const CONTEXT_SLACK_TOKENS: u64 = 8;
