//! Wire types for the hub protocol (PROTOCOL.md §3–§4): one enum per direction.
//!
//! Inbound frames are parsed tolerantly: unknown fields are ignored, unknown `type`s map to
//! [`Inbound::Other`]. Outbound frames are only ever the types the hub's validator knows;
//! there is deliberately no variant for anything else (no `task_rejected`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::task::{lenient, Task};

/// Frames from the hub.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Inbound {
    /// `identify` was accepted: the link is up and may carry task frames.
    Identified {
        /// The agent id the hub recognised (ours).
        #[serde(default, deserialize_with = "lenient")]
        agent_id: Option<String>,
    },
    /// The hub refused something: an auth error (final for this token), or a frame of ours
    /// it could not validate.
    Error {
        /// The code, e.g. `invalid_token`, `validation_failed`, `task_complete_failed: R`.
        #[serde(default, deserialize_with = "lenient")]
        error: HubErrorCode,
        /// The `type` of our frame that was refused, when the hub says.
        #[serde(default, deserialize_with = "lenient")]
        message_type: Option<String>,
        /// The validator's per-field complaints, as sent.
        #[serde(default)]
        errors: Option<Value>,
    },
    /// Heartbeat answer to our `ping`.
    Pong {
        /// The hub's clock, ms since the epoch.
        #[serde(default, deserialize_with = "lenient")]
        timestamp: Option<i64>,
    },
    /// A task for this agent (PROTOCOL.md §5); must be accepted within 60 s.
    TaskAssign(Box<Task>),
    /// The hub's answer to one of our lifecycle frames.
    TaskAck {
        /// The task the answer is about.
        task_id: String,
        /// What the hub did with the result.
        #[serde(default, deserialize_with = "lenient")]
        status: Option<AckStatus>,
    },
    /// After `task_recovering`: the task is still ours, carry on.
    TaskContinue {
        /// The task to carry on with.
        task_id: String,
        /// The generation results must now carry, when the hub sends one.
        #[serde(default, deserialize_with = "lenient")]
        generation: Option<u64>,
    },
    /// After `task_recovering`: drop the task, the hub has re-queued it.
    TaskReassign {
        /// The task to drop.
        task_id: String,
    },
    /// Stop working on the task now.
    TaskCancelled {
        /// The task to stop.
        task_id: String,
    },
    /// The hub's answer to a `state_report`.
    StateReportAck {
        /// The task the report was about.
        task_id: String,
        /// Whether to go on with the task.
        #[serde(default, deserialize_with = "lenient")]
        action: ReportAction,
    },
    /// Restart when idle (after the current task).
    RestartSidecar {
        /// Why the hub asks, for the log.
        #[serde(default, deserialize_with = "lenient")]
        reason: Option<String>,
    },
    /// A rate-limit bucket is nearly empty (the frame it precedes was still accepted).
    RateLimitWarning {
        /// Which bucket: `light`, `normal` or `heavy`; `None` for a tier this build does not know.
        #[serde(default, deserialize_with = "tier")]
        tier: Option<RateTier>,
        /// Tokens left in that bucket.
        #[serde(default, deserialize_with = "lenient")]
        remaining: u64,
        /// The bucket's size.
        #[serde(default, deserialize_with = "lenient")]
        capacity: u64,
    },
    /// Our last frame of this tier was dropped: re-send lifecycle frames after the delay.
    RateLimited {
        /// How long the bucket needs before the next frame of the tier.
        #[serde(default, deserialize_with = "lenient")]
        retry_after_ms: u64,
        /// Which bucket: `light`, `normal` or `heavy`; `None` for a tier this build does not know.
        #[serde(default, deserialize_with = "tier")]
        tier: Option<RateTier>,
    },
    /// Chat traffic and anything newer than this build: logged at debug, ignored.
    #[serde(other)]
    Other,
}

/// Why an inbound frame could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The text is not JSON at all.
    #[error("frame is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    /// JSON, but an array, string or number instead of an object.
    #[error("frame is JSON but not an object")]
    NotObject,
    /// An object without a string `type` to dispatch on.
    #[error("frame has no string `type`")]
    NoType,
    /// A known `type` whose required fields are missing or of the wrong kind.
    #[error("`{kind}` frame is malformed: {source}")]
    Malformed {
        /// The frame's `type`.
        kind: String,
        /// What serde found wrong.
        source: serde_json::Error,
    },
}

impl Inbound {
    /// Parse one text frame. Never panics; the error names what was wrong.
    pub fn parse(text: &str) -> Result<Inbound, FrameError> {
        let v: Value = serde_json::from_str(text).map_err(FrameError::NotJson)?;
        let kind = match &v {
            Value::Object(m) => match m.get("type") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(FrameError::NoType),
            },
            _ => return Err(FrameError::NotObject),
        };
        serde_json::from_value(v).map_err(|source| FrameError::Malformed { kind, source })
    }
}

/// The token, kept out of `Debug` output so it cannot leak through a log line.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// Frames to the hub. Only types the hub's validator knows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outbound {
    /// The first frame on every connection: who we are and what we can do.
    Identify {
        /// This agent's id (≤ 128 chars).
        agent_id: String,
        /// The hub token (≤ 256 chars); `Debug` prints it redacted.
        token: Secret,
        /// Display name at the hub.
        name: String,
        /// Our status as the hub shows it (e.g. `idle`).
        status: String,
        /// What tasks we can take, e.g. `code`, `shell`.
        capabilities: Vec<String>,
        /// Always `sidecar`: lets the hub tell us from other clients.
        client_type: String,
        /// Local Ollama, so the hub can route Ollama work here.
        #[serde(skip_serializing_if = "Option::is_none")]
        ollama_url: Option<String>,
    },
    /// Heartbeat; keeps the socket under the hub's 60 s idle limit.
    Ping,
    /// Our status as the hub shows it changed since `identify` announced it (the hub
    /// answers `status_updated`; light tier). Sent when the containment probe, which
    /// answers only after `identify`, finds that this agent cannot take work.
    Status {
        /// The new status (≤ 256 chars), e.g. `not accepting tasks: …`.
        status: String,
    },
    /// We took the task (due within 60 s of `task_assign`).
    TaskAccepted {
        /// The task taken.
        task_id: String,
    },
    /// Work is going on: refreshes the hub's stale-task timestamp.
    TaskProgress {
        /// The task.
        task_id: String,
        /// Percent done, when known.
        #[serde(skip_serializing_if = "Option::is_none")]
        progress: Option<u8>,
        /// One event (PROTOCOL.md §6): output, a tool call, a check result.
        #[serde(skip_serializing_if = "Option::is_none")]
        execution_event: Option<Value>,
    },
    /// The task ran to the end (verified or not: see `result.verification_status`).
    TaskComplete {
        /// The task.
        task_id: String,
        /// The generation from `task_assign`; a stale one is ignored by the hub.
        generation: u64,
        /// The result object (PROTOCOL.md §7): status, output, tokens, cost, verification.
        result: Value,
        /// Tokens of all attempts together.
        tokens_used: u64,
        /// The last attempt's verification report.
        #[serde(skip_serializing_if = "Option::is_none")]
        verification_report: Option<Value>,
        /// Every attempt's verification report, first to last.
        #[serde(skip_serializing_if = "Vec::is_empty", default)]
        verification_history: Vec<Value>,
    },
    /// The task could not be done (or we are busy): the hub re-queues or dead-letters it.
    TaskFailed {
        /// The task.
        task_id: String,
        /// The generation from `task_assign`.
        generation: u64,
        /// What went wrong (≤ 2,000 chars), the same text as `reason`.
        error: String,
        /// What went wrong (≤ 2,000 chars), e.g. `sidecar_busy`.
        reason: String,
        /// Tokens spent before the failure. This and the next two are extensions the hub
        /// ignores (PROTOCOL.md: unknown fields are ignored), sent so a failure after spending
        /// keeps its record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_used: Option<u64>,
        /// The `result`-shaped cost record of what ran.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        /// The reports of the attempts that ran before the failure.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        verification_history: Vec<Value>,
    },
    /// After a restart: we hold this task from before; may we carry on?
    TaskRecovering {
        /// The task found in the state file.
        task_id: String,
        /// Its generation.
        generation: u64,
    },
    /// Where a task stands, answered with `state_report_ack`.
    StateReport {
        /// The task.
        task_id: String,
        /// Its local state, e.g. `working`.
        status: String,
        /// Its generation.
        generation: u64,
        /// When the hub assigned it (ms since the epoch), from `task_assign`.
        #[serde(skip_serializing_if = "Option::is_none")]
        assigned_at: Option<i64>,
    },
    /// Load on this machine, every `resource_report_interval_secs`.
    ResourceReport {
        /// CPU use over all cores, 0–100.
        cpu_percent: f64,
        /// RAM in use.
        ram_used_bytes: u64,
        /// RAM installed.
        ram_total_bytes: u64,
        /// GPU memory Ollama's loaded models take, when `ollama_url` answers.
        #[serde(skip_serializing_if = "Option::is_none")]
        vram_used_bytes: Option<u64>,
        /// GPU memory in total; not measured yet, so always absent.
        #[serde(skip_serializing_if = "Option::is_none")]
        vram_total_bytes: Option<u64>,
        /// When sampled, ms since the epoch.
        timestamp: i64,
    },
}

crate::util::open_enum! {
    /// `task_ack.status`: what the hub did with a result (PROTOCOL.md §5).
    AckStatus {
        /// The assignment was taken (an answer to `task_accepted`, not to a result).
        Accepted = "accepted",
        /// The result is recorded.
        Complete = "complete",
        /// The failure was recorded and the task re-queued.
        Retried = "retried",
        /// The failure was recorded and the task given up.
        DeadLetter = "dead_letter",
    }
}

crate::util::open_enum! {
    /// `state_report_ack.action`: go on with a recovering task, or drop it.
    ReportAction {
        /// Keep the task.
        Continue = "continue",
        /// Stop and forget it.
        Abort = "abort",
    }
}

/// A hub `error` code, parsed where the frame arrives. The text is kept as sent (it is
/// logged, and a `task_*_failed` code carries the hub's reason after the colon).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(from = "String", into = "String")]
pub struct HubErrorCode(String);

/// What the daemon does about a hub `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubErrorKind {
    /// `invalid_token` / `token_agent_mismatch`: final for this token; wait long, then retry.
    Auth,
    /// `task_complete_failed: …` / `task_fail_failed: …`: the result in flight is refused
    /// for good (stale generation, unknown task).
    ResultRefused,
    /// Anything else: logged.
    Other,
}

impl HubErrorCode {
    /// How the daemon treats this code.
    pub fn kind(&self) -> HubErrorKind {
        let c = self.0.as_str();
        if c == "invalid_token" || c == "token_agent_mismatch" {
            HubErrorKind::Auth
        } else if c.starts_with("task_complete_failed") || c.starts_with("task_fail_failed") {
            HubErrorKind::ResultRefused
        } else {
            HubErrorKind::Other
        }
    }

    /// The code as the hub sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for HubErrorCode {
    fn from(s: String) -> Self {
        HubErrorCode(s)
    }
}

impl From<HubErrorCode> for String {
    fn from(c: HubErrorCode) -> String {
        c.0
    }
}

impl std::fmt::Display for HubErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `tier` field: a known tier, else `None` (never a parse failure of the whole frame).
fn tier<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<RateTier>, D::Error> {
    let s: String = lenient(d)?;
    Ok(match s.as_str() {
        "light" => Some(RateTier::Light),
        "normal" => Some(RateTier::Normal),
        "heavy" => Some(RateTier::Heavy),
        _ => None,
    })
}

/// The hub's rate-limit tier of a frame type (PROTOCOL.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateTier {
    /// 120 a minute: `ping`.
    Light,
    /// 60 a minute, shared by progress and every lifecycle frame.
    Normal,
    /// 10 a minute: `identify`.
    Heavy,
}

/// Longest `error` / `reason` the hub accepts.
pub const MAX_REASON_CHARS: usize = 2000;

impl Outbound {
    /// The wire name of this frame's type.
    pub fn kind(&self) -> &'static str {
        match self {
            Outbound::Identify { .. } => "identify",
            Outbound::Ping => "ping",
            Outbound::Status { .. } => "status",
            Outbound::TaskAccepted { .. } => "task_accepted",
            Outbound::TaskProgress { .. } => "task_progress",
            Outbound::TaskComplete { .. } => "task_complete",
            Outbound::TaskFailed { .. } => "task_failed",
            Outbound::TaskRecovering { .. } => "task_recovering",
            Outbound::StateReport { .. } => "state_report",
            Outbound::ResourceReport { .. } => "resource_report",
        }
    }

    /// Which of the hub's buckets this frame draws from.
    pub fn tier(&self) -> RateTier {
        match self {
            Outbound::Identify { .. } => RateTier::Heavy,
            Outbound::Ping | Outbound::Status { .. } => RateTier::Light,
            _ => RateTier::Normal,
        }
    }

    /// `task_failed` with error and reason truncated to the hub's limit.
    pub fn task_failed(task_id: &str, generation: u64, reason: &str) -> Outbound {
        let reason = crate::util::truncate_chars(reason, MAX_REASON_CHARS);
        Outbound::TaskFailed {
            task_id: task_id.to_string(),
            generation,
            error: reason.clone(),
            reason,
            tokens_used: None,
            result: None,
            verification_history: Vec::new(),
        }
    }

    /// Serialize with `protocol_version: 1`. Always a JSON object.
    pub fn to_text(&self) -> String {
        let mut v = serde_json::to_value(self).expect("outbound frames always serialize");
        if let Value::Object(m) = &mut v {
            m.insert("protocol_version".into(), Value::from(1));
        }
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_the_daemon_branches_on_are_parsed_once_and_unknown_ones_kept() {
        let f = |t: &str| Inbound::parse(t).unwrap();
        let Inbound::TaskAck { status, .. } =
            f(r#"{"type":"task_ack","task_id":"t","status":"dead_letter"}"#)
        else {
            panic!()
        };
        assert_eq!(status, Some(AckStatus::DeadLetter));
        let Inbound::TaskAck { status, .. } =
            f(r#"{"type":"task_ack","task_id":"t","status":"archived"}"#)
        else {
            panic!()
        };
        assert_eq!(status, Some(AckStatus::Other("archived".into())));
        let Inbound::StateReportAck { action, .. } =
            f(r#"{"type":"state_report_ack","task_id":"t","action":"abort"}"#)
        else {
            panic!()
        };
        assert_eq!(action, ReportAction::Abort);
        let Inbound::Error { error, .. } =
            f(r#"{"type":"error","error":"task_complete_failed: stale generation"}"#)
        else {
            panic!()
        };
        assert_eq!(error.kind(), HubErrorKind::ResultRefused);
        assert_eq!(error.as_str(), "task_complete_failed: stale generation");
        let Inbound::Error { error, .. } = f(r#"{"type":"error","error":"token_agent_mismatch"}"#)
        else {
            panic!()
        };
        assert_eq!(error.kind(), HubErrorKind::Auth);
        let Inbound::RateLimited { tier, .. } =
            f(r#"{"type":"rate_limited","tier":"heavy","retry_after_ms":5}"#)
        else {
            panic!()
        };
        assert_eq!(tier, Some(RateTier::Heavy));
        // A tier or status of the wrong JSON type, or one this build does not know, never
        // fails the frame.
        let Inbound::RateLimitWarning { tier, .. } =
            f(r#"{"type":"rate_limit_warning","tier":7,"remaining":3}"#)
        else {
            panic!()
        };
        assert_eq!(tier, None);
        // Serialised back, an open value is exactly the string it came from.
        assert_eq!(
            serde_json::to_string(&AckStatus::Other("x y".into())).unwrap(),
            r#""x y""#
        );
        assert_eq!(
            serde_json::to_string(&AckStatus::Complete).unwrap(),
            r#""complete""#
        );
    }

    #[test]
    fn unknown_types_and_fields_are_tolerated() {
        assert!(matches!(
            Inbound::parse(r#"{"type":"room_message","x":1}"#),
            Ok(Inbound::Other)
        ));
        assert!(matches!(
            Inbound::parse(r#"{"type":"pong","timestamp":1,"extra":true}"#),
            Ok(Inbound::Pong { timestamp: Some(1) })
        ));
        assert!(matches!(Inbound::parse("[1]"), Err(FrameError::NotObject)));
        assert!(matches!(
            Inbound::parse("nope"),
            Err(FrameError::NotJson(_))
        ));
        assert!(matches!(
            Inbound::parse(r#"{"type":"task_assign"}"#),
            Err(FrameError::Malformed { .. })
        ));
    }

    #[test]
    fn outbound_carries_type_and_version_and_hides_token_in_debug() {
        let f = Outbound::Identify {
            agent_id: "a".into(),
            token: Secret("s3cret-token".into()),
            name: "a".into(),
            status: "idle".into(),
            capabilities: vec![],
            client_type: "sidecar".into(),
            ollama_url: None,
        };
        let text = f.to_text();
        assert!(text.contains(r#""type":"identify""#));
        assert!(text.contains(r#""protocol_version":1"#));
        assert!(!text.contains("ollama_url"));
        assert!(!format!("{f:?}").contains("s3cret"));
    }

    #[test]
    fn task_failed_reason_is_capped() {
        let long = "é".repeat(5000);
        match Outbound::task_failed("t", 1, &long) {
            Outbound::TaskFailed { reason, error, .. } => {
                assert!(reason.chars().count() <= MAX_REASON_CHARS);
                assert_eq!(reason, error);
            }
            _ => unreachable!(),
        }
    }
}
