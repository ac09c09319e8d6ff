//! The shell executor: runs `metadata.shell_command` (never the description) with `sh -c`
//! in the workspace, in its own process group, output streamed as progress.

use std::time::{Duration, Instant};

use crate::process::{self, CommandSpec, Exit, Limits};
use crate::progress::ProgressEvent;

use super::{Attempt, ExecContext, ExecOutcome, ExecStatus, ExecutorError};

/// Runs one task's `metadata.shell_command`.
pub struct ShellExecutor {
    command: String,
}

impl ShellExecutor {
    /// The executor for `ctx.task`, which must carry a non-empty `metadata.shell_command`.
    pub fn new(ctx: &ExecContext) -> Result<ShellExecutor, ExecutorError> {
        match ctx.task.metadata.shell_command.as_deref().map(str::trim) {
            Some(c) if !c.is_empty() => Ok(ShellExecutor {
                command: c.to_string(),
            }),
            _ => Err(ExecutorError::NoShellCommand),
        }
    }

    /// Run the command; a non-zero exit is retried `shell_retries` times (default once, as
    /// the Node sidecar does). Timeouts and cancellation are never retried.
    pub async fn execute(&mut self, ctx: &ExecContext, _attempt: &Attempt) -> ExecOutcome {
        let started = Instant::now();
        let mut tries = 0;
        loop {
            let mut out = self.run_once(ctx).await;
            if out.status == ExecStatus::Failed && tries < ctx.config.executor.shell_retries {
                tries += 1;
                ctx.progress.emit(ProgressEvent::status(format!(
                    "shell command failed; retrying ({tries}/{})",
                    ctx.config.executor.shell_retries
                )));
                continue;
            }
            out.execution_ms = started.elapsed().as_millis() as u64;
            return out;
        }
    }

    async fn run_once(&self, ctx: &ExecContext) -> ExecOutcome {
        let cfg = &ctx.config.executor;
        let limits = Limits {
            timeout: Some(Duration::from_millis(
                ctx.task.metadata.timeout_ms.unwrap_or(cfg.shell_timeout_ms),
            )),
            grace: Duration::from_millis(cfg.kill_grace_ms),
            output_cap: cfg.output_cap_bytes,
        };
        let spec = CommandSpec::shell(&self.command, &ctx.workspace, ctx.env.clone());
        ctx.progress
            .emit(ProgressEvent::status("running shell command"));
        let out = match process::run(&spec, &limits, &ctx.cancel, Some(&ctx.progress)).await {
            Ok(o) => o,
            Err(e) => {
                return ExecOutcome::failed(format!(
                    "could not start `sh` in {}: {e}",
                    ctx.workspace.display()
                ))
            }
        };
        let (status, error) = match out.exit {
            Exit::Code(0) => (ExecStatus::Succeeded, None),
            Exit::TimedOut => (
                ExecStatus::TimedOut,
                Some(format!(
                    "shell command timed out after {} ms (metadata.timeout_ms); its process group was killed",
                    limits.timeout.unwrap_or_default().as_millis()
                )),
            ),
            Exit::Cancelled => (ExecStatus::Cancelled, Some("cancelled".into())),
            other => (
                ExecStatus::Failed,
                // Containment refused it a path (sandbox/denial.rs): say which and how to grant it.
                Some(match ctx.env.sandbox().and_then(|sb| sb.denial(&out.combined())) {
                    Some(denied) => format!("shell command failed with {}: {denied}", other.describe()),
                    None => format!(
                        "shell command failed with {}; stderr tail: {}",
                        other.describe(),
                        crate::util::tail_bytes(out.stderr.trim_end(), 1000)
                    ),
                }),
            ),
        };
        ExecOutcome::new(status, out.into_combined(), error)
    }
}
