//! The task model: what a `task_assign` frame asks for, parsed leniently.
//!
//! The hub is trusted to send well-formed tasks, but a daemon that runs unattended must not
//! fall over on a field of the wrong type: required fields (`task_id`) are strict, every
//! other field falls back to its default when it is missing, `null` or mistyped.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Deserialize `T`, falling back to `T::default()` when the value is absent, `null` or of
/// the wrong shape. The hub treats `null` as absent; we also tolerate wrong types.
pub fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned + Default,
{
    let v = Value::deserialize(d)?;
    Ok(T::deserialize(v).unwrap_or_default())
}

/// A task as assigned by the hub (`task_assign`, PROTOCOL.md §5).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Task {
    /// The hub's id for the task; echoed in every frame about it.
    pub task_id: String,
    /// Prose for an LLM. Never run as a command.
    #[serde(default, deserialize_with = "lenient")]
    pub description: String,
    /// The submitter's extras: the shell command, timeouts, cost cap.
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: TaskMetadata,
    /// Echoed in `task_complete` / `task_failed`; the hub ignores results of old generations.
    #[serde(default, deserialize_with = "lenient")]
    pub generation: u64,
    /// When the hub assigned the task (ms since the epoch); echoed in `state_report`.
    #[serde(default, deserialize_with = "lenient")]
    pub assigned_at: Option<i64>,
    /// Repository to work in (a managed clone); none: `repo_dir` or a scratch directory.
    #[serde(default, deserialize_with = "lenient")]
    pub repo: Option<String>,
    /// Branch the clone is reset to; none: the remote's default branch.
    #[serde(default, deserialize_with = "lenient")]
    pub branch: Option<String>,
    /// Files the submitter points at; kept with the task (the prompts do not use them yet).
    #[serde(default, deserialize_with = "lenient")]
    pub file_hints: Vec<FileHint>,
    /// What "done" means, in prose: given to the LLM and to the `llm_judge`.
    #[serde(default, deserialize_with = "lenient")]
    pub success_criteria: Vec<String>,
    /// Parsed element by element, never leniently: a bad element (or a value that is not a
    /// list) becomes a step carrying [`VerificationStep::invalid`], which the checks report
    /// as `error`. Only absent, `null` or `[]` mean "no checks" — the parser never fails open.
    #[serde(default, deserialize_with = "steps_strict")]
    pub verification_steps: Vec<VerificationStep>,
    /// The hub's complexity estimate; its tier is used when there is no routing decision.
    #[serde(default, deserialize_with = "lenient")]
    pub complexity: Option<Complexity>,
    /// The hub's choice of executor, endpoint and model.
    #[serde(default, deserialize_with = "lenient")]
    pub routing_decision: Option<RoutingDecision>,
    /// Report `skip` and run no checks.
    #[serde(default, deserialize_with = "lenient")]
    pub skip_verification: bool,
    /// Deadline of one verification run; none or 0: `verification.timeout_ms`.
    #[serde(default, deserialize_with = "lenient")]
    pub verification_timeout_ms: Option<u64>,
    /// Corrective retries asked for; 0 = one attempt, absent (or not a number) = the
    /// config's `verification.default_max_retries`. The loop's effective budget, and why, is
    /// `crate::verify::budget::RetryBudget`.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_verification_retries: Option<u32>,
}

/// The hub's own cap on corrective retries.
pub const MAX_VERIFICATION_RETRIES: u32 = 5;

/// `task_assign.metadata`: free-form, with the keys the sidecar understands typed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskMetadata {
    /// The only thing the shell executor ever runs.
    #[serde(default, deserialize_with = "lenient")]
    pub shell_command: Option<String>,
    /// Execution timeout for the shell executor.
    #[serde(default, deserialize_with = "lenient")]
    pub timeout_ms: Option<u64>,
    /// Forces the Ollama executor into (true) or out of (false) the agentic tool loop.
    #[serde(default, deserialize_with = "lenient")]
    pub agentic: Option<bool>,
    /// Per-task cost cap for the verification loop, in USD.
    #[serde(default, deserialize_with = "lenient")]
    pub max_cost_usd: Option<f64>,
    /// Everything else, kept so it round-trips through the state file.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A file the submitter points at (`file_hints[]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FileHint {
    /// Path inside the repository.
    #[serde(default, deserialize_with = "lenient")]
    pub path: String,
    /// Why it matters, in prose.
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
}

crate::util::open_enum! {
    /// What kind of check a verification step is (`verification_steps[].type`). An unknown
    /// type is kept and reported as a check with status `error`.
    CheckType {
        /// `target` is a path that must exist in the workspace.
        FileExists = "file_exists",
        /// The work tree (or `target`'s part of it) has no uncommitted change.
        GitClean = "git_clean",
        /// `target` is a shell command that must exit 0.
        CommandSucceeds = "command_succeeds",
        /// `target` is a test command, or `auto` for the detected runner.
        TestPasses = "test_passes",
        /// `target` is a claim an LLM judges from the observations.
        LlmJudge = "llm_judge",
    }
}

/// One mechanical check (`verification_steps[]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VerificationStep {
    /// `file_exists`, `test_passes`, `git_clean`, `command_succeeds` (or an extension).
    #[serde(rename = "type", default)]
    pub check_type: CheckType,
    /// What to check: a path, a command, or `auto` for the detected test runner.
    #[serde(default)]
    pub target: String,
    /// The submitter's words for the check, shown in reports.
    #[serde(default)]
    pub description: Option<String>,
    /// Per-check timeout (an extension; the report's global deadline still applies).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Why this element of `verification_steps` could not be understood (index and what is
    /// wrong). Such a step is never run: it is reported as a check with status `error`.
    /// Kept through the state file so a restarted task still fails closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
}

/// The JSON type of `v`, for error messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl VerificationStep {
    /// A step standing for something that could not be parsed; it reports `error`.
    fn invalid(check_type: CheckType, target: String, why: String) -> VerificationStep {
        VerificationStep {
            check_type,
            target,
            invalid: Some(why),
            ..VerificationStep::default()
        }
    }

    /// Parse element `index` of `verification_steps`. Every field has to have its type;
    /// anything else yields an invalid step naming the index and the field.
    pub fn from_element(index: usize, v: &Value) -> VerificationStep {
        let Value::Object(m) = v else {
            return VerificationStep::invalid(
                "invalid".into(),
                String::new(),
                format!(
                    "verification_steps[{index}] is {}, expected an object with `type` and `target`",
                    json_kind(v)
                ),
            );
        };
        let mut problems = Vec::new();
        let check_type = match m.get("type") {
            Some(Value::String(t)) if !t.trim().is_empty() => CheckType::from(t.as_str()),
            None | Some(Value::Null) => {
                problems.push("`type` is missing".to_string());
                "invalid".into()
            }
            Some(other) => {
                problems.push(format!(
                    "`type` is {}, expected a non-empty string",
                    json_kind(other)
                ));
                "invalid".into()
            }
        };
        let target = match m.get("target") {
            Some(Value::String(t)) => t.clone(),
            None | Some(Value::Null) => String::new(),
            Some(other) => {
                problems.push(format!(
                    "`target` is {}, expected a string",
                    json_kind(other)
                ));
                String::new()
            }
        };
        let description = match m.get("description") {
            Some(Value::String(d)) => Some(d.clone()),
            None | Some(Value::Null) => None,
            Some(other) => {
                problems.push(format!(
                    "`description` is {}, expected a string",
                    json_kind(other)
                ));
                None
            }
        };
        let timeout_ms = match m.get("timeout_ms") {
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            None | Some(Value::Null) => None,
            Some(other) => {
                problems.push(format!(
                    "`timeout_ms` is {}, expected a whole number of milliseconds",
                    json_kind(other)
                ));
                None
            }
        };
        // Our own marker, round-tripped through the state file.
        let carried = m.get("invalid").and_then(Value::as_str).map(str::to_string);
        let invalid = carried.or_else(|| {
            (!problems.is_empty()).then(|| {
                format!(
                    "verification_steps[{index}] is invalid: {}; fix the task's verification steps",
                    problems.join(", ")
                )
            })
        });
        VerificationStep {
            check_type,
            target,
            description,
            timeout_ms,
            invalid,
        }
    }
}

/// `verification_steps`: absent or `null` → no steps; a list → one step per element (bad
/// elements become invalid steps); anything else → one invalid step, so the report is `error`.
fn steps_strict<'de, D>(d: D) -> Result<Vec<VerificationStep>, D::Error>
where
    D: Deserializer<'de>,
{
    let v = Value::deserialize(d)?;
    Ok(match &v {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, e)| VerificationStep::from_element(i, e))
            .collect(),
        other => vec![VerificationStep::invalid(
            "invalid".into(),
            String::new(),
            format!(
                "verification_steps is {}, expected a list of steps (or absent/null for no checks)",
                json_kind(other)
            ),
        )],
    })
}

/// The hub's complexity estimate (`task_assign.complexity`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Complexity {
    /// `trivial`, `standard` or `complex`.
    #[serde(default, deserialize_with = "lenient")]
    pub effective_tier: Option<String>,
    /// Who decided the tier (the submitter or the hub's classifier), as the hub says.
    #[serde(default, deserialize_with = "lenient")]
    pub source: Option<String>,
}

/// The hub's routing (`task_assign.routing_decision`): which executor, where, which model.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RoutingDecision {
    /// `trivial`, `standard` or `complex`; wins over `complexity`.
    #[serde(default, deserialize_with = "lenient")]
    pub effective_tier: Option<String>,
    /// `sidecar` (shell), `claude`, `ollama`; `wake` is refused.
    #[serde(default, deserialize_with = "lenient")]
    pub target_type: Option<String>,
    /// `host:port` of the Ollama endpoint chosen by the hub.
    #[serde(default, deserialize_with = "lenient")]
    pub selected_endpoint: Option<String>,
    /// Model the hub picked; none: the executor's configured default.
    #[serde(default, deserialize_with = "lenient")]
    pub selected_model: Option<String>,
}

/// Which executor runs a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorKind {
    /// Runs `metadata.shell_command`, nothing else.
    Shell,
    /// The Claude Code CLI in the workspace.
    Claude,
    /// An Ollama model, with or without the agentic tool loop.
    Ollama,
}

/// The task's complexity tier, which sizes timeouts and iteration caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Small work: `executor.trivial_timeout_secs`; routed to shell without a decision.
    Trivial,
    /// The default: `executor.standard_timeout_secs`; routed to Ollama without a decision.
    Standard,
    /// Large work: the standard timeout; routed to claude without a decision.
    Complex,
}

/// Why a task cannot be routed to any executor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// `target_type: wake`, the Node sidecar's wake-command path.
    #[error("routing target `wake` (legacy wake command path) is not supported by hub-sidecar; route the task to `sidecar`, `claude` or `ollama`")]
    WakeUnsupported,
    /// A target this build does not know (the name as sent).
    #[error("unknown routing target `{0}`: expected `sidecar`, `claude` or `ollama`")]
    UnknownTarget(String),
}

impl Task {
    /// Parse a `task_assign` frame (or a task file of that shape).
    pub fn from_value(v: Value) -> Result<Task, serde_json::Error> {
        serde_json::from_value(v)
    }

    /// The complexity tier: routing decision first, then complexity, default standard.
    pub fn tier(&self) -> Tier {
        let t = self
            .routing_decision
            .as_ref()
            .and_then(|r| r.effective_tier.as_deref())
            .or_else(|| {
                self.complexity
                    .as_ref()
                    .and_then(|c| c.effective_tier.as_deref())
            });
        match t {
            Some("trivial") => Tier::Trivial,
            Some("complex") => Tier::Complex,
            _ => Tier::Standard,
        }
    }

    /// Executor choice per PROTOCOL.md §5: `routing_decision.target_type`, else inferred from
    /// the tier (trivial → shell, complex → claude, otherwise ollama).
    pub fn executor_kind(&self) -> Result<ExecutorKind, RoutingError> {
        let target = self
            .routing_decision
            .as_ref()
            .and_then(|r| r.target_type.as_deref());
        match target {
            Some("sidecar") | Some("shell") => Ok(ExecutorKind::Shell),
            Some("claude") => Ok(ExecutorKind::Claude),
            Some("ollama") => Ok(ExecutorKind::Ollama),
            Some("wake") => Err(RoutingError::WakeUnsupported),
            Some(other) => Err(RoutingError::UnknownTarget(other.to_string())),
            // A shell command with no routing decision is a shell task, whatever its tier:
            // the submitter said exactly what to run.
            None if self.metadata.shell_command.is_some() => Ok(ExecutorKind::Shell),
            None => Ok(match self.tier() {
                Tier::Trivial => ExecutorKind::Shell,
                Tier::Complex => ExecutorKind::Claude,
                Tier::Standard => ExecutorKind::Ollama,
            }),
        }
    }

    /// Corrective retries the task itself asks for, capped at the hub's 5 (0 when it asks
    /// for none: the config's default then applies, see the retry loop).
    pub fn retry_budget(&self) -> u32 {
        self.max_verification_retries
            .unwrap_or(0)
            .min(MAX_VERIFICATION_RETRIES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_types_fall_back_to_defaults() {
        let t = Task::from_value(json!({
            "task_id": "t1", "description": 5, "generation": "x", "file_hints": "nope",
            "verification_steps": [{"type": "file_exists", "target": "a"}],
            "metadata": {"shell_command": ["a"], "custom": 1},
            "max_verification_retries": 9, "complexity": null
        }))
        .unwrap();
        assert_eq!(t.description, "");
        assert_eq!(t.generation, 0);
        assert!(t.file_hints.is_empty());
        assert_eq!(t.verification_steps[0].check_type, "file_exists");
        assert_eq!(t.verification_steps[0].target, "a");
        assert_eq!(t.verification_steps[0].invalid, None);
        assert_eq!(t.metadata.shell_command, None);
        assert_eq!(t.metadata.extra["custom"], json!(1));
        assert_eq!(t.retry_budget(), 5);
    }

    #[test]
    fn bad_step_elements_become_invalid_steps_naming_their_index() {
        let t = Task::from_value(json!({
            "task_id": "t",
            "verification_steps": [
                {"type": "file_exists", "target": "ok"},
                "file_exists hello.txt",
                {"type": "file_exists", "target": 3},
                {"target": "x"},
                {"type": "command_succeeds", "target": "true", "timeout_ms": "soon"}
            ]
        }))
        .unwrap();
        let steps = &t.verification_steps;
        assert_eq!(steps.len(), 5);
        assert_eq!(steps[0].invalid, None);
        let why: Vec<&str> = steps[1..]
            .iter()
            .map(|s| s.invalid.as_deref().unwrap())
            .collect();
        assert!(
            why[0].contains("verification_steps[1] is a string"),
            "{why:?}"
        );
        assert!(
            why[1].contains("verification_steps[2]") && why[1].contains("`target` is a number")
        );
        assert!(why[2].contains("verification_steps[3]") && why[2].contains("`type` is missing"));
        assert!(why[3].contains("verification_steps[4]") && why[3].contains("`timeout_ms`"));
        // The marker survives the state file.
        let again = Task::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert_eq!(again.verification_steps, t.verification_steps);
    }

    #[test]
    fn steps_that_are_not_a_list_never_mean_no_checks() {
        for v in [
            json!({"type": "file_exists"}),
            json!("x"),
            json!(3),
            json!(true),
        ] {
            let t = Task::from_value(json!({"task_id": "t", "verification_steps": v})).unwrap();
            assert_eq!(t.verification_steps.len(), 1, "{v}");
            assert!(t.verification_steps[0]
                .invalid
                .as_deref()
                .unwrap()
                .contains("expected a list"));
        }
        for v in [json!(null), json!([])] {
            let t = Task::from_value(json!({"task_id": "t", "verification_steps": v})).unwrap();
            assert!(t.verification_steps.is_empty());
        }
        let t = Task::from_value(json!({"task_id": "t"})).unwrap();
        assert!(t.verification_steps.is_empty());
    }

    #[test]
    fn missing_task_id_is_an_error() {
        assert!(Task::from_value(json!({"description": "x"})).is_err());
    }

    #[test]
    fn executor_choice_follows_routing_then_tier() {
        let mut t = Task::from_value(json!({"task_id": "t"})).unwrap();
        assert_eq!(t.executor_kind(), Ok(ExecutorKind::Ollama));
        t.complexity = Some(Complexity {
            effective_tier: Some("trivial".into()),
            source: None,
        });
        assert_eq!(t.executor_kind(), Ok(ExecutorKind::Shell));
        t.routing_decision = Some(RoutingDecision {
            target_type: Some("claude".into()),
            ..Default::default()
        });
        assert_eq!(t.executor_kind(), Ok(ExecutorKind::Claude));
        t.routing_decision.as_mut().unwrap().target_type = Some("wake".into());
        assert_eq!(t.executor_kind(), Err(RoutingError::WakeUnsupported));
    }

    #[test]
    fn a_shell_command_without_routing_runs_in_the_shell() {
        let t = Task::from_value(
            json!({"task_id": "t", "metadata": {"shell_command": "make test"},
            "complexity": {"effective_tier": "standard"}}),
        )
        .unwrap();
        assert_eq!(t.executor_kind(), Ok(ExecutorKind::Shell));
        let routed = Task::from_value(
            json!({"task_id": "t", "metadata": {"shell_command": "make"},
            "routing_decision": {"target_type": "claude"}}),
        )
        .unwrap();
        assert_eq!(routed.executor_kind(), Ok(ExecutorKind::Claude));
    }
}
