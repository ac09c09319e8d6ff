//! The flaky guard: a failed command check is run once more within what is left of the
//! report's deadline; a pass then marks it `flaky` and leaves it `fail` (the loop's module
//! docs say why a pass on re-run never verifies a task).

use crate::executor::ExecContext;
use crate::progress::ProgressEvent;
use crate::task::CheckType;

use super::checks;
use super::report::{CheckStatus, VerificationReport};

/// Re-run each failed `test_passes` / `command_succeeds` once, within what is left of the
/// report's deadline; a pass on re-run marks the check `flaky` and leaves it `fail` (the loop
/// never counts it as verified: module docs).
pub(super) async fn guard(
    ctx: &ExecContext,
    mut report: VerificationReport,
    observations: &[String],
) -> VerificationReport {
    let timeout_ms = report.timeout_ms;
    let guard_start = tokio::time::Instant::now();
    let left_at_start = timeout_ms.saturating_sub(report.duration_ms);
    for (i, check) in report.checks.iter_mut().enumerate() {
        let rerunnable = matches!(
            check.check_type,
            CheckType::TestPasses | CheckType::CommandSucceeds
        );
        if check.status != CheckStatus::Fail || !rerunnable {
            continue;
        }
        let Some(step) = ctx.task.verification_steps.get(i) else {
            continue;
        };
        let left = left_at_start.saturating_sub(guard_start.elapsed().as_millis() as u64);
        if left == 0 {
            break; // the deadline is spent: the failure stands
        }
        let bound_ms = step
            .timeout_ms
            .filter(|t| *t > 0)
            .unwrap_or(timeout_ms)
            .min(left);
        let again = checks::run_step(
            ctx,
            step,
            std::time::Duration::from_millis(bound_ms),
            observations,
        )
        .await;
        if again.status == CheckStatus::Pass {
            check.flaky = true;
            check.output = format!(
                "{}\n[failed first, passed on re-run: flaky, so it stays `fail` and the task is not counted as verified]\n{}",
                check.output, again.output
            );
            ctx.progress.emit(ProgressEvent::status(format!(
                "flaky check: {} {} failed, then passed on re-run",
                check.check_type, check.target
            )));
            checks::emit_result(ctx, check, report.run_number);
        }
    }
    report
}
