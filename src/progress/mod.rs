//! Progress events (PROTOCOL.md §6) and their coalescing under the hub's budget.
//!
//! Executors and the verification loop [`ProgressSink::emit`] as often as they like; the sink
//! merges everything between two sends into one pending frame with bounded memory (stream
//! text keeps its tail, structured events are merged, never dropped). A [`Pump`] per task
//! turns the pending state into at most one `task_progress` frame per budget token, and a
//! heartbeat frame when the task is quiet so the hub's stale-task sweep leaves it alone.
//!
//! What the hub does with the merged frame: it reads the §6 fields of `execution_event` and
//! ignores fields it does not know (PROTOCOL.md, first section). So the frame takes the shape
//! of the **most important** event it merges ([`EventKind::rank`]: a retry's start or end
//! over an error, over a check's result, over a tool call, over a status line; the newest
//! among equals), and its `text` — a §6 field every hub shows — starts with that event's
//! text, then every other event's, oldest first, then the stream's tail: no event that
//! matters is hidden behind a status line. `merged_events` and `folded_events` — every merged
//! event with its own `timestamp` and fields — are for readers of the raw frames and records;
//! docs/protocol.md lists them. A cancelled task is gone at the hub, so progress
//! still pending when the task is taken away is discarded, not flushed ([`Pump::dropped`]).
//!
//! Layout: this file holds the events and the sink; `pump.rs` sends them under the budget.

use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use crate::redact::Redactor;
use crate::util::{now_ms, tail_bytes};

mod pump;
pub use pump::{FrameSender, Pump};

/// `execution_event.event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Text the LLM produced (streamed; may be cut, tail kept).
    Token,
    /// A child's standard output (streamed).
    Stdout,
    /// A child's standard error (streamed).
    Stderr,
    /// What the daemon is doing now, in one line (e.g. a retry, a wait).
    Status,
    /// Something went wrong that the operator should see.
    Error,
    /// An agentic tool call: `tool_name`, `args_summary`, `result_summary`, `iteration`.
    ToolCall,
    /// A verification attempt begins: `attempt`, `max_retries`.
    VerificationRetryStart,
    /// One check's outcome: `check_type`, `check_status`, `attempt`.
    VerificationCheckResult,
    /// A verification attempt ended: `attempt`, `passed`, `failed`, `status`.
    VerificationRetryComplete,
}

impl EventKind {
    /// Streamed text may be cut (tail kept); everything else must reach the hub.
    pub fn is_stream(self) -> bool {
        matches!(
            self,
            EventKind::Token | EventKind::Stdout | EventKind::Stderr
        )
    }

    /// How much the hub needs to see an event of this kind when one frame merges several
    /// (module docs): the frame takes the shape of the highest.
    pub fn rank(self) -> u8 {
        match self {
            EventKind::VerificationRetryStart | EventKind::VerificationRetryComplete => 5,
            EventKind::Error => 4,
            EventKind::VerificationCheckResult => 3,
            EventKind::ToolCall => 2,
            EventKind::Status => 1,
            EventKind::Token | EventKind::Stdout | EventKind::Stderr => 0,
        }
    }

    /// The wire name, `event_type` in the frame.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Token => "token",
            EventKind::Stdout => "stdout",
            EventKind::Stderr => "stderr",
            EventKind::Status => "status",
            EventKind::Error => "error",
            EventKind::ToolCall => "tool_call",
            EventKind::VerificationRetryStart => "verification_retry_start",
            EventKind::VerificationCheckResult => "verification_check_result",
            EventKind::VerificationRetryComplete => "verification_retry_complete",
        }
    }
}

/// One progress event. Type-specific fields (`tool_name`, `attempt`, …) go in `fields`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressEvent {
    /// Which kind of event (`event_type`).
    pub kind: EventKind,
    /// The event's text, redacted before it is sent.
    pub text: String,
    /// Tokens the task has used so far, when an LLM is running.
    pub tokens_so_far: Option<u64>,
    /// The model producing the tokens.
    pub model: Option<String>,
    /// The fields of this `event_type` (`tool_name`, `attempt`, …), sent alongside.
    pub fields: Map<String, Value>,
    /// When it happened (ms since the epoch): a merged event keeps its own time, not the
    /// time of the frame that carried it.
    pub timestamp: i64,
}

impl ProgressEvent {
    /// An event of `kind` happening now.
    pub fn new(kind: EventKind, text: impl Into<String>) -> ProgressEvent {
        ProgressEvent {
            kind,
            text: text.into(),
            tokens_so_far: None,
            model: None,
            fields: Map::new(),
            timestamp: now_ms(),
        }
    }

    /// A `status` line happening now.
    pub fn status(text: impl Into<String>) -> ProgressEvent {
        ProgressEvent::new(EventKind::Status, text)
    }

    /// Add a type-specific field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ProgressEvent {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    /// Attach the token count so far and the model producing them.
    pub fn with_tokens(mut self, tokens_so_far: u64, model: Option<&str>) -> ProgressEvent {
        self.tokens_so_far = Some(tokens_so_far);
        self.model = model.map(str::to_string);
        self
    }

    /// The `execution_event` object.
    pub fn to_json(&self) -> Value {
        let mut m = self.fields.clone();
        m.insert("event_type".into(), json!(self.kind.as_str()));
        m.insert("text".into(), json!(self.text));
        m.insert("tokens_so_far".into(), json!(self.tokens_so_far));
        m.insert("model".into(), json!(self.model));
        m.insert("timestamp".into(), json!(self.timestamp));
        Value::Object(m)
    }
}

/// A frame's text within about `max` bytes: `lead` (the head event's text; past half the
/// cap its end is cut, marked as every cut is), then the tail of `rest`.
fn lead_then_rest(lead: &str, rest: &str, max: usize) -> String {
    let mut end = lead.len().min(max / 2);
    while !lead.is_char_boundary(end) {
        end -= 1;
    }
    let lead = match lead.len() - end {
        0 => lead.to_string(),
        cut => format!("{}\n{}", &lead[..end], crate::util::elision(cut as u64)),
    };
    match (lead.is_empty(), rest.is_empty()) {
        (_, true) => lead.to_string(),
        (true, false) => tail_bytes(rest, max),
        (false, false) => format!(
            "{lead}\n{}",
            tail_bytes(rest, max.saturating_sub(lead.len() + 1))
        ),
    }
}

type Observer = Box<dyn Fn(&ProgressEvent) + Send + Sync>;

/// Cheap, cloneable handle executors and checks write progress into. Never blocks.
#[derive(Clone)]
pub struct ProgressSink {
    shared: Arc<Shared>,
}

struct Shared {
    pending: Mutex<Pending>,
    notify: Notify,
    max_text: usize,
    observer: Option<Observer>,
    /// Secrets are scrubbed on the way in, before any cut can slice one (see
    /// [`ProgressSink::set_redactor`]).
    redactor: std::sync::OnceLock<Arc<Redactor>>,
    /// The flight recorder's tap: sees every event after scrubbing (see
    /// [`ProgressSink::set_tap`]).
    tap: std::sync::OnceLock<Observer>,
}

/// Most structured events kept between two sends before the oldest are folded together.
const MAX_PENDING_EVENTS: usize = 32;

/// Fields of folded events kept per event; beyond it they are counted.
const MAX_FOLDED: usize = 64;

/// Keep `b`'s fields in `a.fields["folded_events"]` (bounded; the overflow is counted in
/// `folded_events_dropped`).
fn fold_fields(a: &mut ProgressEvent, b: &ProgressEvent) {
    let mut entry = b.fields.clone();
    entry.insert("event_type".into(), json!(b.kind.as_str()));
    let list = a
        .fields
        .entry("folded_events")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(items) = list {
        if items.len() < MAX_FOLDED {
            items.push(Value::Object(entry));
            return;
        }
    }
    let dropped = a
        .fields
        .get("folded_events_dropped")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    a.fields
        .insert("folded_events_dropped".into(), json!(dropped + 1));
}

#[derive(Default)]
struct Pending {
    /// Streamed text since the last send (tail kept, cut counted).
    stream: String,
    stream_kind: Option<EventKind>,
    stream_cut: usize,
    tokens_so_far: Option<u64>,
    model: Option<String>,
    events: Vec<ProgressEvent>,
    dirty: bool,
    /// Total events emitted (for tests and metrics).
    emitted: u64,
}

impl ProgressSink {
    /// A sink whose frames' text is capped at `max_text` bytes.
    pub fn new(max_text: usize) -> ProgressSink {
        ProgressSink::build(max_text, None)
    }

    /// A sink that also shows every event to `observer` as it happens (terminal display).
    pub fn with_observer(
        max_text: usize,
        observer: impl Fn(&ProgressEvent) + Send + Sync + 'static,
    ) -> ProgressSink {
        ProgressSink::build(max_text, Some(Box::new(observer)))
    }

    fn build(max_text: usize, observer: Option<Observer>) -> ProgressSink {
        ProgressSink {
            shared: Arc::new(Shared {
                pending: Mutex::new(Pending::default()),
                notify: Notify::new(),
                max_text: max_text.max(256),
                observer,
                redactor: std::sync::OnceLock::new(),
                tap: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Scrub secrets from everything emitted from now on, and hold back a stream's end that
    /// could be the start of one. Scrubbing only when a frame is sent is too late: the
    /// bounded buffer may have cut through a secret (leaving most of it), or its first half
    /// may have gone out in the previous frame. First call wins.
    pub fn set_redactor(&self, redactor: Arc<Redactor>) {
        let _ = self.shared.redactor.set(redactor);
    }

    /// Also show every event to `tap` once it is scrubbed (the flight recorder, which must
    /// never see a secret, unlike the terminal observer that shows local output as is).
    /// First call wins.
    pub fn set_tap(&self, tap: impl Fn(&ProgressEvent) + Send + Sync + 'static) {
        let _ = self.shared.tap.set(Box::new(tap));
    }

    /// Record an event. Memory stays bounded whatever the rate.
    pub fn emit(&self, mut ev: ProgressEvent) {
        if let Some(obs) = &self.shared.observer {
            obs(&ev);
        }
        let redactor = self.shared.redactor.get();
        if let Some(r) = redactor {
            r.scrub_in_place(&mut ev.text);
        }
        if let Some(tap) = self.shared.tap.get() {
            tap(&ev);
        }
        let max = self.shared.max_text;
        {
            let mut p = self.shared.pending.lock().expect("progress lock poisoned");
            p.emitted += 1;
            p.dirty = true;
            if ev.tokens_so_far.is_some() {
                p.tokens_so_far = ev.tokens_so_far;
            }
            if ev.model.is_some() {
                p.model = ev.model.clone();
            }
            if ev.kind.is_stream() {
                p.stream_kind = Some(ev.kind);
                p.stream.push_str(&ev.text);
                if let Some(r) = redactor {
                    // A secret split across two chunks is whole only now.
                    r.scrub_in_place(&mut p.stream);
                }
                if p.stream.len() > 2 * max {
                    let cut = crate::util::tail_start(&p.stream, max);
                    p.stream.drain(..cut);
                    p.stream_cut += cut;
                }
            } else {
                if p.events.len() >= MAX_PENDING_EVENTS {
                    // Fold the two oldest so memory stays bounded; the second one's fields
                    // (attempt, check_status, …) travel in `folded_events`, not lost.
                    let b = p.events.remove(1);
                    let a = &mut p.events[0];
                    a.text = tail_bytes(&format!("{}\n{}", a.text, b.text), max);
                    if !b.fields.is_empty() {
                        fold_fields(a, &b);
                    }
                }
                p.events.push(ev);
            }
        }
        self.shared.notify.notify_one();
    }

    /// Shorthand for a streamed chunk.
    pub fn stream(&self, kind: EventKind, text: &str) {
        self.emit(ProgressEvent::new(kind, text));
    }

    /// Events emitted so far (all, before merging).
    pub fn emitted(&self) -> u64 {
        self.shared
            .pending
            .lock()
            .expect("progress lock poisoned")
            .emitted
    }

    /// Take what is pending as one `execution_event`, or `None` when nothing is.
    pub fn take_event(&self) -> Option<Value> {
        let max = self.shared.max_text;
        let mut p = self.shared.pending.lock().expect("progress lock poisoned");
        if !p.dirty {
            return None;
        }
        // The end of the stream that may be the start of a secret waits for the next chunk.
        let hold = match self.shared.redactor.get() {
            Some(r) => r.partial_suffix_len(&p.stream),
            None => 0,
        };
        if hold > 0 && hold == p.stream.len() && p.events.is_empty() {
            return None;
        }
        p.dirty = hold > 0;
        let events = std::mem::take(&mut p.events);
        let keep_from = p.stream.len() - hold;
        let held = p.stream.split_off(keep_from);
        let stream = std::mem::replace(&mut p.stream, held);
        let cut = std::mem::take(&mut p.stream_cut);
        let stream_kind = if hold > 0 {
            p.stream_kind
        } else {
            p.stream_kind.take()
        };
        // The frame takes the shape of the most important event (the newest among equals:
        // it carries the newest state), else of the stream; its text comes first.
        let first = events
            .iter()
            .enumerate()
            .max_by_key(|(i, e)| (e.kind.rank(), *i))
            .map(|(i, _)| i);
        let mut texts: Vec<String> = events
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != first)
            .map(|(_, e)| e.text.clone())
            .collect();
        if !stream.is_empty() {
            texts.push(if cut > 0 {
                format!("{}\n{stream}", crate::util::elision(cut as u64))
            } else {
                stream
            });
        }
        let mut head = match first {
            Some(i) => events[i].clone(),
            None => ProgressEvent::new(stream_kind.unwrap_or(EventKind::Status), ""),
        };
        head.text = lead_then_rest(&head.text, &texts.join("\n"), max);
        head.tokens_so_far = p.tokens_so_far;
        head.model = p.model.clone();
        let mut v = head.to_json();
        if events.len() > 1 {
            let merged: Vec<Value> = events
                .iter()
                .map(|e| {
                    let mut j = e.to_json();
                    j["text"] = json!(crate::util::truncate_chars(&e.text, 200));
                    j
                })
                .collect();
            v["merged_events"] = Value::Array(merged);
        }
        Some(v)
    }

    async fn changed(&self) {
        self.shared.notify.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_text_is_bounded_and_keeps_the_tail() {
        let s = ProgressSink::new(1024);
        for i in 0..100_000 {
            s.stream(EventKind::Stdout, &format!("{i}\n"));
        }
        let ev = s.take_event().unwrap();
        let text = ev["text"].as_str().unwrap();
        assert!(text.len() <= 1024 + 64, "{}", text.len());
        assert!(text.ends_with("99999\n"));
        assert!(text.contains("elided"));
        assert!(s.take_event().is_none());
    }

    #[test]
    fn a_secret_split_across_chunks_or_cut_by_the_cap_never_leaves_in_pieces() {
        let s = ProgressSink::new(256);
        s.set_redactor(Arc::new(Redactor::new(vec!["tok-UNIQUE-1".to_string()])));
        s.stream(EventKind::Stdout, "a tok-UN");
        assert_eq!(s.take_event().unwrap()["text"], "a ");
        s.stream(EventKind::Stdout, "IQUE-1 b\n");
        assert_eq!(s.take_event().unwrap()["text"], "[REDACTED] b\n");
        for _ in 0..200 {
            s.stream(EventKind::Stdout, "x tok-UNIQUE-1\n");
        }
        let text = s.take_event().unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(!text.contains("UNIQUE"), "{text}");
    }

    #[test]
    fn the_tap_sees_events_only_after_scrubbing_and_the_observer_before() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shown = Arc::new(Mutex::new(Vec::new()));
        let s = {
            let shown = shown.clone();
            ProgressSink::with_observer(1024, move |e| shown.lock().unwrap().push(e.text.clone()))
        };
        s.set_redactor(Arc::new(Redactor::new(vec!["tok-UNIQUE-1".to_string()])));
        let tapped = seen.clone();
        s.set_tap(move |e| tapped.lock().unwrap().push(e.text.clone()));
        s.emit(ProgressEvent::status("key tok-UNIQUE-1"));
        assert_eq!(*seen.lock().unwrap(), ["key [REDACTED]"]);
        assert_eq!(
            *shown.lock().unwrap(),
            ["key tok-UNIQUE-1"],
            "the local display is unchanged"
        );
    }

    #[test]
    fn structured_events_are_merged_not_lost() {
        let s = ProgressSink::new(8192);
        for i in 0..40 {
            s.emit(
                ProgressEvent::new(EventKind::VerificationCheckResult, format!("check {i}"))
                    .with("attempt", 1),
            );
        }
        let ev = s.take_event().unwrap();
        assert_eq!(ev["event_type"], "verification_check_result");
        let text = ev["text"].as_str().unwrap();
        for i in 0..40 {
            assert!(text.contains(&format!("check {i}")), "lost check {i}");
        }
    }

    #[test]
    fn merged_events_keep_their_own_timestamps() {
        let s = ProgressSink::new(8192);
        for (i, ts) in [1_000_i64, 2_000, 3_000].into_iter().enumerate() {
            let mut ev = ProgressEvent::new(EventKind::ToolCall, format!("call {i}"));
            ev.timestamp = ts;
            s.emit(ev);
        }
        let v = s.take_event().unwrap();
        let stamps: Vec<i64> = v["merged_events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["timestamp"].as_i64().unwrap())
            .collect();
        assert_eq!(stamps, [1_000, 2_000, 3_000]);
        assert_eq!(
            v["timestamp"], 3_000,
            "the frame carries its newest event's time"
        );
    }

    /// The demo's "6 events in one frame" reached the hub as `[status] running claude`: the
    /// retry that started was hidden. The frame now takes the retry's shape and text first,
    /// and the status lines stay readable after it.
    #[test]
    fn a_merged_frame_leads_with_its_most_important_event() {
        let s = ProgressSink::new(8192);
        s.emit(ProgressEvent::status("retry budget: 3 corrective retries"));
        s.emit(
            ProgressEvent::new(
                EventKind::VerificationRetryStart,
                "Verification retry 1/3: fixing 1 failed check",
            )
            .with("attempt", 1)
            .with("max_retries", 3),
        );
        s.emit(ProgressEvent::status("running claude"));
        s.stream(EventKind::Token, "thinking");
        let v = s.take_event().unwrap();
        assert_eq!(v["event_type"], "verification_retry_start", "{v}");
        assert_eq!(
            (v["attempt"].clone(), v["max_retries"].clone()),
            (1.into(), 3.into())
        );
        let text = v["text"].as_str().unwrap();
        assert!(
            text.starts_with("Verification retry 1/3: fixing 1 failed check\n"),
            "{text}"
        );
        for other in [
            "retry budget: 3 corrective retries",
            "running claude",
            "thinking",
        ] {
            assert!(text.contains(other), "{other} lost: {text}");
        }
        assert_eq!(v["merged_events"].as_array().unwrap().len(), 3);
        // Among equals the newest leads; an error outranks a status line and a check.
        s.emit(ProgressEvent::new(
            EventKind::VerificationRetryComplete,
            "Retry 1/3 complete",
        ));
        s.emit(ProgressEvent::new(
            EventKind::VerificationRetryStart,
            "Verification retry 2/3",
        ));
        s.emit(ProgressEvent::status("running claude"));
        assert_eq!(
            s.take_event().unwrap()["text"]
                .as_str()
                .unwrap()
                .lines()
                .next(),
            Some("Verification retry 2/3")
        );
        s.emit(ProgressEvent::new(
            EventKind::VerificationCheckResult,
            "check: fail",
        ));
        s.emit(ProgressEvent::new(EventKind::Error, "ollama call failed"));
        s.emit(ProgressEvent::status("still working"));
        assert_eq!(s.take_event().unwrap()["event_type"], "error");
    }

    /// However long the merged text, the leading event's text is kept and the rest keeps
    /// its tail, within the cap.
    #[test]
    fn the_leading_text_survives_the_cap() {
        let s = ProgressSink::new(256);
        s.emit(ProgressEvent::new(
            EventKind::VerificationRetryStart,
            "RETRY-STARTS",
        ));
        for i in 0..30 {
            s.emit(ProgressEvent::status(format!("status line number {i:02}")));
        }
        let text = s.take_event().unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(text.starts_with("RETRY-STARTS\n"), "{text}");
        assert!(text.ends_with("status line number 29"), "{text}");
        assert!(text.len() <= 256 + 64, "{}", text.len());
    }

    #[test]
    fn folded_events_keep_their_fields() {
        let s = ProgressSink::new(8192);
        for i in 0..40u32 {
            s.emit(
                ProgressEvent::new(EventKind::VerificationCheckResult, format!("check {i}"))
                    .with("attempt", 1)
                    .with("check_status", if i % 2 == 0 { "pass" } else { "fail" })
                    .with("index", i),
            );
        }
        let ev = s.take_event().unwrap();
        let mut seen: Vec<u64> = Vec::new();
        for m in ev["merged_events"].as_array().unwrap() {
            seen.push(m["index"].as_u64().unwrap());
            for f in m["folded_events"].as_array().into_iter().flatten() {
                assert!(f["check_status"].is_string(), "{f}");
                seen.push(f["index"].as_u64().unwrap());
            }
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..40).collect::<Vec<u64>>(),
            "every event's fields arrive"
        );
    }
}
