//! Reading flight records back: one task's [`TaskStory`] (for `hub-sidecar show`) and the
//! list of recent tasks (for `hub-sidecar tasks`).
//!
//! Only reads files, so it works while the daemon runs and after it stopped. A record cut
//! short by a crash is still a story: a torn last line is skipped and counted, and a task
//! with neither a terminal frame nor a cancellation is shown as `unfinished`. When a task
//! ran more than once (recovered after a restart, assigned again), the story is of its last
//! run and `runs` says how many there were.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::RECORD_FILE;

/// One attempt: the prompt, what the executor did, what verification found, what the loop
/// decided.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AttemptStory {
    /// Which attempt, from 1.
    pub attempt: u32,
    /// When it started, ms since the epoch.
    pub started_at: Option<i64>,
    /// The prompt the executor was given (redacted), for LLM executors.
    pub prompt: Option<String>,
    /// The executor's end: status, error, model, tokens, cost, duration, final output.
    pub execution: Option<Value>,
    /// Streamed output as recorded (bounded; `[… N bytes elided …]` where cut).
    pub output: String,
    /// Structured progress events of the attempt (status, tool calls, errors, checks).
    pub events: Vec<Value>,
    /// The verification report (checks with status and output).
    pub report: Option<Value>,
    /// What changed in the workspace.
    pub observations: Vec<String>,
    /// The loop's decision after this attempt (`retry`, `verified`, `no_progress`, …).
    pub decision: Option<Value>,
}

/// A task's whole record, in order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskStory {
    /// The hub's id for the task.
    pub task_id: String,
    /// The generation of the last run.
    pub generation: u64,
    /// `shell`, `claude` or `ollama`, once chosen.
    pub executor: Option<String>,
    /// The task as assigned (redacted).
    pub task: Value,
    /// When the last run started, ms since the epoch.
    pub started_at: i64,
    /// Last line written.
    pub last_at: i64,
    /// `verified`, `partial`, `failed`, `cancelled` or `unfinished` (running, or the daemon
    /// stopped before the task ended).
    pub status: String,
    /// Why the loop stopped (its last decision).
    pub stop: Option<Value>,
    /// The containment the task's children ran under: `level` and, below strict, what was
    /// `not_enforced`. `None` when the task never got that far.
    pub containment: Option<Value>,
    /// Each attempt, in order.
    pub attempts: Vec<AttemptStory>,
    /// The terminal frame handed to the outbox (`task_complete` / `task_failed`).
    pub terminal: Option<Value>,
    /// The hub's `task_ack` for it: `{ts, status}`.
    pub acked: Option<Value>,
    /// Why the task was taken away (the hub cancelled it, an abort, a forced stop).
    pub cancelled: Option<String>,
    /// USD spent over all attempts.
    pub cost_usd: f64,
    /// LLM tokens over all attempts.
    pub tokens: u64,
    /// The record hit `recorder.max_task_bytes`: some output and events are left out.
    pub truncated: bool,
    /// Times the task was started (recovery, re-assignment).
    pub runs: u32,
    /// Lines that could not be read (a torn last line after a crash).
    pub unreadable_lines: u32,
    /// Hosts the task's children asked the network proxy for: `{target, allowed,
    /// connections, bytes_up, bytes_down}`, plus `unreachable` and `last_error` when connections
    /// to an allowed host failed (`[network] mode = "allowlist"` only).
    pub network: Vec<Value>,
}

/// One line of `hub-sidecar tasks`.
#[derive(Debug, Clone, Serialize)]
pub struct TaskSummary {
    /// The hub's id for the task.
    pub task_id: String,
    /// When its last run started, ms since the epoch.
    pub started_at: i64,
    /// `shell`, `claude` or `ollama`, once chosen.
    pub executor: Option<String>,
    /// From start to the last line written.
    pub duration_ms: u64,
    /// Attempts made.
    pub attempts: usize,
    /// As [`TaskStory::status`].
    pub status: String,
    /// USD spent.
    pub cost_usd: f64,
    /// Whether the hub acknowledged the result.
    pub acked: bool,
}

impl TaskStory {
    /// Read the record of `task_id` under `root` (`state_dir/tasks`).
    pub fn load(root: &Path, task_id: &str) -> std::io::Result<TaskStory> {
        let path = root.join(super::dir_name(task_id)).join(RECORD_FILE);
        let text = std::fs::read_to_string(&path)?;
        Ok(TaskStory::parse(&text))
    }

    /// Build a story from a record's text.
    pub fn parse(text: &str) -> TaskStory {
        TaskStory::parse_lines(text, false)
    }

    /// The story without output and events: enough for [`TaskStory::summary`], and cheap
    /// (those lines are most of a record). A `"kind":"output"` outside a string can only be
    /// the key itself: inside one its quotes are escaped.
    fn parse_lines(text: &str, skip_bulk: bool) -> TaskStory {
        let mut s = TaskStory {
            status: "unfinished".into(),
            ..TaskStory::default()
        };
        let bulk = |l: &str| l.contains("\"kind\":\"output\"") || l.contains("\"kind\":\"event\"");
        for line in text
            .lines()
            .filter(|l| !(l.trim().is_empty() || skip_bulk && bulk(l)))
        {
            match serde_json::from_str::<Value>(line) {
                Ok(v) => s.apply(v),
                Err(_) => s.unreadable_lines += 1,
            }
        }
        s
    }

    fn attempt_mut(&mut self, n: u32) -> &mut AttemptStory {
        let n = n.max(1);
        if let Some(i) = self.attempts.iter().position(|a| a.attempt == n) {
            return &mut self.attempts[i];
        }
        self.attempts.push(AttemptStory {
            attempt: n,
            ..AttemptStory::default()
        });
        self.attempts.last_mut().expect("just pushed")
    }

    fn current_attempt(&self) -> u32 {
        self.attempts.last().map(|a| a.attempt).unwrap_or(1)
    }

    fn apply(&mut self, v: Value) {
        let ts = v["ts"].as_i64().unwrap_or(0);
        self.last_at = self.last_at.max(ts);
        let n = |v: &Value, key: &str| v[key].as_u64().unwrap_or(0) as u32;
        match v["kind"].as_str().unwrap_or("") {
            "assigned" => {
                let runs = self.runs + 1;
                let unreadable = self.unreadable_lines;
                *self = TaskStory {
                    task_id: v["task_id"].as_str().unwrap_or("").to_string(),
                    generation: v["generation"].as_u64().unwrap_or(0),
                    executor: v["executor"].as_str().map(str::to_string),
                    task: v["task"].clone(),
                    started_at: ts,
                    last_at: ts,
                    status: "unfinished".into(),
                    runs,
                    unreadable_lines: unreadable,
                    ..TaskStory::default()
                };
            }
            "attempt_start" => {
                let a = self.attempt_mut(n(&v, "attempt"));
                a.started_at = Some(ts);
                a.prompt = v["prompt"].as_str().map(str::to_string);
            }
            "attempt_end" => {
                self.cost_usd += v["cost_usd"].as_f64().unwrap_or(0.0);
                self.tokens +=
                    v["tokens_in"].as_u64().unwrap_or(0) + v["tokens_out"].as_u64().unwrap_or(0);
                let a = n(&v, "attempt");
                self.attempt_mut(a).execution = Some(v);
            }
            "output" => {
                let a = n(&v, "attempt");
                let at = self.attempt_mut(a);
                let elided = v["elided_before"].as_u64().unwrap_or(0);
                if elided > 0 {
                    at.output.push('\n');
                    at.output.push_str(&crate::util::elision(elided));
                    at.output.push('\n');
                }
                at.output.push_str(v["text"].as_str().unwrap_or(""));
            }
            "event" => {
                // `run_number` is the execution; the loop's `attempt` is its retry number.
                let a = v["fields"]["run_number"]
                    .as_u64()
                    .map(|x| x as u32)
                    .unwrap_or_else(|| self.current_attempt());
                self.attempt_mut(a).events.push(v);
            }
            "containment" => {
                let mut c = v;
                if let Some(o) = c.as_object_mut() {
                    o.remove("ts");
                    o.remove("kind");
                }
                self.containment = Some(c);
            }
            "verification" => {
                let a = n(&v, "attempt");
                let at = self.attempt_mut(a);
                at.report = Some(v["report"].clone());
                at.observations = v["observations"]
                    .as_array()
                    .map(|o| {
                        o.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
            }
            "decision" => {
                let after = n(&v, "after_attempt");
                if v["final"].as_bool() == Some(true) {
                    self.stop = Some(v.clone());
                }
                if after > 0 {
                    self.attempt_mut(after).decision = Some(v);
                }
            }
            "terminal" => {
                let frame = &v["frame"];
                self.status = match v["frame_type"].as_str() {
                    Some("task_failed") => "failed".into(),
                    _ if frame["result"]["verification_status"] == "verified" => "verified".into(),
                    _ => "partial".into(),
                };
                self.terminal = Some(v);
            }
            "cancelled" => {
                self.status = "cancelled".into();
                self.cancelled = v["reason"].as_str().map(str::to_string);
            }
            "acked" => {
                self.acked = Some(serde_json::json!({"ts": ts, "status": v["status"]}));
            }
            "network" => {
                self.network = v["hosts"].as_array().cloned().unwrap_or_default();
            }
            "truncated" => self.truncated = true,
            _ => {}
        }
    }

    /// The one-line view of this story for `hub-sidecar tasks`.
    pub fn summary(&self) -> TaskSummary {
        TaskSummary {
            task_id: self.task_id.clone(),
            started_at: self.started_at,
            executor: self.executor.clone(),
            duration_ms: (self.last_at - self.started_at).max(0) as u64,
            attempts: self.attempts.len(),
            status: self.status.clone(),
            cost_usd: self.cost_usd,
            acked: self.acked.is_some(),
        }
    }
}

/// The most recent `limit` tasks under `root`, newest first. Unreadable records are skipped.
pub fn recent(root: &Path, limit: usize) -> std::io::Result<Vec<TaskSummary>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<TaskSummary> = entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join(RECORD_FILE)).ok())
        .map(|text| TaskStory::parse_lines(&text, true).summary())
        .filter(|s| !s.task_id.is_empty())
        .collect();
    out.sort_by_key(|s| std::cmp::Reverse(s.started_at));
    out.truncate(limit);
    Ok(out)
}

/// `2026-11-23 16:40:01` (UTC) for a millisecond timestamp.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
