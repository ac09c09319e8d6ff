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
    Verified,
    PartialPass,
    ExecutionFailed,
}
