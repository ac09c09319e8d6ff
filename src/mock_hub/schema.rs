//! The hub's frame validator, rewritten from PROTOCOL.md §2 and §4 over raw JSON.
//!
//! It deliberately knows nothing of the sidecar's own wire types ([`crate::hub::proto`]):
//! it judges the `serde_json::Value` that actually crossed the socket, so a bug in our
//! serialisation shows up as a violation instead of being hidden by a shared type.
//!
//! Rules, as the real validator applies them: an unknown or missing `type` is an error;
//! required fields must be present and not `null`; optional fields are checked only when
//! present and not `null`; unknown fields pass; string length limits apply only to fields a
//! type's schema names.

use serde_json::{json, Value};

/// The JSON kinds a schema can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    /// Any JSON number (integer or float).
    Num,
    Obj,
    StrList,
    ObjList,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Str => "string",
            Kind::Int => "integer",
            Kind::Num => "number",
            Kind::Obj => "object",
            Kind::StrList => "array<string>",
            Kind::ObjList => "array<object>",
        }
    }
}

/// One message type: its required and optional fields (besides `type`).
struct Schema {
    ty: &'static str,
    required: &'static [(&'static str, Kind)],
    optional: &'static [(&'static str, Kind)],
}

use Kind::*;

/// Every type a sidecar (or any agent) may send. Anything else is a violation.
/// The chat types are listed because the hub knows them, even though the sidecar never sends them.
const SCHEMAS: &[Schema] = &[
    Schema {
        ty: "identify",
        required: &[("agent_id", Str), ("token", Str)],
        optional: &[
            ("name", Str),
            ("status", Str),
            ("capabilities", StrList),
            ("ollama_url", Str),
        ],
    },
    Schema {
        ty: "ping",
        required: &[],
        optional: &[],
    },
    Schema {
        ty: "status",
        required: &[("status", Str)],
        optional: &[],
    },
    Schema {
        ty: "list_agents",
        required: &[],
        optional: &[],
    },
    Schema {
        ty: "list_channels",
        required: &[],
        optional: &[],
    },
    Schema {
        ty: "message",
        required: &[("payload", Obj)],
        optional: &[("to", Str), ("message_type", Str), ("reply_to", Str)],
    },
    Schema {
        ty: "channel_subscribe",
        required: &[("channel", Str)],
        optional: &[],
    },
    Schema {
        ty: "channel_unsubscribe",
        required: &[("channel", Str)],
        optional: &[],
    },
    Schema {
        ty: "channel_publish",
        required: &[("channel", Str), ("payload", Obj)],
        optional: &[("message_type", Str), ("reply_to", Str)],
    },
    Schema {
        ty: "channel_history",
        required: &[("channel", Str)],
        optional: &[("limit", Int), ("since", Int)],
    },
    Schema {
        ty: "task_accepted",
        required: &[("task_id", Str)],
        optional: &[],
    },
    Schema {
        ty: "task_progress",
        required: &[("task_id", Str)],
        optional: &[("progress", Int), ("execution_event", Obj)],
    },
    Schema {
        ty: "task_complete",
        required: &[("task_id", Str), ("generation", Int)],
        optional: &[
            ("result", Obj),
            ("tokens_used", Int),
            ("verification_report", Obj),
            ("verification_history", ObjList),
        ],
    },
    Schema {
        ty: "task_failed",
        required: &[("task_id", Str), ("generation", Int)],
        optional: &[("error", Str), ("reason", Str)],
    },
    Schema {
        ty: "task_recovering",
        required: &[("task_id", Str)],
        optional: &[],
    },
    Schema {
        ty: "state_report",
        required: &[("task_id", Str)],
        optional: &[("status", Str), ("generation", Int), ("assigned_at", Int)],
    },
    Schema {
        ty: "wake_result",
        required: &[("task_id", Str), ("status", Str)],
        optional: &[("attempt", Int), ("error", Str), ("reason", Str)],
    },
    Schema {
        ty: "ollama_report",
        required: &[("ollama_url", Str)],
        optional: &[],
    },
    Schema {
        ty: "resource_report",
        required: &[],
        optional: &[
            ("cpu_percent", Num),
            ("ram_used_bytes", Num),
            ("ram_total_bytes", Num),
            ("vram_used_bytes", Num),
            ("vram_total_bytes", Num),
            ("timestamp", Num),
        ],
    },
];

/// Length limits in characters, applied only to fields the frame's schema names.
const LENGTH_LIMITS: &[(&str, usize)] = &[
    ("agent_id", 128),
    ("token", 256),
    ("name", 256),
    ("status", 256),
    ("channel", 64),
    ("description", 10_000),
    ("error", 2_000),
    ("reason", 2_000),
    ("repo", 512),
    ("ollama_url", 512),
];

/// One validation error, shaped like the hub's `{field, error, detail}` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Offending field (`type`, `generation`, `capabilities[2]`, `message`).
    pub field: String,
    /// Machine code: `required`, `wrong_type`, `too_long`, `unknown_message_type`.
    pub error: &'static str,
    /// Human detail.
    pub detail: String,
}

impl FieldError {
    fn new(field: impl Into<String>, error: &'static str, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            error,
            detail: detail.into(),
        }
    }

    /// The wire form used in a `validation_failed` error frame.
    pub fn to_json(&self) -> Value {
        json!({"field": self.field, "error": self.error, "detail": self.detail})
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.field, self.error, self.detail)
    }
}

/// All message types the validator accepts, sorted.
pub fn known_types() -> Vec<&'static str> {
    let mut v: Vec<_> = SCHEMAS.iter().map(|s| s.ty).collect();
    v.sort_unstable();
    v
}

/// Validates one decoded frame. `Ok(type)` when the hub would accept it.
pub fn validate(frame: &Value) -> Result<&str, Vec<FieldError>> {
    let Some(obj) = frame.as_object() else {
        return Err(vec![FieldError::new(
            "message",
            "wrong_type",
            "expected JSON object",
        )]);
    };
    let ty = match obj.get("type") {
        None | Some(Value::Null) => {
            return Err(vec![FieldError::new(
                "type",
                "required",
                "field is required",
            )])
        }
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(vec![FieldError::new(
                "type",
                "wrong_type",
                format!("expected string, got {}", type_name(other)),
            )])
        }
    };
    let Some(schema) = SCHEMAS.iter().find(|s| s.ty == ty) else {
        return Err(vec![FieldError::new(
            "type",
            "unknown_message_type",
            format!("unknown message type '{ty}'"),
        )]);
    };

    let mut errors = Vec::new();
    for &(field, kind) in schema.required {
        match obj.get(field) {
            None | Some(Value::Null) => {
                errors.push(FieldError::new(field, "required", "field is required"))
            }
            Some(v) => check(field, v, kind, &mut errors),
        }
    }
    for &(field, kind) in schema.optional {
        match obj.get(field) {
            None | Some(Value::Null) => {}
            Some(v) => check(field, v, kind, &mut errors),
        }
    }
    if errors.is_empty() {
        Ok(ty)
    } else {
        Err(errors)
    }
}

fn check(field: &str, v: &Value, kind: Kind, errors: &mut Vec<FieldError>) {
    let wrong = |errors: &mut Vec<FieldError>, f: String, got: &Value, want: &str| {
        errors.push(FieldError::new(
            f,
            "wrong_type",
            format!("expected {want}, got {}", type_name(got)),
        ));
    };
    match kind {
        Str | Int | Num | Obj => {
            if !is_kind(v, kind) {
                wrong(errors, field.to_string(), v, kind.name());
                return;
            }
        }
        StrList | ObjList => {
            let Some(items) = v.as_array() else {
                wrong(errors, field.to_string(), v, "array");
                return;
            };
            let item_kind = if kind == StrList { Str } else { Obj };
            // The hub reports only the first bad element.
            if let Some((i, bad)) = items
                .iter()
                .enumerate()
                .find(|(_, it)| !is_kind(it, item_kind))
            {
                wrong(errors, format!("{field}[{i}]"), bad, item_kind.name());
            }
            return;
        }
    }
    if let (Some(s), Some(&(_, max))) = (
        v.as_str(),
        LENGTH_LIMITS.iter().find(|(name, _)| *name == field),
    ) {
        if s.chars().count() > max {
            errors.push(FieldError::new(
                field,
                "too_long",
                format!("exceeds maximum length of {max} characters"),
            ));
        }
    }
}

fn is_kind(v: &Value, kind: Kind) -> bool {
    match kind {
        Str => v.is_string(),
        // Like Elixir's is_integer: 3.0 is a float, not an integer.
        Int => v.is_i64() || v.is_u64(),
        Num => v.is_number(),
        Obj => v.is_object(),
        StrList => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
        ObjList => v.as_array().is_some_and(|a| a.iter().all(Value::is_object)),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(v: Value) -> Vec<String> {
        validate(&v)
            .err()
            .unwrap_or_default()
            .iter()
            .map(|e| format!("{}:{}", e.field, e.error))
            .collect()
    }

    #[test]
    fn accepts_well_formed_frames() {
        assert_eq!(validate(&json!({"type":"ping"})), Ok("ping"));
        assert!(validate(&json!({"type":"task_complete","task_id":"t","generation":2,
            "result":{"status":"success"},"verification_history":[{}],"protocol_version":1,"extra":true}))
        .is_ok());
        assert!(
            validate(&json!({"type":"resource_report","cpu_percent":12.5,"ram_used_bytes":1}))
                .is_ok()
        );
        // null is absent for optional fields
        assert!(
            validate(&json!({"type":"task_failed","task_id":"t","generation":1,"error":null}))
                .is_ok()
        );
    }

    #[test]
    fn rejects_what_the_hub_rejects() {
        assert_eq!(
            errs(json!({"type":"task_rejected","task_id":"t"})),
            ["type:unknown_message_type"]
        );
        assert_eq!(errs(json!({"task_id":"t"})), ["type:required"]);
        assert_eq!(errs(json!([1])), ["message:wrong_type"]);
        assert_eq!(
            errs(json!({"type":"task_complete","task_id":"t","generation":null})),
            ["generation:required"]
        );
        assert_eq!(
            errs(json!({"type":"task_complete","task_id":"t","generation":"1"})),
            ["generation:wrong_type"]
        );
        assert_eq!(
            errs(json!({"type":"task_progress","task_id":"t","progress":0.5})),
            ["progress:wrong_type"]
        );
        assert_eq!(
            errs(
                json!({"type":"task_failed","task_id":"t","generation":1,"reason":"x".repeat(2001)})
            ),
            ["reason:too_long"]
        );
        assert_eq!(
            errs(json!({"type":"identify","agent_id":"a","token":"t","capabilities":["x",1]})),
            ["capabilities[1]:wrong_type"]
        );
        assert_eq!(
            errs(json!({"type":"resource_report","cpu_percent":"high"})),
            ["cpu_percent:wrong_type"]
        );
    }
}
