//! The corrective-retry loop: execute, verify, and on failure re-prompt the same LLM executor
//! with what failed, within a bounded budget. (Minimal single-attempt version until the
//! verification issue lands.)

use serde::Serialize;

use crate::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};

use super::report::{ReportStatus, VerificationReport};
use super::VerificationStatus;

/// One attempt's record in `verification_history`.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptRecord {
    #[serde(flatten)]
    pub report: VerificationReport,
    /// What changed in the workspace during the attempt.
    pub observations: Vec<String>,
}

/// The loop's result: what the runner turns into `task_complete` / `task_failed`.
#[derive(Debug, Clone)]
pub struct LoopOutcome {
    pub verification_status: VerificationStatus,
    pub attempts: Vec<AttemptRecord>,
    /// The last execution (its output and error are reported).
    pub last_exec: ExecOutcome,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub equivalent_claude_cost_usd: f64,
    pub execution_ms: u64,
    pub termination_reason: String,
}

/// Run the task to a verdict.
pub async fn run(executor: &mut Executor, ctx: &ExecContext) -> LoopOutcome {
    let task = &ctx.task;
    let attempt = Attempt {
        number: 1,
        prompt: task.description.clone(),
    };
    let exec = executor.execute(ctx, &attempt).await;
    let timeout_ms = task
        .verification_timeout_ms
        .unwrap_or(ctx.config.verification.timeout_ms);
    let (status, attempts, reason) = if exec.status != ExecStatus::Succeeded {
        (
            VerificationStatus::ExecutionFailed,
            Vec::new(),
            "execution_failed",
        )
    } else {
        let rs = if task.skip_verification {
            ReportStatus::Skip
        } else {
            ReportStatus::AutoPass
        };
        let report = VerificationReport::empty(&task.task_id, 1, rs, timeout_ms);
        (
            VerificationStatus::Verified,
            vec![AttemptRecord {
                report,
                observations: Vec::new(),
            }],
            "verified",
        )
    };
    LoopOutcome {
        verification_status: status,
        attempts,
        tokens_in: exec.tokens_in,
        tokens_out: exec.tokens_out,
        cost_usd: exec.cost_usd,
        equivalent_claude_cost_usd: exec.equivalent_claude_cost_usd,
        execution_ms: exec.execution_ms,
        termination_reason: reason.to_string(),
        last_exec: exec,
    }
}
