//! The corrective-retry loop: execute, observe, verify, and on failure re-prompt the same
//! LLM executor with what failed, within bounds.
//!
//! Owns the attempt sequence and every reason to stop: verified, retries exhausted (the
//! task's `max_verification_retries`, capped at 5 and at `verification.retry_ceiling`), no
//! progress (workspace unchanged and the same failure signature as before), budget (per-task
//! and per-day cost caps, checked BEFORE each execution and before the judge, from the
//! persisted [`SpendLedger`]), `check_error` (a check that could not run: no edit can fix it,
//! so no retry), `flaky`, a failed execution, cancellation. Shell executors get one execution
//! and one verification, never a retry.
//!
//! Flaky guard (the choice, documented in the README): a failed command check is re-run once
//! within what is left of the report's deadline. A pass on re-run does NOT verify the task —
//! its first run may have created what the second looks for — the loop stops with
//! `partial_pass`, reason `flaky`, and lists the checks in `result.flaky_checks`.
//!
//! Every execution's cost is counted whatever its status (a run killed at its timeout
//! reports an estimate), and so is a judge's; the attempt number and the spend are persisted
//! so a restart — then `task_continue` — resumes them instead of starting over.
//!
//! [`run`] is what the runner calls; [`run_with`] is the same loop over any [`Attempter`],
//! so tests can drive it with a closure that edits a real workspace.
//!
//! Event `attempt` fields: `verification_retry_start` is sent for each corrective retry and
//! numbers the retry (1..=`max_retries`, as in "VERIFICATION RETRY 1/3"), like the hub's own
//! retry count; `verification_check_result` and `verification_retry_complete` number the
//! execution (1-based, = report `run_number`);
//! `verification_retry_complete.failed` counts every check that did not pass (fail, error,
//! timeout), so `passed + failed == total`.

use std::future::Future;
use std::sync::Arc;

use crate::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};
use crate::progress::{EventKind, ProgressEvent};
use crate::spend::SpendLedger;
use crate::task::CheckType;

use super::checks;
use super::observe;
use super::prompt;
use super::report::{CheckStatus, VerificationReport};
use super::signature::failure_signature;
use super::{Termination, VerificationStatus};

pub use super::report::AttemptRecord;

/// The loop's result: what the runner turns into `task_complete` / `task_failed`.
#[derive(Debug, Clone)]
pub struct LoopOutcome {
    /// `verified`, `partial_pass` or `execution_failed`.
    pub verification_status: VerificationStatus,
    /// One record per verification run, `run_number` 1.. (none when the first execution failed).
    pub attempts: Vec<AttemptRecord>,
    /// The last execution (its output and error are reported).
    pub last_exec: ExecOutcome,
    /// Summed over all executions.
    pub tokens_in: u64,
    /// Summed over all executions.
    pub tokens_out: u64,
    /// Summed over all executions (and judge calls), USD.
    pub cost_usd: f64,
    /// Summed over all executions, USD on the reference Claude model.
    pub equivalent_claude_cost_usd: f64,
    /// Summed over all executions.
    pub execution_ms: u64,
    /// Why the loop stopped.
    pub termination_reason: Termination,
    /// Executions run (≥ `attempts.len()`).
    pub executions: u32,
    /// The failure signatures went A, B, A at some point: the LLM is flip-flopping.
    pub oscillation: bool,
    /// Checks (`type target`) that failed and then passed on re-run, when the loop stopped
    /// for `flaky`.
    pub flaky_checks: Vec<String>,
}

/// Options the runner may give the loop beyond the task and config.
#[derive(Debug, Clone, Default)]
pub struct LoopOptions {
    /// The daemon's spend ledger (today's spend, each task's spend and attempt, on disk).
    /// Without it a fresh in-memory ledger is used: only this task's spend counts.
    pub ledger: Option<Arc<SpendLedger>>,
}

/// Something that runs one attempt: the task's [`Executor`], or a test's closure.
pub trait Attempter {
    /// Run attempt `attempt` to its end. `ctx` carries the attempt's remaining budget.
    fn attempt(&mut self, ctx: &ExecContext, attempt: Attempt)
        -> impl Future<Output = ExecOutcome>;
}

/// The task's [`Executor`].
struct ExecutorAttempter<'a> {
    executor: &'a mut Executor,
}

impl Attempter for ExecutorAttempter<'_> {
    async fn attempt(&mut self, ctx: &ExecContext, attempt: Attempt) -> ExecOutcome {
        self.executor.execute(ctx, &attempt).await
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
    fn attempt(
        &mut self,
        _ctx: &ExecContext,
        attempt: Attempt,
    ) -> impl Future<Output = ExecOutcome> {
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
    let mut a = ExecutorAttempter { executor };
    run_with(&mut a, is_llm, ctx, opts).await
}

/// The loop over any attempter. `is_llm = false` means one execution, one verification.
///
/// The task's entry in the ledger is cleared when the loop ends, except on cancellation:
/// a cancelled task may come back with `task_continue` and then resumes from it.
pub async fn run_with<A: Attempter>(
    attempter: &mut A,
    is_llm: bool,
    ctx: &ExecContext,
    opts: &LoopOptions,
) -> LoopOutcome {
    let ledger = opts
        .ledger
        .clone()
        .unwrap_or_else(|| Arc::new(SpendLedger::in_memory()));
    let out = run_inner(attempter, is_llm, ctx, &ledger).await;
    if out.termination_reason != Termination::Cancelled {
        ledger.finish_task(&ctx.task.task_id).await;
    }
    out
}

/// Why a cost cap stops the loop, if one does.
fn cap_reached(
    task_cap: Option<f64>,
    task_spent: f64,
    day_cap: Option<f64>,
    today: f64,
) -> Option<String> {
    if let Some(cap) = task_cap.filter(|cap| task_spent >= *cap) {
        return Some(format!(
            "the per-task cost cap of ${cap:.4} is reached (spent ${task_spent:.4}); raise the task's metadata.max_cost_usd or verification.max_cost_usd_per_task"
        ));
    }
    if let Some(cap) = day_cap.filter(|cap| today >= *cap) {
        return Some(format!(
            "the daily cost cap of ${cap:.4} is reached (spent ${today:.4} today, UTC); raise verification.max_cost_usd_per_day or wait for the next UTC day"
        ));
    }
    None
}

/// What may still be spent: the smaller of what both caps leave (`None`: no cap).
fn remaining(
    task_cap: Option<f64>,
    task_spent: f64,
    day_cap: Option<f64>,
    today: f64,
) -> Option<f64> {
    let t = task_cap.map(|c| (c - task_spent).max(0.0));
    let d = day_cap.map(|c| (c - today).max(0.0));
    match (t, d) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn run_inner<A: Attempter>(
    attempter: &mut A,
    is_llm: bool,
    ctx: &ExecContext,
    ledger: &SpendLedger,
) -> LoopOutcome {
    let task = &ctx.task;
    let vcfg = &ctx.config.verification;
    let max_retries = if is_llm {
        task.retry_budget().min(vcfg.retry_ceiling)
    } else {
        0
    };
    let nothing_to_verify = task.skip_verification || task.verification_steps.is_empty();
    let task_cap = task.metadata.max_cost_usd.or(vcfg.max_cost_usd_per_task);
    let day_cap = vcfg.max_cost_usd_per_day;

    let mut out = LoopOutcome {
        verification_status: VerificationStatus::ExecutionFailed,
        attempts: Vec::new(),
        last_exec: ExecOutcome::failed("not run"),
        tokens_in: 0,
        tokens_out: 0,
        cost_usd: 0.0,
        equivalent_claude_cost_usd: 0.0,
        execution_ms: 0,
        termination_reason: Termination::ExecutionFailed,
        executions: 0,
        oscillation: false,
        flaky_checks: Vec::new(),
    };
    // A task run again after a restart (`task_continue`) keeps its attempt count and spend;
    // an attempt the restart cut short runs again.
    let mut first = 1;
    if let Some(prev) = ledger.task(&task.task_id).await {
        if prev.attempt > 0 {
            first = prev.attempt + 1;
            out.cost_usd = prev.spent_usd;
            ctx.progress.emit(
                ProgressEvent::status(format!(
                    "resuming at attempt {first} after a restart (${:.4} already spent on this task)",
                    prev.spent_usd
                ))
                .with("attempt", first),
            );
        }
    }
    if first > max_retries + 1 {
        out.last_exec = ExecOutcome::failed(format!(
            "all {} attempt(s) of this task were used before the restart",
            max_retries + 1
        ));
        return finish(
            out,
            VerificationStatus::ExecutionFailed,
            Termination::RetriesExhausted,
        );
    }
    let mut signatures: Vec<String> = Vec::new();
    let mut prompt = if is_llm {
        prompt::first_prompt(task)
    } else {
        task.description.clone()
    };

    for k in first..=max_retries + 1 {
        if ctx.cancel.is_cancelled() {
            return finish(
                out,
                VerificationStatus::ExecutionFailed,
                Termination::Cancelled,
            );
        }
        // Both caps are checked before anything is spent on this attempt.
        let today = ledger.spent_today().await;
        if let Some(why) = cap_reached(task_cap, out.cost_usd, day_cap, today) {
            return stop_for_budget(ctx, out, &why);
        }
        let budget = remaining(task_cap, out.cost_usd, day_cap, today);
        if k > 1 {
            ctx.progress.emit(
                ProgressEvent::new(
                    EventKind::VerificationRetryStart,
                    format!("verification retry {}/{max_retries}", k - 1),
                )
                // The retry's own number, as the hub counts retries against `max_retries`.
                .with("attempt", k - 1)
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
        let actx = ExecContext {
            remaining_budget_usd: budget,
            ..ctx.clone()
        };
        let exec = attempter
            .attempt(
                &actx,
                Attempt {
                    number: k,
                    prompt: prompt.clone(),
                },
            )
            .await;
        out.executions += 1;
        out.tokens_in += exec.tokens_in;
        out.tokens_out += exec.tokens_out;
        out.equivalent_claude_cost_usd += exec.equivalent_claude_cost_usd;
        out.execution_ms += exec.execution_ms;
        // Counted whatever the status: a killed or failed run spent money too.
        out.cost_usd += exec.cost_usd;
        let mut today = ledger.add(&task.task_id, exec.cost_usd).await;
        let exec_status = exec.status;
        out.last_exec = exec;
        match exec_status {
            ExecStatus::Succeeded => {}
            ExecStatus::Cancelled => {
                return finish(
                    out,
                    VerificationStatus::ExecutionFailed,
                    Termination::Cancelled,
                )
            }
            ExecStatus::Failed | ExecStatus::TimedOut => {
                return finish(
                    out,
                    VerificationStatus::ExecutionFailed,
                    Termination::ExecutionFailed,
                )
            }
        }

        let observations = match &before {
            Some(before) => observe::observe(before, &ctx.workspace, &ctx.env, &ctx.cancel).await,
            None => Vec::new(),
        };
        // The judge (if any) may spend only what the execution left.
        let vctx = ExecContext {
            remaining_budget_usd: remaining(task_cap, out.cost_usd, day_cap, today),
            ..ctx.clone()
        };
        let mut report = checks::run_checks(&vctx, k, &observations).await;
        if !report.status.is_success() && vcfg.flaky_rerun && !ctx.cancel.is_cancelled() {
            report = flaky_guard(&vctx, report, &observations).await;
        }
        let check_cost: f64 = report.checks.iter().map(|c| c.cost_usd).sum();
        if check_cost > 0.0 {
            out.cost_usd += check_cost;
            today = ledger.add(&task.task_id, check_cost).await;
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
            // The running cost of the task (executions and judge calls so far).
            .with("cost_usd_so_far", out.cost_usd)
            .with("passed", report.summary.passed)
            .with("failed", report.summary.total - report.summary.passed)
            .with(
                "status",
                serde_json::to_value(report.status).unwrap_or_default(),
            ),
        );
        let success = report.status.is_success();
        let flaky: Vec<String> = report
            .checks
            .iter()
            .filter(|c| c.flaky)
            .map(|c| format!("{} {}", c.check_type, c.target))
            .collect();
        let errored_on_budget = report.checks.iter().any(|c| {
            c.status == CheckStatus::Error && c.output.starts_with(super::judge::BUDGET_EXHAUSTED)
        });
        let check_errors = report.summary.errors > 0;
        let sig = failure_signature(&report);
        // "Could not observe" is not "unchanged": the no-progress rule needs to know.
        let unchanged = observe::is_unchanged(&observations);
        out.attempts.push(AttemptRecord {
            report,
            observations,
        });
        // This attempt reached its verdict: a restart from here resumes after it.
        ledger.complete_attempt(&task.task_id, k).await;
        if success && !flaky.is_empty() {
            // A check that fails and then passes may pass only because its first run
            // created what the second looks for: that is not verified work.
            ctx.progress.emit(ProgressEvent::status(format!(
                "not verified: flaky check(s) passed only on re-run: {}",
                flaky.join(", ")
            )));
            out.flaky_checks = flaky;
            return finish(out, VerificationStatus::PartialPass, Termination::Flaky);
        }
        if success {
            return finish(out, VerificationStatus::Verified, Termination::Verified);
        }
        if ctx.cancel.is_cancelled() {
            return finish(
                out,
                VerificationStatus::ExecutionFailed,
                Termination::Cancelled,
            );
        }
        if errored_on_budget {
            let why = cap_reached(task_cap, out.cost_usd, day_cap, today)
                .unwrap_or_else(|| "a cost cap is reached".into());
            return stop_for_budget(ctx, out, &why);
        }
        if check_errors {
            // No edit can fix a check that cannot run (bad step, no runner, unstartable
            // command, path outside the workspace): retrying would only spend money.
            ctx.progress.emit(
                ProgressEvent::status(
                    "stopping: a check could not run (status error); no edit can fix that, so no retry",
                )
                .with("attempt", k),
            );
            return finish(
                out,
                VerificationStatus::PartialPass,
                Termination::CheckError,
            );
        }
        if unchanged && signatures.last() == Some(&sig) {
            ctx.progress.emit(ProgressEvent::status(
                "stopping: the attempt changed nothing and failed the same way as before",
            ));
            return finish(
                out,
                VerificationStatus::PartialPass,
                Termination::NoProgress,
            );
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
    finish(
        out,
        VerificationStatus::PartialPass,
        Termination::RetriesExhausted,
    )
}

/// Stop with `budget_exhausted`: `partial_pass` when some attempt was verified this run,
/// else `execution_failed` carrying why (nothing was executed).
fn stop_for_budget(ctx: &ExecContext, mut out: LoopOutcome, why: &str) -> LoopOutcome {
    ctx.progress.emit(ProgressEvent::status(format!(
        "stopping before spending: {why}"
    )));
    if out.attempts.is_empty() {
        out.last_exec = ExecOutcome::failed(format!("not run: {why}"));
        return finish(
            out,
            VerificationStatus::ExecutionFailed,
            Termination::BudgetExhausted,
        );
    }
    finish(
        out,
        VerificationStatus::PartialPass,
        Termination::BudgetExhausted,
    )
}

fn finish(mut out: LoopOutcome, status: VerificationStatus, reason: Termination) -> LoopOutcome {
    out.verification_status = status;
    out.termination_reason = reason;
    out
}

/// Re-run each failed `test_passes` / `command_succeeds` once, within what is left of the
/// report's deadline; a pass on re-run is marked `flaky` (which the loop never counts as
/// verified: see [`run_with`]).
async fn flaky_guard(
    ctx: &ExecContext,
    mut report: VerificationReport,
    observations: &[String],
) -> VerificationReport {
    let timeout_ms = report.timeout_ms;
    let guard_start = tokio::time::Instant::now();
    let left_at_start = timeout_ms.saturating_sub(report.duration_ms);
    let mut changed = false;
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
            check.status = CheckStatus::Pass;
            check.flaky = true;
            check.output = format!(
                "{}\n[failed first, passed on re-run: flaky, so the task is not counted as verified]",
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
                cost_usd: 0.0,
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
        // One 5,000-char line: cut to a bounded line, and the cut is said.
        assert!(p.contains(&"x".repeat(300)) && !p.contains(&"x".repeat(301)));
        assert!(p.contains("[output cut to fit"));
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
}
