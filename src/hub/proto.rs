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
    Identified {
        #[serde(default, deserialize_with = "lenient")]
        agent_id: Option<String>,
    },
    Error {
        #[serde(default, deserialize_with = "lenient")]
        error: String,
        #[serde(default, deserialize_with = "lenient")]
        message_type: Option<String>,
        #[serde(default)]
        errors: Option<Value>,
    },
    Pong {
        #[serde(default, deserialize_with = "lenient")]
        timestamp: Option<i64>,
    },
    TaskAssign(Box<Task>),
    TaskAck {
        task_id: String,
        #[serde(default, deserialize_with = "lenient")]
        status: Option<String>,
    },
    TaskContinue {
        task_id: String,
        #[serde(default, deserialize_with = "lenient")]
        generation: Option<u64>,
    },
    TaskReassign {
        task_id: String,
    },
    TaskCancelled {
        task_id: String,
    },
    StateReportAck {
        task_id: String,
        #[serde(default, deserialize_with = "lenient")]
        action: String,
    },
    RestartSidecar {
        #[serde(default, deserialize_with = "lenient")]
        reason: Option<String>,
    },
    RateLimitWarning {
        #[serde(default, deserialize_with = "lenient")]
        tier: String,
        #[serde(default, deserialize_with = "lenient")]
        remaining: u64,
        #[serde(default, deserialize_with = "lenient")]
        capacity: u64,
    },
    RateLimited {
        #[serde(default, deserialize_with = "lenient")]
        retry_after_ms: u64,
        #[serde(default, deserialize_with = "lenient")]
        tier: String,
    },
    /// Chat traffic and anything newer than this build: logged at debug, ignored.
    #[serde(other)]
    Other,
}

/// Why an inbound frame could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("frame is JSON but not an object")]
    NotObject,
    #[error("frame has no string `type`")]
    NoType,
    #[error("`{kind}` frame is malformed: {source}")]
    Malformed {
        kind: String,
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
    Identify {
        agent_id: String,
        token: Secret,
        name: String,
        status: String,
        capabilities: Vec<String>,
        client_type: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        ollama_url: Option<String>,
    },
    Ping,
    TaskAccepted {
        task_id: String,
    },
    TaskProgress {
        task_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        progress: Option<u8>,
        #[serde(skip_serializing_if = "Option::is_none")]
        execution_event: Option<Value>,
    },
    TaskComplete {
        task_id: String,
        generation: u64,
        result: Value,
        tokens_used: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        verification_report: Option<Value>,
        #[serde(skip_serializing_if = "Vec::is_empty", default)]
        verification_history: Vec<Value>,
    },
    TaskFailed {
        task_id: String,
        generation: u64,
        error: String,
        reason: String,
        /// Extensions the hub ignores (PROTOCOL.md: unknown fields are ignored) so a failure
        /// after spending keeps its record: tokens, the `result`-shaped cost record and the
        /// reports of the attempts that ran before the failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_used: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        verification_history: Vec<Value>,
    },
    TaskRecovering {
        task_id: String,
        generation: u64,
    },
    StateReport {
        task_id: String,
        status: String,
        generation: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        assigned_at: Option<i64>,
    },
    ResourceReport {
        cpu_percent: f64,
        ram_used_bytes: u64,
        ram_total_bytes: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        vram_used_bytes: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        vram_total_bytes: Option<u64>,
        timestamp: i64,
    },
}

/// The hub's rate-limit tier of a frame type (PROTOCOL.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateTier {
    Light,
    Normal,
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
            Outbound::Ping => RateTier::Light,
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
