//! One task's spans ([`TaskTrace`]): fed by the runner where it writes the flight record
//! (attempt start and end, the loop's outcome, publish, the terminal frame) and by the
//! progress tap (tool calls), each span built whole when it ends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{Event, SpanId};
use opentelemetry::KeyValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{traceparent, Root, Shared, Span};
use crate::executor::ExecOutcome;
use crate::progress::{EventKind, ProgressEvent};
use crate::redact::Redactor;
use crate::task::{CheckType, Task};
use crate::verify::retry_loop::LoopOutcome;

/// Cap on one string attribute or event value.
const MAX_VALUE: usize = 4 * 1024;
/// Cap on the tool calls kept as events of one execution.
const MAX_TOOL_EVENTS: usize = 256;

/// One task's trace. Cheap to clone; a disabled one (export off, or the task not sampled)
/// does nothing.
#[derive(Clone, Default)]
pub struct TaskTrace {
    inner: Option<Arc<TaskShared>>,
}

struct TaskShared {
    tel: Arc<Shared>,
    root: Root,
    task_id: String,
    generation: u64,
    executor: Option<String>,
    repo: Option<String>,
    redactor: Arc<Redactor>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Attempts started in this life of the daemon and not yet ended: when, and the
    /// corrective prompt that opened a retry.
    attempts: BTreeMap<u32, (SystemTime, Vec<Event>)>,
    /// The execution running: its attempt, start and tool calls.
    exec: Option<(u32, SystemTime, Vec<Event>)>,
    /// From the loop's outcome, for the root.
    verification_status: Option<String>,
    termination_reason: Option<String>,
}

impl TaskTrace {
    /// A trace that records nothing.
    pub fn disabled() -> TaskTrace {
        TaskTrace { inner: None }
    }

    pub(super) fn new(
        tel: Arc<Shared>,
        root: Root,
        task: &Task,
        executor: Option<&str>,
        redactor: Arc<Redactor>,
    ) -> TaskTrace {
        TaskTrace {
            inner: Some(Arc::new(TaskShared {
                tel,
                root,
                task_id: task.task_id.clone(),
                generation: task.generation,
                executor: executor.map(str::to_string),
                repo: task.repo.as_deref().map(crate::redact::scrub_url_userinfo),
                redactor,
                state: Mutex::new(State::default()),
            })),
        }
    }

    /// `TRACEPARENT` for the task's children, when the operator lets it reach them
    /// (`[otel] propagate_to_children`): their spans join this trace under its root.
    pub fn traceparent_for_children(&self) -> Option<String> {
        let s = self.inner.as_ref()?;
        s.tel
            .propagate
            .then(|| traceparent(s.root.trace_id, s.root.span_id, true))
    }

    /// The trace id, hex (for the log and tests).
    pub fn trace_id(&self) -> Option<String> {
        self.inner.as_ref().map(|s| s.root.trace_id.to_string())
    }

    /// Attempt `n` starts; for `n > 1` it opens with the corrective `prompt`. The attempt
    /// before it ends here (its verification and the decision to retry are behind it).
    pub fn attempt_start(&self, n: u32, prompt: &str) {
        let Some(s) = &self.inner else { return };
        let now = SystemTime::now();
        let ended = {
            let Ok(mut st) = s.state.lock() else { return };
            let later = st.attempts.split_off(&n);
            let ended = std::mem::replace(&mut st.attempts, later);
            let mut opened = Vec::new();
            if n > 1 {
                opened.push(Event::new(
                    "corrective_prompt",
                    now,
                    vec![s.text("hub_sidecar.prompt", prompt)],
                    0,
                ));
            }
            st.attempts.insert(n, (now, opened));
            st.exec = Some((n, now, Vec::new()));
            ended
        };
        for (k, (start, events)) in ended {
            s.attempt_span(k, start, now, events);
        }
    }

    /// A progress event (already scrubbed by the sink): a tool call becomes an event of
    /// the running execution.
    pub fn on_event(&self, ev: &ProgressEvent) {
        let Some(s) = &self.inner else { return };
        if ev.kind != EventKind::ToolCall {
            return;
        }
        let Ok(mut st) = s.state.lock() else { return };
        if let Some((_, _, events)) = st.exec.as_mut() {
            if events.len() < MAX_TOOL_EVENTS {
                events.push(Event::new(
                    "tool_call",
                    SystemTime::now(),
                    vec![s.text("hub_sidecar.tool_call", &ev.text)],
                    0,
                ));
            }
        }
    }

    /// Attempt `n`'s execution ended with `out`.
    pub fn attempt_end(&self, n: u32, out: &ExecOutcome) {
        let Some(s) = &self.inner else { return };
        let now = SystemTime::now();
        let (start, events) = match s.state.lock().ok().and_then(|mut st| st.exec.take()) {
            Some((k, start, events)) if k == n => (start, events),
            _ => (now - Duration::from_millis(out.execution_ms), Vec::new()),
        };
        let status = serde_json::to_value(out.status).unwrap_or(Value::Null);
        let mut attrs = vec![
            KeyValue::new("hub_sidecar.attempt", i64::from(n)),
            s.text("hub_sidecar.status", status.as_str().unwrap_or_default()),
        ];
        if let Some(e) = &s.executor {
            attrs.push(KeyValue::new("hub_sidecar.executor", e.clone()));
        }
        if let Some(t) = &out.termination_reason {
            attrs.push(s.text("hub_sidecar.termination_reason", t));
        }
        if let Some(system) = s.executor.as_deref().and_then(gen_ai_system) {
            attrs.push(KeyValue::new("gen_ai.system", system));
            attrs.push(KeyValue::new("gen_ai.operation.name", "invoke_agent"));
            if let Some(m) = &out.model_used {
                attrs.push(s.text("gen_ai.request.model", m));
            }
            attrs.extend(usage(out.tokens_in, out.tokens_out, out.cost_usd));
        }
        let error = out.error.as_deref().map(|e| s.scrub(e));
        s.tel.emit(
            "execute",
            s.root.context_of(attempt_id(&s.root, n), true),
            Span {
                id: None,
                start,
                end: now,
                attrs,
                events,
                error,
            },
        );
    }

    /// The loop ended with `lo`: every check of every report (this life's and those
    /// carried over a restart) under its attempt, and the last attempt ends.
    pub fn loop_done(&self, lo: &LoopOutcome) {
        let Some(s) = &self.inner else { return };
        let now = SystemTime::now();
        for a in &lo.attempts {
            s.check_spans(&a.report, now);
        }
        let open: Vec<_> = {
            let Ok(mut st) = s.state.lock() else { return };
            st.verification_status = serde_json::to_value(lo.verification_status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string));
            st.termination_reason = Some(lo.termination_reason.as_str().to_string());
            std::mem::take(&mut st.attempts).into_iter().collect()
        };
        for (k, (start, events)) in open {
            s.attempt_span(k, start, now, events);
        }
    }

    /// Publishing the verified work (commit, push, pull request) ran from `start` and
    /// added `result` to the task's result.
    pub fn publish(&self, start: SystemTime, result: &Map<String, Value>) {
        let Some(s) = &self.inner else { return };
        let mut attrs = Vec::new();
        for key in ["branch", "commit", "pr_url", "git_note"] {
            if let Some(v) = result.get(key).and_then(Value::as_str) {
                attrs.push(s.text(&format!("hub_sidecar.publish.{key}"), v));
            }
        }
        let pushed = result
            .get("pushed")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        attrs.push(KeyValue::new("hub_sidecar.publish.pushed", pushed));
        let refused = result.contains_key("publish_refused");
        attrs.push(KeyValue::new("hub_sidecar.publish.refused", refused));
        let error = result
            .get("git_error")
            .and_then(Value::as_str)
            .map(|e| s.scrub(e));
        s.tel.emit(
            "publish",
            s.root.context(true),
            Span {
                id: None,
                start,
                end: SystemTime::now(),
                attrs,
                events: Vec::new(),
                error,
            },
        );
    }

    /// The task ended: with a terminal frame of `frame_kind` stored for the hub (whose
    /// delivery span starts now), or cancelled (`None`). The root span is exported.
    pub fn finish(&self, frame_kind: Option<&str>) {
        let Some(s) = &self.inner else { return };
        let (status, termination) = s
            .state
            .lock()
            .map(|st| {
                (
                    st.verification_status.clone(),
                    st.termination_reason.clone(),
                )
            })
            .unwrap_or_default();
        let mut attrs = vec![
            s.text("hub_sidecar.task_id", &s.task_id),
            KeyValue::new("hub_sidecar.generation", s.generation as i64),
            KeyValue::new(
                "hub_sidecar.outcome",
                frame_kind.unwrap_or("cancelled").to_string(),
            ),
        ];
        if let Some(e) = &s.executor {
            attrs.push(KeyValue::new("hub_sidecar.executor", e.clone()));
        }
        if let Some(r) = &s.repo {
            attrs.push(s.text("hub_sidecar.repository", r));
        }
        if let Some(v) = status {
            attrs.push(KeyValue::new("hub_sidecar.verification_status", v));
        }
        let termination = termination.unwrap_or_else(|| match frame_kind {
            None => "cancelled".into(),
            Some(_) => "execution_failed".into(),
        });
        attrs.push(KeyValue::new("hub_sidecar.termination_reason", termination));
        let error = (frame_kind == Some("task_failed")).then(|| "task_failed".to_string());
        s.tel.emit_root(s.root, attrs, error);
        if frame_kind.is_some() {
            s.tel.delivering(&s.task_id, s.root);
        }
    }
}

impl TaskShared {
    /// A string attribute, scrubbed and capped.
    fn text(&self, key: &str, value: &str) -> KeyValue {
        KeyValue::new(key.to_string(), self.scrub(value))
    }

    fn scrub(&self, value: &str) -> String {
        let capped = crate::util::truncate_chars(value, MAX_VALUE);
        self.redactor.scrub(&capped)
    }

    fn attempt_span(&self, n: u32, start: SystemTime, end: SystemTime, events: Vec<Event>) {
        self.tel.emit(
            "attempt",
            self.root.context(true),
            Span {
                id: Some(attempt_id(&self.root, n)),
                start,
                end,
                attrs: vec![KeyValue::new("hub_sidecar.attempt", i64::from(n))],
                events,
                error: None,
            },
        );
    }

    /// One span per check of `report`, laid end to end from the report's start (checks run
    /// one after another), under the attempt it verified.
    fn check_spans(&self, report: &crate::verify::report::VerificationReport, now: SystemTime) {
        let parent = self
            .root
            .context_of(attempt_id(&self.root, report.run_number), true);
        let mut at = UNIX_EPOCH + Duration::from_millis(report.started_at.max(0) as u64);
        for c in &report.checks {
            let end = (at + Duration::from_millis(c.duration_ms)).min(now.max(at));
            let status = crate::verify::checks::status_str(c.status);
            let mut attrs = vec![
                KeyValue::new("hub_sidecar.check.type", c.check_type.as_str().to_string()),
                self.text("hub_sidecar.check.target", &c.target),
                KeyValue::new("hub_sidecar.check.status", status),
                KeyValue::new("hub_sidecar.check.duration_ms", c.duration_ms as i64),
                KeyValue::new("hub_sidecar.attempt", i64::from(report.run_number)),
            ];
            if c.flaky {
                attrs.push(KeyValue::new("hub_sidecar.check.flaky", true));
            }
            let judge = c.check_type == CheckType::LlmJudge;
            if judge {
                attrs.push(KeyValue::new("gen_ai.operation.name", "judge"));
                if let Some(sys) = self.judge_system() {
                    attrs.push(KeyValue::new("gen_ai.system", sys));
                }
                if let Some(m) = &self.tel_judge_model() {
                    attrs.push(self.text("gen_ai.request.model", m));
                }
                attrs.extend(usage(c.tokens_in, c.tokens_out, c.cost_usd));
            }
            let error = (status != "pass").then(|| self.scrub(&c.output));
            self.tel.emit(
                if judge { "judge" } else { "check" },
                parent.clone(),
                Span {
                    id: None,
                    start: at,
                    end,
                    attrs,
                    events: Vec::new(),
                    error,
                },
            );
            at = end;
        }
    }

    fn judge_system(&self) -> Option<&'static str> {
        Some(match self.tel.judge_backend {
            crate::config::JudgeBackend::Claude => "anthropic",
            crate::config::JudgeBackend::Ollama => "ollama",
        })
    }

    fn tel_judge_model(&self) -> Option<String> {
        self.tel.judge_model.clone()
    }
}

/// The id of attempt `n`'s span: derived from the trace, so the daemon's next life (after a
/// restart) hangs the attempt's checks under the span its first life exported.
fn attempt_id(root: &Root, n: u32) -> SpanId {
    let mut h = Sha256::new();
    h.update(root.trace_id.to_bytes());
    h.update(b"attempt");
    h.update(n.to_be_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    if b == [0; 8] {
        b[7] = 1;
    }
    SpanId::from_bytes(b)
}

/// `gen_ai.system` of an executor that calls a model.
fn gen_ai_system(executor: &str) -> Option<&'static str> {
    match executor {
        "claude" => Some("anthropic"),
        "ollama" => Some("ollama"),
        _ => None,
    }
}

/// The GenAI usage attributes and the cost.
fn usage(tokens_in: u64, tokens_out: u64, cost_usd: f64) -> [KeyValue; 3] {
    [
        KeyValue::new("gen_ai.usage.input_tokens", tokens_in as i64),
        KeyValue::new("gen_ai.usage.output_tokens", tokens_out as i64),
        KeyValue::new("hub_sidecar.cost_usd", cost_usd),
    ]
}
