//! Progress events (PROTOCOL.md §6) and their coalescing under the hub's budget.
//!
//! Executors and the verification loop [`ProgressSink::emit`] as often as they like; the sink
//! merges everything between two sends into one pending frame with bounded memory (stream
//! text keeps its tail, structured events are merged, never dropped). A [`Pump`] per task
//! turns the pending state into at most one `task_progress` frame per budget token, and a
//! heartbeat frame when the task is quiet so the hub's stale-task sweep leaves it alone.
//!
//! What the hub does with the merged frame: it reads the §6 fields of `execution_event` (the
//! last merged event's) and ignores fields it does not know (PROTOCOL.md, first section), so
//! `merged_events` and `folded_events` — every merged event with its own `timestamp` and fields —
//! are for readers of the raw frames and records; docs/protocol.md lists them. A
//! cancelled task is gone at the hub, so progress still pending when the task is taken away is
//! discarded, not flushed ([`Pump::dropped`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::hub::budget::RateBudget;
use crate::hub::proto::Outbound;
use crate::redact::Redactor;
use crate::util::{now_ms, tail_bytes};

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
        let mut texts: Vec<String> = events.iter().map(|e| e.text.clone()).collect();
        if !stream.is_empty() {
            texts.push(if cut > 0 {
                format!("{}\n{stream}", crate::util::elision(cut as u64))
            } else {
                stream
            });
        }
        // The frame takes the shape of the last structured event (it carries the newest
        // state: attempt numbers, statuses), else of the stream.
        let mut head = match events.last() {
            Some(e) => e.clone(),
            None => ProgressEvent::new(stream_kind.unwrap_or(EventKind::Status), ""),
        };
        head.text = tail_bytes(&texts.join("\n"), max);
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

/// Where the pump sends its frames (the hub link, or a test's channel).
pub trait FrameSender: Send + Sync {
    /// Queue one `task_progress` frame; the budget was already taken for it.
    fn send_progress(&self, frame: Outbound);
}

/// Turns one task's pending progress into `task_progress` frames under the budget.
pub struct Pump {
    /// The task's sink, which executors and checks emit into.
    pub sink: ProgressSink,
    /// The task the frames are about.
    pub task_id: String,
    /// The hub's "normal" bucket, shared with lifecycle frames (whose reserve it keeps).
    pub budget: Arc<RateBudget>,
    /// Where frames go: the hub link, or a test's channel.
    pub out: Arc<dyn FrameSender>,
    /// Scrubs secrets from every event before it leaves.
    pub redactor: Arc<Redactor>,
    /// At most one frame per this interval.
    pub min_interval: Duration,
    /// A frame at least this often, even when nothing happened.
    pub heartbeat: Duration,
    /// Cancelled when the task is taken away (the hub cancelled it, an abort, a forced
    /// stop). The hub deletes a cancelled task, so progress still pending for it would only
    /// spend budget: it is discarded instead of flushed.
    pub dropped: CancellationToken,
}

impl Pump {
    /// Run until `cancel`. Returns the last batch when the budget had no room for it (the
    /// runner puts it in the terminal frame, so it is never lost).
    pub async fn run(self, cancel: CancellationToken) -> Option<Value> {
        let Pump {
            sink,
            task_id,
            budget,
            out,
            redactor,
            min_interval,
            heartbeat,
            dropped,
        } = self;
        let send = |mut event: Value| {
            redactor.scrub_value(&mut event);
            out.send_progress(Outbound::TaskProgress {
                task_id: task_id.clone(),
                progress: None,
                execution_event: Some(event),
            });
        };
        let mut last_sent = tokio::time::Instant::now();
        'run: loop {
            let beat = tokio::time::sleep_until(last_sent + heartbeat);
            tokio::select! {
                _ = cancel.cancelled() => break 'run,
                _ = sink.changed() => {}
                _ = beat => {
                    sink.emit(ProgressEvent::status("still working"));
                }
            }
            // Let events accumulate: one frame per interval at most.
            tokio::select! {
                _ = cancel.cancelled() => break 'run,
                _ = tokio::time::sleep_until(last_sent + min_interval) => {}
            }
            loop {
                match budget.try_progress() {
                    Ok(()) => break,
                    Err(wait) => tokio::select! {
                        _ = cancel.cancelled() => break 'run,
                        _ = tokio::time::sleep(wait) => {}
                    },
                }
            }
            if let Some(event) = sink.take_event() {
                send(event);
                last_sent = tokio::time::Instant::now();
            }
        }
        if dropped.is_cancelled() {
            let discarded = sink.take_event().is_some();
            tracing::debug!(task_id = %task_id, discarded, "task dropped: pending progress discarded");
            return None;
        }
        // The task ended: what is still pending (often the verdict's events) goes out once,
        // ahead of the terminal frame, if the budget above the reserve allows. Otherwise it
        // is handed back, for the terminal frame to carry: waiting for the budget would hold
        // up the result, and sending past the reserve would starve the lifecycle frames.
        let event = sink.take_event()?;
        if budget.try_progress().is_ok() {
            send(event);
            return None;
        }
        tracing::info!(task_id = %task_id, "the task's last progress batch goes with its result: no budget above the reserve");
        Some(event)
    }
}

/// The hub link is where a task's progress frames go in the daemon.
impl FrameSender for crate::hub::link::LinkHandle {
    fn send_progress(&self, frame: Outbound) {
        self.send(frame);
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

    struct Frames(Mutex<Vec<Outbound>>);

    impl FrameSender for Frames {
        fn send_progress(&self, frame: Outbound) {
            self.0.lock().unwrap().push(frame);
        }
    }

    async fn pump_until_stopped(dropped: bool) -> usize {
        let sink = ProgressSink::new(8192);
        let frames = Arc::new(Frames(Mutex::new(Vec::new())));
        let task_cancel = CancellationToken::new();
        let stop = task_cancel.child_token();
        let pump = Pump {
            sink: sink.clone(),
            task_id: "t".into(),
            budget: Arc::new(RateBudget::new(60, 60, 0)),
            out: frames.clone(),
            redactor: Arc::new(Redactor::new(Vec::new())),
            min_interval: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(3600),
            dropped: task_cancel.clone(),
        };
        sink.emit(ProgressEvent::status("queued before the end"));
        if dropped {
            task_cancel.cancel();
        } else {
            stop.cancel();
        }
        pump.run(stop).await;
        let n = frames.0.lock().unwrap().len();
        n
    }

    #[tokio::test]
    async fn a_dropped_task_pending_progress_is_discarded_a_finished_one_flushed() {
        assert_eq!(pump_until_stopped(false).await, 1);
        assert_eq!(pump_until_stopped(true).await, 0);
    }

    #[tokio::test]
    async fn the_last_batch_is_handed_back_when_the_budget_has_no_room() {
        let budget = Arc::new(RateBudget::new(2, 60, 1));
        let sink = ProgressSink::new(8192);
        let out = Arc::new(Frames(Mutex::new(Vec::new())));
        let pump = |budget: Arc<RateBudget>| Pump {
            sink: sink.clone(),
            task_id: "t".into(),
            budget,
            out: out.clone(),
            redactor: Arc::new(Redactor::new(Vec::new())),
            min_interval: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(3600),
            dropped: CancellationToken::new(),
        };
        // Room: sent as a frame, nothing handed back.
        sink.emit(ProgressEvent::new(EventKind::Status, "first"));
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(pump(budget.clone()).run(cancel).await, None);
        assert_eq!(out.0.lock().unwrap().len(), 1);
        // At the reserve: handed back whole, fields included.
        assert!(budget.try_progress().is_err(), "at the reserve now");
        sink.emit(
            ProgressEvent::new(EventKind::VerificationRetryComplete, "verdict").with("attempt", 1),
        );
        let cancel = CancellationToken::new();
        cancel.cancel();
        let back = pump(budget)
            .run(cancel)
            .await
            .expect("handed back, not dropped");
        assert_eq!(back["event_type"], "verification_retry_complete");
        assert_eq!(back["attempt"], 1);
        assert_eq!(out.0.lock().unwrap().len(), 1);
    }
}
