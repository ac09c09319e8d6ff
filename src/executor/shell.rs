//! The shell executor: runs `metadata.shell_command` (never the description) with `sh -c`
//! in the workspace, in its own process group, output streamed as progress.
//!
//! A shell command runs **once**. A migration, a deploy or a `git push` must not run twice
//! because it exited non-zero, and CI systems never retry a step unless the pipeline asks.
//! Running it again is the operator's explicit choice (`executor.shell_retries`, default 0):
//! then it is announced before the first run and before each re-run, and every run's exit
//! and error tail is kept in [`ExecOutcome::shell_runs`] (`result.shell_runs`) and in the
//! failure reason, first run first, so a later failure never hides the first one.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::process::{self, CommandSpec, Exit, Limits};
use crate::progress::ProgressEvent;

use super::{Attempt, ExecContext, ExecOutcome, ExecStatus, ExecutorError};

/// Bytes of a failed run's stderr kept in its reason and in its [`ShellRun`].
const ERROR_TAIL_BYTES: usize = 1000;

/// One run of the command, as `result.shell_runs[]` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellRun {
    /// 1-based: run 1 is the first, run 2 the first re-run.
    pub run: u32,
    /// How it ended: `exit code 3`, `killed by signal 9`, `timed out`, `cancelled`, or
    /// `not started`.
    pub exit: String,
    /// Why it failed (with the tail of its stderr); `None` for a run that succeeded.
    pub error: Option<String>,
    /// Wall time of this run.
    pub execution_ms: u64,
}

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

    /// Run the command once; a non-zero exit is run again only when the operator set
    /// `executor.shell_retries` (module docs). Timeouts and cancellation are never re-run.
    pub async fn execute(&mut self, ctx: &ExecContext, _attempt: &Attempt) -> ExecOutcome {
        let started = Instant::now();
        let retries = ctx.config.executor.shell_retries;
        if retries > 0 {
            ctx.progress.emit(
                ProgressEvent::status(format!(
                    "executor.shell_retries = {retries}: a failing shell command is run again, up to {retries} more time(s)"
                ))
                .with("shell_retries", retries),
            );
        }
        let mut runs: Vec<ShellRun> = Vec::new();
        loop {
            let run = runs.len() as u32 + 1;
            let t0 = Instant::now();
            let (mut out, exit) = self.run_once(ctx).await;
            runs.push(ShellRun {
                run,
                exit,
                error: out.error.clone(),
                execution_ms: t0.elapsed().as_millis() as u64,
            });
            if out.status == ExecStatus::Failed && run <= retries {
                ctx.progress.emit(
                    ProgressEvent::status(format!(
                        "shell command failed on run {run} ({}); running it again: re-run {run}/{retries} (executor.shell_retries)",
                        runs[runs.len() - 1].exit
                    ))
                    .with("shell_run", run)
                    .with("shell_retries", retries),
                );
                continue;
            }
            out.execution_ms = started.elapsed().as_millis() as u64;
            if runs.len() > 1 {
                out.error = out.error.map(|last| every_run(&runs, retries, &last));
            }
            out.shell_runs = runs;
            return out;
        }
    }

    /// One run: the outcome and how the process ended, in words.
    async fn run_once(&self, ctx: &ExecContext) -> (ExecOutcome, String) {
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
                let failed = ExecOutcome::failed(format!(
                    "could not start `sh` in {}: {e}",
                    ctx.workspace.display()
                ));
                return (failed, "not started".into());
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
                        crate::util::tail_bytes(out.stderr.trim_end(), ERROR_TAIL_BYTES)
                    ),
                }),
            ),
        };
        let exit = out.exit.describe();
        (ExecOutcome::new(status, out.into_combined(), error), exit)
    }
}

/// The reason of a command run more than once: every run's error, the first run first (the
/// reason is cut at 2,000 characters when sent, so the first failure is the one kept).
fn every_run(runs: &[ShellRun], retries: u32, last: &str) -> String {
    let mut s = format!(
        "shell command ran {} times (executor.shell_retries = {retries}) and no run succeeded:",
        runs.len()
    );
    for r in runs {
        let why = r.error.as_deref().unwrap_or(last);
        s.push_str(&format!("\nrun {}: {why}", r.run));
    }
    s
}
