//! The verification report (PROTOCOL.md §7): one per attempt.

use serde::{Deserialize, Serialize};

use crate::task::CheckType;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// The check holds.
    Pass,
    /// The check ran and does not hold: the work is wrong, a retry may fix it.
    Fail,
    /// The check could not be run (bad step, missing tool): not the LLM's fault.
    Error,
    /// The check or the run's deadline ran out.
    Timeout,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The step's `type`, e.g. `test_passes`.
    #[serde(rename = "type")]
    pub check_type: CheckType,
    /// The step's `target`, as given.
    pub target: String,
    /// The step's description, as given.
    pub description: Option<String>,
    /// How it ended.
    pub status: CheckStatus,
    /// What the check printed or found (capped at `verification.check_output_cap_bytes`).
    pub output: String,
    /// How long the check took.
    pub duration_ms: u64,
    /// Failed first, passed on the re-run. The check stays `fail` (and so does the report):
    /// a pass that needed a second run is not a pass the hub should read (see the retry loop).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flaky: bool,
    /// USD the check itself cost (an `llm_judge` call on claude); counted in the caps.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_usd: f64,
    /// Tokens the check's model read (an `llm_judge` call); summed into `result.tokens_in`.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub tokens_in: u64,
    /// Tokens the check's model wrote; summed into `result.tokens_out`.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub tokens_out: u64,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// How a whole verification run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    /// Every check passed.
    Pass,
    /// At least one check failed (and none errored or timed out).
    Fail,
    /// At least one check could not be run.
    Error,
    /// A check or the run's deadline ran out.
    Timeout,
    /// The task asked for no verification (`skip_verification`).
    Skip,
    /// The task has no steps: nothing to check, counted as verified.
    AutoPass,
}

impl ReportStatus {
    /// Whether the work counts as verified.
    pub fn is_success(self) -> bool {
        matches!(
            self,
            ReportStatus::Pass | ReportStatus::Skip | ReportStatus::AutoPass
        )
    }
}

/// Counts of the checks in a report by status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Checks run.
    pub total: u32,
    /// Passed (a flaky check is not counted here: it stays `fail`).
    pub passed: u32,
    /// Failed.
    pub failed: u32,
    /// Could not be run.
    pub errors: u32,
    /// Ran out of time.
    pub timed_out: u32,
}

/// One verification run over a task's steps, as sent in `verification_report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerificationReport {
    /// The task verified.
    pub task_id: String,
    /// Which attempt, from 1.
    pub run_number: u32,
    /// How the run ended overall.
    pub status: ReportStatus,
    /// When it started, ms since the epoch.
    pub started_at: i64,
    /// How long all checks took.
    pub duration_ms: u64,
    /// The run's deadline (the task's `verification_timeout_ms` or the config's).
    pub timeout_ms: u64,
    /// Each check, in the task's step order.
    pub checks: Vec<CheckResult>,
    /// The checks counted by status.
    pub summary: Summary,
}

impl VerificationReport {
    /// A report with no checks run: `skip` or `auto_pass`.
    pub fn empty(task_id: &str, run_number: u32, status: ReportStatus, timeout_ms: u64) -> Self {
        VerificationReport {
            task_id: task_id.to_string(),
            run_number,
            status,
            started_at: crate::util::now_ms(),
            duration_ms: 0,
            timeout_ms,
            checks: Vec::new(),
            summary: Summary::default(),
        }
    }

    /// Build from check results: overall `error` if any errored, else `timeout` if the
    /// deadline hit, else `fail` if any failed, else `pass`.
    pub fn from_checks(
        task_id: &str,
        run_number: u32,
        started_at: i64,
        duration_ms: u64,
        timeout_ms: u64,
        checks: Vec<CheckResult>,
        deadline_hit: bool,
    ) -> Self {
        let mut s = Summary {
            total: checks.len() as u32,
            ..Summary::default()
        };
        for c in &checks {
            match c.status {
                CheckStatus::Pass => s.passed += 1,
                CheckStatus::Fail => s.failed += 1,
                CheckStatus::Error => s.errors += 1,
                CheckStatus::Timeout => s.timed_out += 1,
            }
        }
        let status = if s.errors > 0 {
            ReportStatus::Error
        } else if deadline_hit || s.timed_out > 0 {
            ReportStatus::Timeout
        } else if s.failed > 0 {
            ReportStatus::Fail
        } else {
            ReportStatus::Pass
        };
        VerificationReport {
            task_id: task_id.to_string(),
            run_number,
            status,
            started_at,
            duration_ms,
            timeout_ms,
            checks,
            summary: s,
        }
    }
}

/// One attempt's record in `verification_history`: its report and what changed in the
/// workspace during it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The attempt's verification report, its fields inlined.
    #[serde(flatten)]
    pub report: VerificationReport,
    /// What changed in the workspace during the attempt.
    pub observations: Vec<String>,
}
