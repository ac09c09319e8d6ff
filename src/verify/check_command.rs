//! Running a check's command and reading its verdict: the one bound (timeout, short kill
//! grace, capped output) every check command gets, and what its exit means — 0 passes,
//! non-zero fails, a command that cannot start or a path containment refused is an error no
//! edit can fix.

use std::time::Duration;

use crate::executor::ExecContext;
use crate::process::{self, CommandSpec, Exit, Limits};

use super::report::CheckStatus;

/// SIGTERM → SIGKILL grace for check commands. Short on purpose: a check is disposable and
/// the report's deadline must hold even when a test runner ignores SIGTERM.
pub(super) const CHECK_KILL_GRACE: Duration = Duration::from_millis(300);

/// `command_succeeds`: the target run with `sh -c`.
pub(super) async fn command_succeeds(
    ctx: &ExecContext,
    target: &str,
    bound: Duration,
) -> (CheckStatus, String) {
    if target.trim().is_empty() {
        return (
            CheckStatus::Error,
            "command_succeeds needs a command as its target; the target is empty".into(),
        );
    }
    let spec = CommandSpec::shell(target, &ctx.workspace, ctx.env.clone());
    command_result(ctx, &spec, bound, "sh").await
}

/// Run `spec` within `bound` with the check's limits.
pub(super) async fn run_bounded(
    ctx: &ExecContext,
    spec: &CommandSpec,
    bound: Duration,
) -> std::io::Result<process::RunOutput> {
    let limits = Limits {
        timeout: Some(bound),
        grace: CHECK_KILL_GRACE,
        output_cap: ctx.config.verification.check_output_cap_bytes.max(1024),
    };
    process::run(spec, &limits, &ctx.cancel, None).await
}

pub(super) fn timed_out(bound: Duration, output: &str) -> (CheckStatus, String) {
    (
        CheckStatus::Timeout,
        format!(
            "timed out after {} ms; the process group was killed\n{output}",
            bound.as_millis()
        ),
    )
}

/// Exit 0 → pass, non-zero → fail, not startable → error.
pub(super) async fn command_result(
    ctx: &ExecContext,
    spec: &CommandSpec,
    bound: Duration,
    program: &str,
) -> (CheckStatus, String) {
    let out = match run_bounded(ctx, spec, bound).await {
        Ok(o) => o,
        Err(e) => {
            return (
                CheckStatus::Error,
                format!("could not start `{program}`: {e}"),
            )
        }
    };
    let text = out.combined();
    match out.exit {
        Exit::Code(0) => (CheckStatus::Pass, text),
        Exit::TimedOut => timed_out(bound, &text),
        Exit::Cancelled => (CheckStatus::Error, format!("cancelled\n{text}")),
        // sh reports a missing program as 127: the check could not run at all.
        Exit::Code(127) if text.contains("not found") && program != "sh" => (
            CheckStatus::Error,
            format!("`{program}` is not installed: {text}"),
        ),
        // Containment refused it a path (sandbox/denial.rs): no edit can fix that.
        other => match ctx.env.sandbox().and_then(|sb| sb.denial(&text)) {
            Some(denied) => (CheckStatus::Error, format!("{denied}\n{text}")),
            None => (CheckStatus::Fail, format!("{text}\n[{}]", other.describe())),
        },
    }
}
