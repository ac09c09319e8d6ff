//! The corrective-retry loop: execute, observe, verify, and on failure re-prompt the same
//! LLM executor with what failed, within bounds.
//!
//! Owns the attempt sequence and every reason to stop: verified, retries exhausted (the
//! task's `max_verification_retries`, capped at 5), no progress (workspace unchanged and the
//! same failure signature as before), budget (per-task and per-day cost caps), a failed
//! execution, cancellation. Shell executors get one execution and one verification, never a
//! retry. A failed command check is re-run once before blaming the LLM (flaky guard).
//!
//! [`run`] is what the runner calls; [`run_with`] is the same loop over any [`Attempter`],
//! so tests can drive it with a closure that edits a real workspace.
//!
//! Event `attempt` fields are the 1-based attempt (= report `run_number`);
//! `verification_retry_start` is sent for attempts 2.. (the retries);
//! `verification_retry_complete.failed` counts every check that did not pass (fail, error,
//! timeout), so `passed + failed == total`.

use std::future::Future;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};
use crate::progress::{EventKind, ProgressEvent};

use super::checks;
use super::observe;
use super::prompt;
use super::report::{CheckStatus, VerificationReport};
use super::signature::failure_signature;
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
    /// One record per verification run, `run_number` 1.. (none when the first execution failed).
    pub attempts: Vec<AttemptRecord>,
    /// The last execution (its output and error are reported).
    pub last_exec: ExecOutcome,
    /// Summed over all executions.
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub equivalent_claude_cost_usd: f64,
    pub execution_ms: u64,
    /// `verified`, `retries_exhausted`, `no_progress`, `budget_exhausted`,
    /// `execution_failed` or `cancelled`.
    pub termination_reason: String,
    /// Executions run (≥ `attempts.len()`).
    pub executions: u32,
    /// The failure signatures went A, B, A at some point: the LLM is flip-flopping.
    pub oscillation: bool,
}

/// Today's spend across all tasks of this daemon, for `max_cost_usd_per_day`.
///
/// Share one `Arc<DailySpend>` between tasks (pass it in [`LoopOptions::daily_spend`]).
/// The day is the UTC day; the total resets when it changes. The lock is a std mutex held
/// only for an addition, never across an `.await`.
#[derive(Debug, Default)]
pub struct DailySpend {
    inner: Mutex<(i64, f64)>,
}

impl DailySpend {
    pub fn new() -> DailySpend {
        DailySpend::default()
    }

    fn today() -> i64 {
        crate::util::now_ms().div_euclid(86_400_000)
    }

    /// Add `usd` to today's spend; returns the new total for today.
    pub fn add(&self, usd: f64) -> f64 {
        let mut g = self.inner.lock().expect("daily spend lock poisoned");
        let day = Self::today();
        if g.0 != day {
            *g = (day, 0.0);
        }
        g.1 += usd.max(0.0);
        g.1
    }

    /// Today's spend so far.
    pub fn spent_today(&self) -> f64 {
        self.add(0.0)
    }
}

/// Options the runner may give the loop beyond the task and config.
#[derive(Debug, Clone, Default)]
pub struct LoopOptions {
    /// The daemon-wide daily spend; without it only today's spend of this task counts.
    pub daily_spend: Option<Arc<DailySpend>>,
}

/// Something that runs one attempt: the task's [`Executor`], or a test's closure.
pub trait Attempter {
    /// Run attempt `attempt` to its end.
    fn attempt(&mut self, attempt: Attempt) -> impl Future<Output = ExecOutcome>;
}

/// An [`Executor`] bound to its context.
struct ExecutorAttempter<'a> {
    executor: &'a mut Executor,
    ctx: &'a ExecContext,
}

impl Attempter for ExecutorAttempter<'_> {
    async fn attempt(&mut self, attempt: Attempt) -> ExecOutcome {
        self.executor.execute(self.ctx, &attempt).await
    }
}

/// Any `FnMut(Attempt) -> impl Future<Output = ExecOutcome>` as an [`Attempter`] (tests,
/// offline tools). The future must own what it uses.
pub struct FnAttempter<F>(pub F);

impl<F, Fut> Attempter for FnAttempter<F>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = ExecOutcome>,
{
    fn attempt(&mut self, attempt: Attempt) -> impl Future<Output = ExecOutcome> {
        (self.0)(attempt)
    }
}

/// Run the task to a verdict with default options (no shared daily spend).
pub async fn run(executor: &mut Executor, ctx: &ExecContext) -> LoopOutcome {
    run_with_options(executor, ctx, &LoopOptions::default()).await
}

/// Run the task to a verdict; `opts` carries the daemon's shared daily spend.
pub async fn run_with_options(
    executor: &mut Executor,
    ctx: &ExecContext,
    opts: &LoopOptions,
) -> LoopOutcome {
    let is_llm = executor.is_llm();
    let mut a = ExecutorAttempter { executor, ctx };
    run_with(&mut a, is_llm, ctx, opts).await
}

/// The loop over any attempter. `is_llm = false` means one execution, one verification.
pub async fn run_with<A: Attempter>(
    attempter: &mut A,
    is_llm: bool,
    ctx: &ExecContext,
    opts: &LoopOptions,
) -> LoopOutcome {
    let task = &ctx.task;
    let vcfg = &ctx.config.verification;
    let max_retries = if is_llm { task.retry_budget() } else { 0 };
    let nothing_to_verify = task.skip_verification || task.verification_steps.is_empty();
    let task_cap = task.metadata.max_cost_usd.or(vcfg.max_cost_usd_per_task);
    let local_daily = Arc::new(DailySpend::new());
    let daily = opts.daily_spend.clone().unwrap_or(local_daily);

    let mut out = LoopOutcome {
        verification_status: VerificationStatus::ExecutionFailed,
        attempts: Vec::new(),
        last_exec: ExecOutcome::failed("not run"),
        tokens_in: 0,
        tokens_out: 0,
        cost_usd: 0.0,
        equivalent_claude_cost_usd: 0.0,
        execution_ms: 0,
        termination_reason: String::new(),
        executions: 0,
        oscillation: false,
    };
    let mut signatures: Vec<String> = Vec::new();
    let mut prompt = if is_llm {
        prompt::first_prompt(task)
    } else {
        task.description.clone()
    };

    for k in 1..=max_retries + 1 {
        if ctx.cancel.is_cancelled() {
            return finish(out, VerificationStatus::ExecutionFailed, "cancelled");
        }
        if k > 1 {
            ctx.progress.emit(
                ProgressEvent::new(
                    EventKind::VerificationRetryStart,
                    format!("verification retry {}/{max_retries}", k - 1),
                )
                .with("attempt", k)
                .with("max_retries", max_retries),
            );
        }
        // Observations feed the checks' judge, the corrective prompt and the no-progress rule;
        // with nothing to verify none of those can run, so skip the snapshot's git calls.
        let before = if nothing_to_verify {
            None
        } else {
            Some(observe::snapshot(&ctx.workspace, &ctx.env, &ctx.cancel).await)
        };
        let exec = attempter
            .attempt(Attempt {
                number: k,
                prompt: prompt.clone(),
            })
            .await;
        out.executions += 1;
        out.tokens_in += exec.tokens_in;
        out.tokens_out += exec.tokens_out;
        out.cost_usd += exec.cost_usd;
        out.equivalent_claude_cost_usd += exec.equivalent_claude_cost_usd;
        out.execution_ms += exec.execution_ms;
        let today = daily.add(exec.cost_usd);
        let exec_status = exec.status;
        out.last_exec = exec;
        match exec_status {
            ExecStatus::Succeeded => {}
            ExecStatus::Cancelled => {
                return finish(out, VerificationStatus::ExecutionFailed, "cancelled")
            }
            ExecStatus::Failed | ExecStatus::TimedOut => {
                return finish(out, VerificationStatus::ExecutionFailed, "execution_failed")
            }
        }

        let observations = match &before {
            Some(before) => observe::observe(before, &ctx.workspace, &ctx.env, &ctx.cancel).await,
            None => Vec::new(),
        };
        let mut report = checks::run_checks(ctx, k, &observations).await;
        if !report.status.is_success() && vcfg.flaky_rerun && !ctx.cancel.is_cancelled() {
            report = flaky_guard(ctx, report, &observations).await;
        }
        ctx.progress.emit(
            ProgressEvent::new(
                EventKind::VerificationRetryComplete,
                format!(
                    "verification run {k}: {}",
                    serde_json::to_value(report.status).unwrap_or_default()
                ),
            )
            .with("attempt", k)
            .with("passed", report.summary.passed)
            .with("failed", report.summary.total - report.summary.passed)
            .with(
                "status",
                serde_json::to_value(report.status).unwrap_or_default(),
            ),
        );
        let success = report.status.is_success();
        let sig = failure_signature(&report);
        let unchanged = observe::is_unchanged(&observations);
        out.attempts.push(AttemptRecord {
            report,
            observations,
        });
        if success {
            return finish(out, VerificationStatus::Verified, "verified");
        }
        if ctx.cancel.is_cancelled() {
            return finish(out, VerificationStatus::ExecutionFailed, "cancelled");
        }
        if unchanged && signatures.last() == Some(&sig) {
            ctx.progress.emit(ProgressEvent::status(
                "stopping: the attempt changed nothing and failed the same way as before",
            ));
            return finish(out, VerificationStatus::PartialPass, "no_progress");
        }
        let n = signatures.len();
        if n >= 2 && signatures[n - 2] == sig && signatures[n - 1] != sig {
            out.oscillation = true;
            ctx.progress.emit(
                ProgressEvent::status(format!(
                    "oscillation: attempt {k} fails like attempt {} (the fix is flip-flopping)",
                    k - 2
                ))
                .with("attempt", k),
            );
        }
        signatures.push(sig);
        let over_task = task_cap.is_some_and(|cap| out.cost_usd >= cap);
        let over_day = vcfg.max_cost_usd_per_day.is_some_and(|cap| today >= cap);
        if over_task || over_day {
            ctx.progress.emit(ProgressEvent::status(format!(
                "stopping: {} cost cap reached (task ${:.4}, today ${today:.4})",
                if over_task { "per-task" } else { "per-day" },
                out.cost_usd
            )));
            return finish(out, VerificationStatus::PartialPass, "budget_exhausted");
        }
        if k > max_retries {
            break;
        }
        prompt = prompt::corrective_prompt(
            task,
            k + 1,
            max_retries,
            &out.attempts,
            &out.last_exec.output,
        );
    }
    finish(out, VerificationStatus::PartialPass, "retries_exhausted")
}

fn finish(mut out: LoopOutcome, status: VerificationStatus, reason: &str) -> LoopOutcome {
    out.verification_status = status;
    out.termination_reason = reason.to_string();
    out
}

/// Re-run each failed `test_passes` / `command_succeeds` once; a pass on re-run counts as a
/// pass marked `flaky` (the failure was not the LLM's doing).
async fn flaky_guard(
    ctx: &ExecContext,
    mut report: VerificationReport,
    observations: &[String],
) -> VerificationReport {
    let timeout_ms = report.timeout_ms;
    let mut changed = false;
    for (i, check) in report.checks.iter_mut().enumerate() {
        let rerunnable = matches!(
            check.check_type.as_str(),
            "test_passes" | "command_succeeds"
        );
        if check.status != CheckStatus::Fail || !rerunnable {
            continue;
        }
        let Some(step) = ctx.task.verification_steps.get(i) else {
            continue;
        };
        let bound_ms = step
            .timeout_ms
            .filter(|t| *t > 0)
            .unwrap_or(timeout_ms)
            .min(timeout_ms);
        let again = checks::run_step(
            ctx,
            step,
            std::time::Duration::from_millis(bound_ms),
            observations,
        )
        .await;
        if again.status == CheckStatus::Pass {
            check.status = CheckStatus::Pass;
            check.flaky = true;
            check.output = format!(
                "{}\n[failed first, passed on re-run: counted as a flaky pass]",
                again.output
            );
            changed = true;
            ctx.progress.emit(ProgressEvent::status(format!(
                "flaky check: {} {} failed, then passed on re-run",
                check.check_type, check.target
            )));
            checks::emit_result(ctx, check, report.run_number);
        }
    }
    if !changed {
        return report;
    }
    VerificationReport::from_checks(
        &report.task_id,
        report.run_number,
        report.started_at,
        (crate::util::now_ms() - report.started_at).max(0) as u64,
        report.timeout_ms,
        report.checks,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::report::CheckResult;

    fn rec(run: u32, checks: Vec<(&str, &str, CheckStatus, &str)>, obs: &[&str]) -> AttemptRecord {
        let checks = checks
            .into_iter()
            .map(|(t, g, s, o)| CheckResult {
                check_type: t.into(),
                target: g.into(),
                description: None,
                status: s,
                output: o.into(),
                duration_ms: 1,
                flaky: false,
            })
            .collect();
        AttemptRecord {
            report: VerificationReport::from_checks("t", run, 0, 1, 1000, checks, false),
            observations: obs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn task() -> crate::task::Task {
        crate::task::Task::from_value(serde_json::json!({
            "task_id": "t", "description": "Write hello.txt saying hi",
            "success_criteria": ["hello.txt contains hi"],
            "verification_steps": [
                {"type": "file_exists", "target": "hello.txt", "description": "the file"},
                {"type": "command_succeeds", "target": "grep -q hi hello.txt"}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn first_prompt_lists_criteria_and_asks_for_a_plan() {
        let p = prompt::first_prompt(&task());
        assert!(p.starts_with("Write hello.txt saying hi"));
        assert!(p.contains("- hello.txt contains hi"));
        assert!(p.contains("- file_exists: hello.txt (the file)"));
        assert!(p.contains("- command_succeeds: grep -q hi hello.txt"));
        assert!(p.contains("Plan your approach"));
        assert!(p.contains("check each criterion"));
    }

    #[test]
    fn corrective_prompt_has_every_section_and_truncates() {
        let long = "x".repeat(5000);
        let h = vec![
            rec(
                1,
                vec![("file_exists", "hello.txt", CheckStatus::Fail, "old failure")],
                &["workspace unchanged"],
            ),
            rec(
                2,
                vec![
                    ("file_exists", "hello.txt", CheckStatus::Pass, "exists"),
                    (
                        "command_succeeds",
                        "grep -q hi hello.txt",
                        CheckStatus::Fail,
                        &long,
                    ),
                ],
                &["added: hello.txt (+1 lines)"],
            ),
        ];
        let p = prompt::corrective_prompt(&task(), 3, 4, &h, &"y".repeat(3000));
        assert!(p.starts_with("VERIFICATION RETRY 2/4"), "{p}");
        let failed = p.find("FAILED CHECKS:").unwrap();
        let passed = p.find("PASSED CHECKS (keep these passing):").unwrap();
        assert!(failed < passed);
        assert!(p.contains("type: command_succeeds | target: grep -q hi hello.txt | status: fail"));
        assert!(p.contains(&"x".repeat(500)) && !p.contains(&"x".repeat(501)));
        assert!(p.contains("- file_exists: hello.txt\n"));
        assert!(p.contains("- added: hello.txt (+1 lines)"));
        assert!(p.contains("- attempt 1: 0 passed, 1 not passing: file_exists hello.txt (fail)"));
        assert!(
            !p.contains("old failure"),
            "only the latest failure in full"
        );
        assert!(p.contains("ORIGINAL TASK:\nWrite hello.txt saying hi"));
        assert!(p.contains("YOUR PREVIOUS OUTPUT:\n"));
        assert!(p.contains(&"y".repeat(1000)) && !p.contains(&"y".repeat(1001)));
    }

    #[test]
    fn daily_spend_accumulates() {
        let d = DailySpend::new();
        assert_eq!(d.add(0.5), 0.5);
        assert_eq!(d.add(0.25), 0.75);
        assert_eq!(d.spent_today(), 0.75);
        assert_eq!(d.add(-3.0), 0.75);
    }
}
