//! Verification: the task's mechanical checks, their report, and the corrective-retry loop.
//!
//! # Layout
//!
//! - [`report`]: the report shape of PROTOCOL.md §7.
//! - [`checks`]: the check types and one verification run (deadlines, progress events);
//!   `check_command`: a check's command and its verdict; [`test_runner`]: `test_passes`
//!   and its runner detection.
//! - [`observe`]: workspace snapshots and what an attempt changed.
//! - [`judge`]: the optional `llm_judge` check; [`criteria`]: success criteria with no
//!   steps, judged where a judge is configured, else said unverified.
//! - [`signature`]: failure signatures (no-progress and oscillation detection).
//! - [`prompt`]: first and corrective prompts for LLM executors.
//! - [`budget`]: the retry budget and the cost caps of one task.
//! - [`retry_loop`]: plan → execute → verify → decide → correct → report, bounded (the flaky
//!   guard, a failed check run once more, is `flaky`).

pub mod budget;
mod check_command;
pub mod checks;
pub mod criteria;
mod flaky;
pub mod judge;
pub mod observe;
pub mod prompt;
pub mod report;
pub mod retry_loop;
pub mod signature;
pub mod test_runner;

use serde::{Deserialize, Serialize};

/// Why the verification loop stopped (`result.termination_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// Every check passed.
    Verified,
    /// The corrective retries ran out with checks still failing.
    RetriesExhausted,
    /// Attempts kept failing the same way: another would not help.
    NoProgress,
    /// A cost cap (task or day) stopped the next attempt.
    BudgetExhausted,
    /// A check could not run (error or timeout): retrying the work would not fix it.
    CheckError,
    /// A failed check passed on re-run: the outcome cannot be trusted either way.
    Flaky,
    /// The executor failed.
    ExecutionFailed,
    /// The task was cancelled.
    Cancelled,
}

impl Termination {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Termination::Verified => "verified",
            Termination::RetriesExhausted => "retries_exhausted",
            Termination::NoProgress => "no_progress",
            Termination::BudgetExhausted => "budget_exhausted",
            Termination::CheckError => "check_error",
            Termination::Flaky => "flaky",
            Termination::ExecutionFailed => "execution_failed",
            Termination::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for Termination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Termination {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// `result.verification_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationStatus {
    /// Every check passed.
    Verified,
    /// The executor finished but some checks still fail.
    PartialPass,
    /// The executor itself failed; the checks said nothing.
    ExecutionFailed,
}

/// Helpers for this module's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;
    use std::sync::Arc;

    use crate::config::Config;
    use crate::executor::ExecContext;
    use crate::process::ChildEnv;
    use crate::progress::ProgressSink;
    use crate::task::Task;

    /// A context over `ws` for `task` (its `task_id` set), with the default config.
    pub(crate) fn ctx_for(ws: &Path, task: serde_json::Value) -> ExecContext {
        let mut task = task;
        task["task_id"] = serde_json::json!("t-verify");
        ExecContext {
            task: Arc::new(Task::from_value(task).unwrap()),
            workspace: ws.to_path_buf(),
            config: Arc::new(Config::for_hub("ws://127.0.0.1:1/ws", ws)),
            env: ChildEnv::inherit(),
            progress: ProgressSink::new(8192),
            cancel: tokio_util::sync::CancellationToken::new(),
            remaining_budget_usd: None,
        }
    }

    /// Run git in `ws` with a fixed identity, synchronously (tests only), asserting success.
    pub(crate) fn git(ws: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(ws)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
}
