//! Progress events (PROTOCOL.md §6) and their coalescing under the hub's budget.
//!
//! Executors and the verification loop [`ProgressSink::emit`] as often as they like; the sink
//! queues everything between two sends with bounded memory (stream text keeps its tail,
//! structured events are merged, never dropped). A [`Pump`] per task turns the queue into at
//! most one `task_progress` frame per budget token, and a heartbeat frame when the task is
//! quiet so the hub's stale-task sweep leaves it alone.
//!
//! What the hub does with a frame: it reads the §6 fields of `execution_event` and ignores
//! fields it does not know (PROTOCOL.md, first section). So a verification attempt's start,
//! each check's result and each verdict ([`EventKind::own_frame`]) reach it as a frame of
//! their own, whose `event_type` and fields are that event's: a dashboard sees attempt *k*'s
//! verdict as an event even when the next retry starts milliseconds later. Everything else
//! (status lines, tool calls, errors, the stream) rides along: in the next own-frame event's
//! frame, its text after that event's, or, with no such event pending, in one frame that
//! takes the shape of the **most important** event it merges ([`EventKind::rank`]: an error
//! over a check's result, over a tool call, over a status line; the newest among equals),
//! its `text` starting with that event's text, then every other event's, oldest first, then
//! the stream's tail. `merged_events` and `folded_events` — every merged event with its own
//! `timestamp` and fields — are for readers of the raw frames and records; docs/protocol.md
//! lists them and counts the frames. A cancelled task is gone at the hub, so progress still
//! pending when the task is taken away is discarded, not flushed ([`Pump::dropped`]).
//!
//! Layout: this file holds the events and the sink; `pump.rs` sends them under the budget;
//! `tests.rs` tests the sink.

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

    /// Events of this kind each reach the hub as a frame of their own, with their own
    /// `event_type` and fields: a verification attempt's start and verdict and each check's
    /// result, which a dashboard reads from the §6 fields (PROTOCOL.md §6). At most
    /// `2 + checks` per run, so they fit the hub's budget (docs/protocol.md counts them);
    /// everything else rides along in the next such frame, or in one merged frame.
    pub fn own_frame(self) -> bool {
        matches!(
            self,
            EventKind::VerificationRetryStart
                | EventKind::VerificationCheckResult
                | EventKind::VerificationRetryComplete
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

    /// Take the next frame's `execution_event`, or `None` when nothing is pending.
    ///
    /// The oldest pending event of an [`EventKind::own_frame`] kind gets a frame of its
    /// own shape, carrying the other events that came before it (their text after its own,
    /// and all of them in `merged_events`); the events after it wait for the next frame.
    /// Without such an event, everything pending is merged into one frame
    /// ([`ProgressSink::take_merged`]). The stream's text goes with the first frame taken.
    pub fn take_event(&self) -> Option<Value> {
        self.take(false)
    }

    /// Take everything pending as one merged `execution_event` (the frame takes the shape
    /// of its most important event, [`EventKind::rank`]), or `None` when nothing is: the
    /// last batch a terminal frame carries when the budget has no room for more frames.
    pub fn take_merged(&self) -> Option<Value> {
        self.take(true)
    }

    /// An event of an [`EventKind::own_frame`] kind is waiting: the pump sends again
    /// without waiting for the next change.
    pub fn own_frame_pending(&self) -> bool {
        self.shared
            .pending
            .lock()
            .expect("progress lock poisoned")
            .events
            .iter()
            .any(|e| e.kind.own_frame())
    }

    /// Something is pending that [`ProgressSink::take_event`] would send now (a stream end
    /// held back as a possible secret's start does not count).
    pub fn pending(&self) -> bool {
        let p = self.shared.pending.lock().expect("progress lock poisoned");
        let hold = match self.shared.redactor.get() {
            Some(r) => r.partial_suffix_len(&p.stream),
            None => 0,
        };
        p.dirty && (!p.events.is_empty() || p.stream.len() > hold)
    }

    fn take(&self, merge_all: bool) -> Option<Value> {
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
        // Up to and including the first own-frame event, unless everything goes.
        let own = if merge_all {
            None
        } else {
            p.events.iter().position(|e| e.kind.own_frame())
        };
        let events: Vec<ProgressEvent> = match own {
            Some(i) => p.events.drain(..=i).collect(),
            None => std::mem::take(&mut p.events),
        };
        let rest_pending = !p.events.is_empty();
        // The stream goes with the first frame taken: what a child printed mostly came
        // before the checks that judge it, and a verdict's frame stays its own.
        let (stream, cut, stream_kind) = if p.stream.len() == hold {
            (String::new(), 0, None)
        } else {
            let keep_from = p.stream.len() - hold;
            let held = p.stream.split_off(keep_from);
            let stream = std::mem::replace(&mut p.stream, held);
            let cut = std::mem::take(&mut p.stream_cut);
            let kind = if hold > 0 {
                p.stream_kind
            } else {
                p.stream_kind.take()
            };
            (stream, cut, kind)
        };
        p.dirty = rest_pending || hold > 0;
        // The frame takes the shape of its own-frame event, else of the most important
        // event (the newest among equals: it carries the newest state), else of the stream;
        // its text comes first.
        let first = match own {
            Some(_) => Some(events.len() - 1),
            None => events
                .iter()
                .enumerate()
                .max_by_key(|(i, e)| (e.kind.rank(), *i))
                .map(|(i, _)| i),
        };
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
mod tests;
