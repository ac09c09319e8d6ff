//! Verification: the task's mechanical checks, their report, and the corrective-retry loop.
//!
//! # Layout
//!
//! - [`report`]: the report shape of PROTOCOL.md §7.
//! - [`retry_loop`]: execute → verify → re-prompt, bounded.

pub mod report;
pub mod retry_loop;

use serde::{Deserialize, Serialize};

/// `result.verification_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationStatus {
    Verified,
    PartialPass,
    ExecutionFailed,
}
