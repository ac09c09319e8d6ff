//! The verification report (PROTOCOL.md §7): one per attempt.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    Fail,
    Error,
    Timeout,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    #[serde(rename = "type")]
    pub check_type: String,
    pub target: String,
    pub description: Option<String>,
    pub status: CheckStatus,
    pub output: String,
    pub duration_ms: u64,
    /// Failed first, passed on the re-run. Counted as a pass in the report's summary, but
    /// the task cannot be `verified` with a flaky check (see the retry loop).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flaky: bool,
    /// USD the check itself cost (an `llm_judge` call on claude); counted in the caps.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_usd: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    Pass,
    Fail,
    Error,
    Timeout,
    Skip,
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

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub total: u32,
    pub passed: u32,
    pub failed: u32,
    pub errors: u32,
    pub timed_out: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerificationReport {
    pub task_id: String,
    pub run_number: u32,
    pub status: ReportStatus,
    pub started_at: i64,
    pub duration_ms: u64,
    pub timeout_ms: u64,
    pub checks: Vec<CheckResult>,
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
#[derive(Debug, Clone, Serialize)]
pub struct AttemptRecord {
    #[serde(flatten)]
    pub report: VerificationReport,
    /// What changed in the workspace during the attempt.
    pub observations: Vec<String>,
}
