//! The flight recorder: for every task, a bounded, redacted, append-only story on disk that
//! an operator reads afterwards with `hub-sidecar tasks` and `hub-sidecar show`.
//!
//! # Layout
//!
//! - this file: [`Recorder`] (the daemon-wide handle), [`TaskRecord`] (one task's writer
//!   side: redaction, bounds, the stream buffer) and the writer thread that owns the files
//!   and retention.
//! - [`story`]: reading a record back into a [`story::TaskStory`] (tolerant of a record cut
//!   short by a crash) and the list of recent tasks.
//! - `writer.rs`: the writer thread (files, retention).
//! - [`sizing`]: the byte bounds when the config leaves them unset, sized to the host.
//! - `bound.rs`: how every line of a record meets the per-task bound.
//!
//! # On disk
//!
//! `state_dir/tasks/<task id>/record.jsonl`: one JSON object per line, each with `ts` (ms)
//! and `kind` (`assigned`, `attempt_start`, `output`, `event`, `attempt_end`,
//! `verification`, `decision`, `terminal`, `cancelled`, `acked`, `truncated`). Lines are
//! appended one by one (one `write` each) as the task runs, so a crash of the daemon leaves
//! every line written before it readable; the result and ack lines are also fsynced.
//!
//! # Guarantees
//!
//! - Secrets never reach the disk: every record passes through the task's [`Redactor`]
//!   (the daemon's secrets plus the password of the task's repository URL) before it is
//!   queued; streamed output is scrubbed as a whole buffer, so a secret split across two
//!   chunks is caught, and a possible secret prefix at a buffer's end is held back.
//! - Bounded: every string in a record is capped; every line counts against the per-task
//!   bound (`recorder.max_task_bytes`): output and events stop there (keeping the head and
//!   the last chunk), the lines that tell the story are shrunk past it (see `bound.rs`);
//!   records are queued on a bounded channel and dropped (counted) rather than blocking a
//!   task; retention keeps at most `recorder.max_tasks` records and `recorder.max_total_bytes`
//!   in total, oldest removed first, checked when the first task writes and after every
//!   task. Unset, the two byte bounds are this agent's share of the host ([`sizing`]).
//! - No blocking on the runtime: files are written by one `spawn_blocking` writer that ends
//!   when every handle is dropped.

mod bound;
pub mod sizing;
pub mod story;
mod writer;

use writer::Writer;
#[cfg(test)]
use writer::{over_retention, scan};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::config::RecorderConfig;
use crate::ops::metrics::RecorderGauges;
use crate::progress::{EventKind, ProgressEvent};
use crate::redact::Redactor;
use crate::task::Task;
use crate::util::now_ms;

/// The record file inside a task's directory.
pub const RECORD_FILE: &str = "record.jsonl";
/// Records waiting for the writer; beyond this they are dropped and counted.
const QUEUE: usize = 2048;
/// Streamed output is written in chunks of about this size.
const STREAM_CHUNK: usize = 8 * 1024;
/// Cap on any one string in a record (prompts, reports, frames keep head and tail).
const MAX_STRING: usize = 32 * 1024;
/// Cap on one event's text.
const MAX_EVENT_TEXT: usize = 2 * 1024;
/// What a record line adds to its body: `ts`, `kind` and a newline.
const LINE_OVERHEAD: u64 = 48;

/// The directory name for a task id: safe characters only, bounded.
pub fn dir_name(task_id: &str) -> String {
    let safe: String = task_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    match safe.as_str() {
        "" | "." | ".." => "_".to_string(),
        _ => safe,
    }
}

/// The records' root: `state_dir/tasks`.
pub fn root(state_dir: &Path) -> PathBuf {
    state_dir.join("tasks")
}

enum Msg {
    /// Append one line to a task's record (creating it); `sync`: fsync after it.
    Line {
        dir: String,
        line: Vec<u8>,
        sync: bool,
    },
    /// Append only if the record exists (an ack for a task we recorded), and fsync.
    LineIfExists { dir: String, line: Vec<u8> },
    /// The task's runner is done with its record: retention may run.
    Done { dir: String },
}

/// The daemon-wide handle. Cheap to clone; a disabled one records nothing.
#[derive(Clone)]
pub struct Recorder {
    inner: Option<Arc<Shared>>,
}

struct Shared {
    tx: mpsc::Sender<Msg>,
    /// Bytes of output and events one task's record keeps: `recorder.max_task_bytes`, or
    /// (unset) what the writer sized it to ([`sizing`]).
    max_task_bytes: Arc<AtomicU64>,
    /// Records dropped because the writer fell behind (never expected; reported in logs).
    dropped: AtomicU64,
}

impl Recorder {
    /// A recorder that records nothing (offline commands, tests of other parts).
    pub fn disabled() -> Recorder {
        Recorder { inner: None }
    }

    /// Start the writer for records under `root`. Retention runs once at start. The
    /// returned handle ends when every clone of the recorder (and every [`TaskRecord`]) is
    /// dropped; await it so the last lines reach the disk.
    pub fn start(root: PathBuf, cfg: RecorderConfig) -> (Recorder, tokio::task::JoinHandle<()>) {
        Recorder::start_counted(root, cfg, None)
    }

    /// [`Recorder::start`], reporting the records' bytes and count and their bounds into
    /// `gauges` after each retention pass (`/metrics`: `hub_sidecar_recorder_*`).
    pub fn start_counted(
        root: PathBuf,
        cfg: RecorderConfig,
        gauges: Option<RecorderGauges>,
    ) -> (Recorder, tokio::task::JoinHandle<()>) {
        if !cfg.enabled {
            return (Recorder::disabled(), tokio::spawn(async {}));
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        // Until the writer has sized the budget (when the first task writes).
        let max_task_bytes =
            Arc::new(AtomicU64::new(cfg.max_task_bytes.unwrap_or_else(|| {
                sizing::task_bound(cfg.max_total_bytes.unwrap_or(u64::MAX))
            })));
        let writer = Writer::new(root, &cfg, max_task_bytes.clone(), gauges);
        let handle = tokio::task::spawn_blocking(move || writer.run(rx));
        let shared = Shared {
            tx,
            max_task_bytes,
            dropped: AtomicU64::new(0),
        };
        (
            Recorder {
                inner: Some(Arc::new(shared)),
            },
            handle,
        )
    }

    /// Open the record of `task` (appending when it already has one, e.g. a task run again
    /// after recovery) and write its assignment.
    pub fn open(&self, task: &Task, executor: Option<&str>, redactor: Arc<Redactor>) -> TaskRecord {
        let Some(shared) = &self.inner else {
            return TaskRecord { inner: None };
        };
        let rec = TaskRecord {
            inner: Some(Arc::new(RecordShared {
                recorder: shared.clone(),
                dir: dir_name(&task.task_id),
                redactor,
                state: Mutex::new(RecordState::default()),
            })),
        };
        let task_json = serde_json::to_value(task).unwrap_or(Value::Null);
        rec.write(
            "assigned",
            json!({
                "task_id": task.task_id,
                "generation": task.generation,
                "executor": executor,
                "task": task_json,
            }),
        );
        rec
    }

    /// The hub acknowledged the task's terminal frame (`task_ack`).
    pub fn acked(&self, task_id: &str, status: Option<&str>) {
        let Some(shared) = &self.inner else {
            return;
        };
        let line = encode(&json!({"ts": now_ms(), "kind": "acked", "status": status}));
        send(
            shared,
            Msg::LineIfExists {
                dir: dir_name(task_id),
                line,
            },
        );
    }
}

impl Shared {
    fn max_task_bytes(&self) -> u64 {
        self.max_task_bytes.load(Ordering::Relaxed)
    }
}

fn send(shared: &Shared, msg: Msg) {
    if shared.tx.try_send(msg).is_err() {
        let n = shared.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                dropped = n,
                "flight recorder falling behind: records dropped"
            );
        }
    }
}

fn encode(v: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).expect("records serialize");
    line.push(b'\n');
    line
}

/// One task's record: what the runner, the retry loop's attempter and the progress tap
/// write into. Cheap to clone; a disabled one records nothing.
#[derive(Clone)]
pub struct TaskRecord {
    inner: Option<Arc<RecordShared>>,
}

struct RecordShared {
    recorder: Arc<Shared>,
    dir: String,
    redactor: Arc<Redactor>,
    state: Mutex<RecordState>,
}

#[derive(Default)]
struct RecordState {
    /// The attempt now running (0 before the first).
    attempt: u32,
    /// Streamed text not yet written (scrubbed as a whole).
    stream: String,
    stream_kind: Option<EventKind>,
    /// Bytes of every line written so far (bounded by `max_task_bytes`, see `bound.rs`).
    bytes: u64,
    /// The newest output past the bound (at most one chunk), written when the attempt ends.
    tail: String,
    /// Output bytes left out once the bound was reached.
    elided_bytes: u64,
    truncation_noted: bool,
}

impl TaskRecord {
    /// A record that writes nothing.
    pub fn disabled() -> TaskRecord {
        TaskRecord { inner: None }
    }

    /// Append one line of `kind` that tells the story: scrubbed, strings capped,
    /// timestamped, counted against the per-task bound and shrunk past it.
    fn write(&self, kind: &str, body: Value) {
        self.put(kind, body, false);
    }

    /// Append one line of output or an event: left out (false) once the per-task bound is
    /// reached.
    fn write_bulk(&self, kind: &str, body: Value) -> bool {
        self.put(kind, body, true)
    }

    fn put(&self, kind: &str, body: Value, bulk: bool) -> bool {
        let Some(s) = &self.inner else { return false };
        let mut v = body;
        if let Value::Object(m) = &mut v {
            m.insert("ts".into(), json!(now_ms()));
            m.insert("kind".into(), json!(kind));
        }
        s.redactor.scrub_value(&mut v);
        cap_strings(&mut v, MAX_STRING);
        let mut line = encode(&v);
        let max = s.recorder.max_task_bytes();
        {
            let mut st = s.state.lock().expect("record lock");
            if st.bytes + line.len() as u64 > max {
                if bulk {
                    drop(st);
                    self.note_truncated();
                    return false;
                }
                line = bound::shrink(&mut v, encode);
            }
            st.bytes += line.len() as u64;
        }
        // The end of a task's story survives a power cut, not only a crash of the daemon.
        let sync = matches!(kind, "terminal" | "cancelled");
        send(
            &s.recorder,
            Msg::Line {
                dir: s.dir.clone(),
                line,
                sync,
            },
        );
        true
    }

    /// Attempt `n` starts with `prompt`. For `n > 1` the loop decided to retry.
    pub fn attempt_start(&self, n: u32, prompt: &str) {
        let Some(s) = &self.inner else { return };
        self.end_output();
        s.state.lock().expect("record lock").attempt = n;
        if n > 1 {
            self.write(
                "decision",
                json!({"after_attempt": n - 1, "decision": "retry",
                       "reason": "verification failed and retries remain: corrective prompt sent"}),
            );
        }
        self.write("attempt_start", json!({"attempt": n, "prompt": prompt}));
    }

    /// Attempt `n`'s execution ended (before its verification).
    pub fn attempt_end(&self, n: u32, exec: &crate::executor::ExecOutcome) {
        self.end_output();
        self.write(
            "attempt_end",
            json!({
                "attempt": n,
                "status": exec.status,
                "error": exec.error,
                "model": exec.model_used,
                "tokens_in": exec.tokens_in,
                "tokens_out": exec.tokens_out,
                "cost_usd": exec.cost_usd,
                "execution_ms": exec.execution_ms,
                "termination_reason": exec.termination_reason,
                "output": crate::process::head_tail(&exec.output, 16 * 1024),
            }),
        );
    }

    /// The containment the task's children run under ([`crate::sandbox::Policy::ran_under`]).
    pub fn containment(&self, ran_under: Value) {
        self.write("containment", ran_under);
    }

    /// The full verification report and workspace observations of attempt `n`.
    pub fn verification(&self, n: u32, report: Value, observations: &[String]) {
        self.write(
            "verification",
            json!({"attempt": n, "report": report, "observations": observations}),
        );
    }

    /// The loop stopped after attempt `after_attempt` for `decision` (its termination reason).
    pub fn final_decision(&self, after_attempt: u32, decision: &str, detail: Value) {
        let reason = match decision {
            "verified" => "every check passed",
            "no_progress" => {
                "the attempt changed nothing in the workspace and failed the same way as before"
            }
            "budget_exhausted" => "the per-task or per-day cost cap was reached",
            "retries_exhausted" => "verification still failed after the last allowed retry",
            "execution_failed" => "the executor itself failed (no verification ran)",
            "cancelled" => "the task was cancelled",
            _ => "",
        };
        self.write(
            "decision",
            json!({"after_attempt": after_attempt, "decision": decision,
                   "reason": reason, "final": true, "detail": detail}),
        );
    }

    /// What the task's children asked of the network proxy (`[network] mode =
    /// "allowlist"`): every host allowed or refused, with connections and bytes. Nothing
    /// is written when there was no proxy or nothing asked of it.
    /// The list is trimmed to the room the per-task bound leaves (see `bound.rs`).
    pub fn network(&self, hosts: &[crate::sandbox::proxy::HostUse]) {
        let Some(s) = &self.inner else { return };
        if hosts.is_empty() {
            return;
        }
        let room = {
            let st = s.state.lock().expect("record lock");
            s.recorder.max_task_bytes().saturating_sub(st.bytes)
        };
        let hosts = hosts
            .iter()
            .map(|h| serde_json::to_value(h).unwrap_or(Value::Null))
            .collect();
        self.write("network", json!({ "hosts": bound::fit_hosts(hosts, room) }));
    }

    /// The terminal frame the runner hands to the outbox (already redacted; scrubbed again).
    pub fn terminal(&self, frame: &crate::hub::proto::Outbound) {
        self.end_output();
        let v = serde_json::to_value(frame).unwrap_or(Value::Null);
        self.write("terminal", json!({"frame_type": frame.kind(), "frame": v}));
    }

    /// A tree the task left (`what`: `TMPDIR`, `temp workspace`) could not be removed
    /// (`why`) and was set aside at `to`, for an operator to delete by hand.
    pub fn set_aside(&self, what: &str, to: &Path, why: &str) {
        self.write(
            "set_aside",
            json!({"what": what, "set_aside_at": to.display().to_string(), "why": why}),
        );
    }

    /// The task ended without a terminal frame (cancelled by the hub or a forced stop).
    pub fn cancelled(&self, why: &str) {
        self.end_output();
        self.write("cancelled", json!({"reason": why}));
    }

    /// A progress event, after the sink scrubbed it: streams are buffered, the rest written.
    pub fn on_event(&self, ev: &ProgressEvent) {
        let Some(s) = &self.inner else { return };
        if ev.kind.is_stream() {
            if ev.text.is_empty() {
                return;
            }
            let switch = {
                let st = s.state.lock().expect("record lock");
                st.stream_kind.is_some_and(|k| k != ev.kind)
            };
            if switch {
                self.flush_stream(true);
            }
            let full = {
                let mut st = s.state.lock().expect("record lock");
                st.stream_kind = Some(ev.kind);
                st.stream.push_str(&ev.text);
                // A secret split across two chunks is whole only now.
                s.redactor.scrub_in_place(&mut st.stream);
                st.stream.len() >= STREAM_CHUNK
            };
            if full {
                self.flush_stream(false);
            }
            return;
        }
        self.flush_stream(true);
        let mut fields = ev.fields.clone();
        fields.remove("text");
        let body = json!({
            "event_type": ev.kind.as_str(),
            "text": crate::util::truncate_chars(&ev.text, MAX_EVENT_TEXT),
            "tokens_so_far": ev.tokens_so_far,
            "fields": Value::Object(fields),
        });
        self.write_bulk("event", body);
    }

    /// Write the buffered stream. `all = false` holds back an end that may start a secret.
    fn flush_stream(&self, all: bool) {
        let Some(s) = &self.inner else { return };
        let (text, kind, attempt) = {
            let mut st = s.state.lock().expect("record lock");
            let hold = if all {
                0
            } else {
                s.redactor.partial_suffix_len(&st.stream)
            };
            let keep = st.stream.len() - hold;
            let held = st.stream.split_off(keep);
            let text = std::mem::replace(&mut st.stream, held);
            let kind = st.stream_kind;
            if all {
                st.stream_kind = None;
            }
            (text, kind, st.attempt)
        };
        let stream = kind.map(EventKind::as_str);
        if !text.is_empty() {
            // Over the bound already (the line holds the text at least once): skip building
            // and measuring a line that cannot be kept. A long output's every chunk comes here.
            let kept = if self.bulk_exhausted(text.len()) {
                false
            } else {
                let body =
                    json!({"attempt": attempt, "stream": stream, "text": text, "elided_before": 0});
                self.write_bulk("output", body)
            };
            if !kept {
                // Over the bound: keep only the newest chunk, to show how the output ended.
                // What of `text` cannot survive is not appended only to be moved back out.
                let mut st = s.state.lock().expect("record lock");
                let skip = crate::util::tail_start(&text, STREAM_CHUNK);
                if skip > 0 {
                    st.elided_bytes += (st.tail.len() + skip) as u64;
                    st.tail.clear();
                }
                st.tail.push_str(&text[skip..]);
                let cut = crate::util::tail_start(&st.tail, STREAM_CHUNK);
                st.tail.drain(..cut);
                st.elided_bytes += cut as u64;
            }
        }
    }

    /// An attempt or the task ended: write all buffered output, and the kept end of output
    /// that went over the task's bound (one chunk per attempt at most).
    fn end_output(&self) {
        let Some(s) = &self.inner else { return };
        self.flush_stream(true);
        let (tail, elided, attempt) = {
            let mut st = s.state.lock().expect("record lock");
            (
                std::mem::take(&mut st.tail),
                std::mem::take(&mut st.elided_bytes),
                st.attempt,
            )
        };
        if !tail.is_empty() {
            self.write(
                "output",
                json!({"attempt": attempt, "text": tail, "elided_before": elided}),
            );
        }
    }

    /// True (and the one-time note) when a line of at least `at_least` bytes can no longer
    /// fit under the per-task bound: [`Self::write_bulk`] would refuse it.
    fn bulk_exhausted(&self, at_least: usize) -> bool {
        let Some(s) = &self.inner else { return true };
        let full = {
            let st = s.state.lock().expect("record lock");
            st.bytes + at_least as u64 + LINE_OVERHEAD > s.recorder.max_task_bytes()
        };
        if full {
            self.note_truncated();
        }
        full
    }

    /// Write, once per task, that the bound was reached.
    fn note_truncated(&self) {
        let Some(s) = &self.inner else { return };
        let note = !std::mem::replace(
            &mut s.state.lock().expect("record lock").truncation_noted,
            true,
        );
        if note {
            self.write(
                "truncated",
                json!({"reason": "recorder.max_task_bytes reached: further output and events of this task are left out and the lines of its story shrunk (the end of each attempt's output is kept)",
                       "max_task_bytes": s.recorder.max_task_bytes()}),
            );
        }
    }
}

impl Drop for RecordShared {
    fn drop(&mut self) {
        // The last handle of this task's record is gone: the writer may apply retention.
        send(
            &self.recorder,
            Msg::Done {
                dir: self.dir.clone(),
            },
        );
    }
}

/// Cap every string in `v` at about `max` bytes (head and tail kept).
fn cap_strings(v: &mut Value, max: usize) {
    match v {
        Value::String(s) if s.len() > max => *s = crate::process::head_tail(s, max),
        Value::Array(a) => a.iter_mut().for_each(|x| cap_strings(x, max)),
        Value::Object(m) => m.values_mut().for_each(|x| cap_strings(x, max)),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
