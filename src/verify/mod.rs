//! Verification: the task's mechanical checks, their report, and the corrective-retry loop.
//!
//! # Layout
//!
//! - [`report`]: the report shape of PROTOCOL.md §7.
//! - [`checks`]: the check types and one verification run (deadlines, progress events).
//! - [`observe`]: workspace snapshots and what an attempt changed.
//! - [`judge`]: the optional `llm_judge` check.
//! - [`signature`]: failure signatures (no-progress and oscillation detection).
//! - [`prompt`]: first and corrective prompts for LLM executors.
//! - [`retry_loop`]: execute → observe → verify → re-prompt, bounded.

pub mod checks;
pub mod judge;
pub mod observe;
pub mod prompt;
pub mod report;
pub mod retry_loop;
pub mod signature;

use serde::{Deserialize, Serialize};

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
