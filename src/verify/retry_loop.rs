//! The corrective-retry loop: plan, execute, verify, decide, correct, report — the phases
//! of the specification (`002_…`), each its own function below, bounded.
//!
//! Owns the attempt sequence and every reason to stop: verified, retries exhausted (the
//! [`RetryBudget`]), no progress (workspace unchanged and the same failure signature as
//! before), budget (per-task and per-day cost caps, checked BEFORE each execution and before
//! the judge, from the persisted [`SpendLedger`]), `check_error` (a check that could not run:
//! no edit can fix it, so no retry), `flaky`, a failed execution, cancellation. Shell
//! executors get one execution and one verification, never a retry.
//!
//! # Phases
//!
//! - **plan** (`LoopRun::start`): the retry budget and where it came from, a resumed
//!   task's carried state, the first prompt (which asks for the plan in the specification's
//!   shape, [`super::plan`]).
//! - **execute** (`LoopRun::execute`): the caps, the retry announcement, one attempt, its
//!   cost counted whatever its status; the plan is looked for in what the attempt said.
//! - **verify** (`LoopRun::verify`): observe what changed, run every check, the flaky
//!   guard, the judge's cost and tokens, `verification_retry_complete`.
//! - **decide** (`LoopRun::decide`): stop (and why) or retry.
//! - **correct** (`LoopRun::correct`): the next prompt — a self-contained corrective prompt
//!   carrying the plan, and the short corrective turn for an executor that kept its chat.
//! - **report** (`LoopRun::finish`): the [`LoopOutcome`] the runner turns into a frame.
//!
//! # The retry budget (one rule, said in the result)
//!
//! The task's `max_verification_retries` (when it carries none: `verification.
//! default_max_retries`), capped at 5 (the hub's rule), then at the operator's
//! `verification.retry_ceiling`. `result.retry_budget` says the effective number, what was
//! asked, and what lowered it; when something did, a `status` event says so before the first
//! attempt and every `verification_retry_start` carries `limited_by`.
//!
//! # Event numbering
//!
//! The three events of one retry carry ONE `attempt`: the retry's number (0 for the first
//! execution, 1 for the first corrective retry … up to `max_retries`), as the
//! specification's example does, and `run_number` = the execution (= the report's
//! `run_number`, `attempt + 1`). `verification_retry_start` ("Verification retry k/N: fixing
//! M failed checks") carries `max_retries` and `failed`; `verification_retry_complete.failed`
//! counts every check that did not pass, so `passed + failed == total`.
//!
//! # Flaky guard (the choice, documented in the README)
//!
//! A failed command check is re-run once within what is left of the report's deadline. A
//! pass on re-run does NOT verify the task — its first run may have created what the second
//! looks for. The check stays `fail` in the report, marked `flaky` (so the report and the
//! result never disagree); when every failing check is flaky the loop stops with
//! `partial_pass`, reason `flaky`, and lists them in `result.flaky_checks`.
//!
//! # Restart
//!
//! Every execution's cost is counted whatever its status, and so is a judge's. After each
//! verdict the attempt number and a [`Carry`] (reports, tokens, plan, last output) are
//! persisted in the ledger, so a restart — then `task_continue` — resumes with the
//! corrective prompt of the next retry and the earlier attempts in the result.
//!
//! [`run`] is what the runner calls; [`run_with`] is the same loop over any [`Attempter`],
//! so tests can drive it with a closure that edits a real workspace.

use std::future::Future;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::VerificationConfig;
use crate::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};
use crate::progress::{EventKind, ProgressEvent};
use crate::spend::SpendLedger;
use crate::task::{CheckType, Task, MAX_VERIFICATION_RETRIES};

use super::checks;
use super::observe::{self, Snapshot};
use super::plan::Plan;
use super::prompt;
use super::report::{CheckStatus, VerificationReport};
use super::signature::{failure_signature, interrupted};
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
    /// Summed over all executions and judge calls.
    pub tokens_in: u64,
    /// Summed over all executions and judge calls.
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
    /// The effective retry budget and where it came from (`result.retry_budget`).
    pub budget: RetryBudget,
    /// The plan the agent made (first found on attempt `made_on_attempt`), if it made one.
    pub plan: Option<Plan>,
    /// The attempt a restarted task resumed at (`task_continue`), if it was resumed.
    pub resumed_at: Option<u32>,
}

/// The effective number of corrective retries and where it came from (`result.retry_budget`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetryBudget {
    /// Corrective retries this task gets (executions = `max_retries + 1`).
    pub max_retries: u32,
    /// What was asked for, before any cap.
    pub requested: u32,
    /// Where `requested` came from: `task` (its `max_verification_retries`) or
    /// `config_default` (`verification.default_max_retries`; the task carried none).
    pub requested_from: &'static str,
    /// The operator's ceiling in force (`verification.retry_ceiling`).
    pub operator_ceiling: u32,
    /// What lowered the number, if anything: `hub_cap` (5), `retry_ceiling`, or
    /// `shell_executor` (never retried).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limited_by: Option<&'static str>,
    /// The rule applied, in one sentence.
    pub note: String,
}

impl RetryBudget {
    /// The one rule (module docs).
    pub fn decide(task: &Task, vcfg: &VerificationConfig, is_llm: bool) -> RetryBudget {
        let (requested, requested_from) = match task.max_verification_retries {
            Some(n) => (n, "task"),
            None => (vcfg.default_max_retries, "config_default"),
        };
        let mut b = RetryBudget {
            max_retries: requested,
            requested,
            requested_from,
            operator_ceiling: vcfg.retry_ceiling,
            limited_by: None,
            note: String::new(),
        };
        let asked = match requested_from {
            "task" => format!("the task asked for {requested}"),
            _ => format!("the task asked for none, so verification.default_max_retries = {requested} applies"),
        };
        if !is_llm {
            b.max_retries = 0;
            b.limited_by = (requested > 0).then_some("shell_executor");
            b.note = format!(
                "{asked}; a shell executor is never retried (it would run the same command again)"
            );
        } else if requested > MAX_VERIFICATION_RETRIES.min(vcfg.retry_ceiling) {
            if vcfg.retry_ceiling < MAX_VERIFICATION_RETRIES {
                b.max_retries = vcfg.retry_ceiling;
                b.limited_by = Some("retry_ceiling");
                b.note = format!("{asked}; this sidecar's operator ceiling verification.retry_ceiling = {} lowers it", vcfg.retry_ceiling);
            } else {
                b.max_retries = MAX_VERIFICATION_RETRIES;
                b.limited_by = Some("hub_cap");
                b.note = format!(
                    "{asked}; capped at {MAX_VERIFICATION_RETRIES}, the most any task gets"
                );
            }
        } else {
            b.note = asked;
        }
        b
    }
}

/// What the loop persists with each verdict so a restarted task goes on where it was
/// (kept in the [`SpendLedger`] with the attempt number, written in one update).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Carry {
    /// Every verification run so far (check outputs cut to [`CARRIED_OUTPUT_BYTES`]).
    pub attempts: Vec<AttemptRecord>,
    /// Tokens so far (executions and judge).
    pub tokens_in: u64,
    /// Tokens so far.
    pub tokens_out: u64,
    /// Reference-model cost so far.
    pub equivalent_claude_cost_usd: f64,
    /// Execution wall time so far.
    pub execution_ms: u64,
    /// Executions so far.
    pub executions: u32,
    /// The plan, once made.
    pub plan: Option<Plan>,
    /// The last execution's output (what the corrective prompt quotes).
    pub last_output: String,
    /// The failure signatures so far.
    pub signatures: Vec<String>,
    /// Whether oscillation was seen.
    pub oscillation: bool,
}

/// Bytes of each check's output kept in a [`Carry`] (head and tail): enough for the
/// corrective prompt's excerpt, small enough to rewrite with every verdict.
pub const CARRIED_OUTPUT_BYTES: usize = 8 * 1024;

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
    let out = run_phases(attempter, is_llm, ctx, &ledger).await;
    if out.termination_reason != Termination::Cancelled {
        ledger.finish_task(&ctx.task.task_id).await;
    }
    out
}

/// The specification's loop, phase by phase (module docs).
async fn run_phases<A: Attempter>(
    attempter: &mut A,
    is_llm: bool,
    ctx: &ExecContext,
    ledger: &SpendLedger,
) -> LoopOutcome {
    let mut run = match LoopRun::start(ctx, ledger, is_llm).await {
        Ok(run) => run,
        Err(done) => return done,
    };
    let mut k = run.first;
    loop {
        if let Err(stop) = run.execute(attempter, k).await {
            return run.finish(stop);
        }
        let record = run.verify(k).await;
        match run.decide(k, record).await {
            Decision::Stop(stop) => return run.finish(stop),
            Decision::Retry => run.correct(k),
        }
        k += 1;
    }
}

/// What one verification run says, as the decide phase's rules read it.
struct Facts {
    /// Every check passed (or there was nothing to check).
    success: bool,
    /// The failing checks that passed when run again (`type target`).
    flaky: Vec<String>,
    /// Every failing check is flaky.
    only_flaky: bool,
    /// A check was not run because a cost cap is reached.
    errored_on_budget: bool,
    /// A check could not run at all.
    check_errors: bool,
    /// The failure signature.
    sig: String,
    /// A check was killed by a signal we did not send (a shutdown racing our own cancel):
    /// the run says nothing about the work, so it must not read as no progress or oscillation.
    outside_kill: bool,
    /// The attempt changed nothing ("could not observe" is not "unchanged").
    unchanged: bool,
}

impl Facts {
    fn of(record: &AttemptRecord) -> Facts {
        let report = &record.report;
        let not_passing: Vec<_> = report
            .checks
            .iter()
            .filter(|c| c.status != CheckStatus::Pass)
            .collect();
        let flaky: Vec<String> = not_passing
            .iter()
            .filter(|c| c.flaky)
            .map(|c| format!("{} {}", c.check_type, c.target))
            .collect();
        Facts {
            success: report.status.is_success(),
            only_flaky: !not_passing.is_empty() && flaky.len() == not_passing.len(),
            flaky,
            errored_on_budget: report.checks.iter().any(|c| {
                c.status == CheckStatus::Error
                    && c.output.starts_with(super::judge::BUDGET_EXHAUSTED)
            }),
            check_errors: report.summary.errors > 0,
            sig: failure_signature(report),
            outside_kill: interrupted(report),
            unchanged: observe::is_unchanged(&record.observations),
        }
    }
}

/// How the loop ends: the status and the reason.
#[derive(Debug, Clone, Copy)]
struct Stop(VerificationStatus, Termination);

/// What the decide phase concluded.
enum Decision {
    Stop(Stop),
    Retry,
}

/// The cost caps of one task.
struct Caps {
    task: Option<f64>,
    day: Option<f64>,
}

impl Caps {
    /// Why a cost cap stops the loop, if one does.
    fn reached(&self, task_spent: f64, today: f64) -> Option<String> {
        if let Some(cap) = self.task.filter(|cap| task_spent >= *cap) {
            return Some(format!(
                "the per-task cost cap of ${cap:.4} is reached (spent ${task_spent:.4}); raise the task's metadata.max_cost_usd or verification.max_cost_usd_per_task"
            ));
        }
        if let Some(cap) = self.day.filter(|cap| today >= *cap) {
            return Some(format!(
                "the daily cost cap of ${cap:.4} is reached (spent ${today:.4} today, UTC); raise verification.max_cost_usd_per_day or wait for the next UTC day"
            ));
        }
        None
    }

    /// What may still be spent: the smaller of what both caps leave (`None`: no cap).
    fn remaining(&self, task_spent: f64, today: f64) -> Option<f64> {
        let t = self.task.map(|c| (c - task_spent).max(0.0));
        let d = self.day.map(|c| (c - today).max(0.0));
        match (t, d) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One run of the loop: the task's context and everything the phases hand each other.
struct LoopRun<'a> {
    ctx: &'a ExecContext,
    ledger: &'a SpendLedger,
    caps: Caps,
    /// With nothing to verify there is nothing to observe either.
    nothing_to_verify: bool,
    /// The first execution of this run (> 1 after a restart).
    first: u32,
    out: LoopOutcome,
    signatures: Vec<String>,
    /// The next attempt's input.
    prompt: String,
    followup: Option<String>,
    /// The workspace before the current attempt (none with nothing to verify).
    before: Option<Snapshot>,
    /// Today's spend after the last charge.
    today: f64,
}

impl<'a> LoopRun<'a> {
    // ---- plan -------------------------------------------------------------------------

    /// The budget, a resumed task's state, the first prompt. `Err` is an outcome reached
    /// before any execution (all attempts were used before a restart).
    async fn start(
        ctx: &'a ExecContext,
        ledger: &'a SpendLedger,
        is_llm: bool,
    ) -> Result<LoopRun<'a>, LoopOutcome> {
        let task = &ctx.task;
        let vcfg = &ctx.config.verification;
        let budget = RetryBudget::decide(task, vcfg, is_llm);
        if budget.limited_by.is_some() && budget.max_retries < budget.requested {
            ctx.progress.emit(
                ProgressEvent::status(format!(
                    "retry budget: {} corrective retr{} ({})",
                    budget.max_retries,
                    if budget.max_retries == 1 { "y" } else { "ies" },
                    budget.note
                ))
                .with("max_retries", budget.max_retries)
                .with("requested", budget.requested)
                .with("limited_by", budget.limited_by.unwrap_or_default()),
            );
        }
        let mut run = LoopRun {
            ctx,
            ledger,
            caps: Caps {
                task: task.metadata.max_cost_usd.or(vcfg.max_cost_usd_per_task),
                day: vcfg.max_cost_usd_per_day,
            },
            nothing_to_verify: task.skip_verification || task.verification_steps.is_empty(),
            first: 1,
            out: LoopOutcome {
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
                budget,
                plan: None,
                resumed_at: None,
            },
            signatures: Vec::new(),
            prompt: if is_llm {
                prompt::first_prompt(task)
            } else {
                task.description.clone()
            },
            followup: None,
            before: None,
            today: 0.0,
        };
        run.resume().await?;
        Ok(run)
    }

    /// A task run again after a restart (`task_continue`) keeps its attempt count, spend,
    /// reports, tokens and plan, and continues with the corrective prompt of its next retry;
    /// an attempt the restart cut short runs again.
    async fn resume(&mut self) -> Result<(), LoopOutcome> {
        let task = &self.ctx.task;
        let Some(prev) = self.ledger.task(&task.task_id).await else {
            return Ok(());
        };
        if prev.attempt == 0 {
            return Ok(());
        }
        let max = self.out.budget.max_retries;
        self.first = prev.attempt + 1;
        self.out.resumed_at = Some(self.first);
        self.out.cost_usd = prev.spent_usd;
        let carry: Option<Carry> = prev.carry.and_then(|c| serde_json::from_value(c).ok());
        if let Some(c) = carry {
            self.out.attempts = c.attempts;
            self.out.tokens_in = c.tokens_in;
            self.out.tokens_out = c.tokens_out;
            self.out.equivalent_claude_cost_usd = c.equivalent_claude_cost_usd;
            self.out.execution_ms = c.execution_ms;
            self.out.executions = c.executions;
            self.out.plan = c.plan;
            self.out.oscillation = c.oscillation;
            self.out.last_exec = ExecOutcome::new(ExecStatus::Succeeded, c.last_output, None);
            self.signatures = c.signatures;
        }
        self.ctx.progress.emit(
            ProgressEvent::status(format!(
                "resuming at attempt {} after a restart (${:.4} already spent on this task; {} earlier report(s) restored)",
                self.first,
                prev.spent_usd,
                self.out.attempts.len()
            ))
            .with("attempt", self.first - 1)
            .with("run_number", self.first),
        );
        if self.first > max + 1 {
            if self.out.attempts.is_empty() {
                self.out.last_exec = ExecOutcome::failed(format!(
                    "all {} attempt(s) of this task were used before the restart",
                    max + 1
                ));
                let stop = Stop(
                    VerificationStatus::ExecutionFailed,
                    Termination::RetriesExhausted,
                );
                return Err(self.finish_ref(stop));
            }
            let stop = Stop(
                VerificationStatus::PartialPass,
                Termination::RetriesExhausted,
            );
            return Err(self.finish_ref(stop));
        }
        if !self.out.attempts.is_empty() {
            // The executor is new: it gets the self-contained corrective prompt.
            self.prompt = prompt::corrective_prompt(
                task,
                self.first - 1,
                max,
                &self.out.attempts,
                &self.out.last_exec.output,
                self.out.plan.as_ref(),
            );
        }
        Ok(())
    }

    // ---- execute ----------------------------------------------------------------------

    /// Caps and cancellation, the retry announcement, one attempt and its cost. `Err` stops
    /// the loop (nothing to verify: cancelled, over a cap, or the executor failed).
    async fn execute<A: Attempter>(&mut self, attempter: &mut A, k: u32) -> Result<(), Stop> {
        let ctx = self.ctx;
        if ctx.cancel.is_cancelled() {
            return Err(Stop(
                VerificationStatus::ExecutionFailed,
                Termination::Cancelled,
            ));
        }
        // Both caps are checked before anything is spent on this attempt.
        self.today = self.ledger.spent_today().await;
        if let Some(why) = self.caps.reached(self.out.cost_usd, self.today) {
            return Err(self.stop_for_budget(&why));
        }
        let budget = self.caps.remaining(self.out.cost_usd, self.today);
        if k > 1 {
            self.announce_retry(k);
        }
        // Observations feed the checks' judge, the corrective prompt and the no-progress rule;
        // with nothing to verify none of those can run, so skip the snapshot's git calls.
        self.before = if self.nothing_to_verify {
            None
        } else {
            Some(observe::snapshot(&ctx.workspace, &ctx.env, &ctx.cancel).await)
        };
        let actx = ExecContext {
            remaining_budget_usd: budget,
            ..ctx.clone()
        };
        let attempt = Attempt {
            number: k,
            prompt: self.prompt.clone(),
            followup: self.followup.take(),
        };
        let exec = attempter.attempt(&actx, attempt).await;
        self.charge_execution(&exec).await;
        let exec_status = exec.status;
        self.look_for_plan(k, &exec);
        self.out.last_exec = exec;
        match exec_status {
            ExecStatus::Succeeded => Ok(()),
            ExecStatus::Cancelled => Err(Stop(
                VerificationStatus::ExecutionFailed,
                Termination::Cancelled,
            )),
            ExecStatus::Failed | ExecStatus::TimedOut => Err(Stop(
                VerificationStatus::ExecutionFailed,
                Termination::ExecutionFailed,
            )),
        }
    }

    /// `verification_retry_start`: "Verification retry k/N: fixing M failed checks".
    fn announce_retry(&self, k: u32) {
        let b = &self.out.budget;
        let retry = k - 1;
        let failed = self.out.attempts.last().map_or(0, prompt::failing_count);
        let mut ev = ProgressEvent::new(
            EventKind::VerificationRetryStart,
            format!(
                "Verification retry {retry}/{}: fixing {failed} failed check{}",
                b.max_retries,
                if failed == 1 { "" } else { "s" }
            ),
        )
        .with("attempt", retry)
        .with("run_number", k)
        .with("max_retries", b.max_retries)
        .with("failed", failed);
        if let Some(why) = b.limited_by {
            ev = ev.with("limited_by", why).with("requested", b.requested);
        }
        self.ctx.progress.emit(ev);
    }

    /// Count an execution whatever its status: a killed or failed run spent money too.
    async fn charge_execution(&mut self, exec: &ExecOutcome) {
        let out = &mut self.out;
        out.executions += 1;
        out.tokens_in += exec.tokens_in;
        out.tokens_out += exec.tokens_out;
        out.equivalent_claude_cost_usd += exec.equivalent_claude_cost_usd;
        out.execution_ms += exec.execution_ms;
        out.cost_usd += exec.cost_usd;
        self.today = self.ledger.add(&self.ctx.task.task_id, exec.cost_usd).await;
    }

    /// The plan is made once: looked for until found, then kept for every later prompt.
    fn look_for_plan(&mut self, k: u32, exec: &ExecOutcome) {
        // Only where a plan was asked for (never in a shell command's output).
        let asked = self.prompt.contains(super::plan::REQUEST);
        if !asked || self.out.plan.is_some() || exec.status != ExecStatus::Succeeded {
            return;
        }
        let text = if exec.narrative.is_empty() {
            &exec.output
        } else {
            &exec.narrative
        };
        match Plan::find(text, k) {
            Some(plan) => {
                self.ctx.progress.emit(
                    ProgressEvent::status(format!(
                        "plan: {} ({} step(s), {} with how it will be verified)",
                        plan.goal,
                        plan.steps.len(),
                        plan.verified_steps()
                    ))
                    .with("attempt", k - 1)
                    .with("run_number", k)
                    .with("plan_steps", plan.steps.len()),
                );
                self.out.plan = Some(plan);
            }
            None => {
                self.ctx.progress.emit(
                    ProgressEvent::status(
                        "no plan in the requested form (Goal, numbered steps with how each is verified): the next prompt asks for it again",
                    )
                    .with("attempt", k - 1)
                    .with("run_number", k),
                );
            }
        }
    }

    // ---- verify -----------------------------------------------------------------------

    /// Observe, check (with the flaky guard), count the judge, announce the run's result.
    async fn verify(&mut self, k: u32) -> AttemptRecord {
        let ctx = self.ctx;
        let observations = match &self.before {
            Some(before) => observe::observe(before, &ctx.workspace, &ctx.env, &ctx.cancel).await,
            None => Vec::new(),
        };
        // The judge (if any) may spend only what the execution left.
        let vctx = ExecContext {
            remaining_budget_usd: self.caps.remaining(self.out.cost_usd, self.today),
            ..ctx.clone()
        };
        let mut report = checks::run_checks(&vctx, k, &observations).await;
        if !report.status.is_success()
            && ctx.config.verification.flaky_rerun
            && !ctx.cancel.is_cancelled()
        {
            report = flaky_guard(&vctx, report, &observations).await;
        }
        let check_cost: f64 = report.checks.iter().map(|c| c.cost_usd).sum();
        self.out.tokens_in += report.checks.iter().map(|c| c.tokens_in).sum::<u64>();
        self.out.tokens_out += report.checks.iter().map(|c| c.tokens_out).sum::<u64>();
        if check_cost > 0.0 {
            self.out.cost_usd += check_cost;
            self.today = self.ledger.add(&ctx.task.task_id, check_cost).await;
        }
        self.announce_result(k, &report);
        AttemptRecord {
            report,
            observations,
        }
    }

    /// `verification_retry_complete`, with the running cost of the task.
    fn announce_result(&self, k: u32, report: &VerificationReport) {
        let status = serde_json::to_value(report.status).unwrap_or_default();
        let passed = report.summary.passed;
        let failed = report.summary.total - passed;
        let text = if k == 1 {
            format!(
                "Verification of the first attempt: {passed} passed, {failed} failed ({})",
                status.as_str().unwrap_or_default()
            )
        } else {
            format!(
                "Retry {}/{} complete: {passed} passed, {failed} failed ({})",
                k - 1,
                self.out.budget.max_retries,
                status.as_str().unwrap_or_default()
            )
        };
        self.ctx.progress.emit(
            ProgressEvent::new(EventKind::VerificationRetryComplete, text)
                .with("attempt", k - 1)
                .with("run_number", k)
                // The running cost of the task (executions and judge calls so far).
                .with("cost_usd_so_far", self.out.cost_usd)
                .with("passed", passed)
                .with("failed", failed)
                .with("status", status),
        );
    }

    // ---- decide -----------------------------------------------------------------------

    /// Stop (verified, flaky, cancelled, a cap, a check that cannot run, no progress, the
    /// budget used up) or retry. The record is kept and the verdict persisted either way.
    async fn decide(&mut self, k: u32, record: AttemptRecord) -> Decision {
        let ctx = self.ctx;
        let Facts {
            success,
            flaky,
            only_flaky,
            errored_on_budget,
            check_errors,
            sig,
            outside_kill,
            unchanged,
        } = Facts::of(&record);
        self.out.attempts.push(record);

        let stop = if success {
            Some(Stop(VerificationStatus::Verified, Termination::Verified))
        } else if ctx.cancel.is_cancelled() {
            Some(Stop(
                VerificationStatus::ExecutionFailed,
                Termination::Cancelled,
            ))
        } else if only_flaky {
            // A check that fails and then passes may pass only because its first run
            // created what the second looks for: that is not verified work.
            ctx.progress.emit(
                ProgressEvent::status(format!(
                    "not verified: flaky check(s) passed only on re-run: {}",
                    flaky.join(", ")
                ))
                .with("attempt", k - 1)
                .with("run_number", k),
            );
            self.out.flaky_checks = flaky;
            Some(Stop(VerificationStatus::PartialPass, Termination::Flaky))
        } else if errored_on_budget {
            let why = self
                .caps
                .reached(self.out.cost_usd, self.today)
                .unwrap_or_else(|| "a cost cap is reached".into());
            Some(self.stop_for_budget(&why))
        } else if check_errors {
            // No edit can fix a check that cannot run (bad step, no runner, unstartable
            // command, path outside the workspace): retrying would only spend money.
            ctx.progress.emit(
                ProgressEvent::status(
                    "stopping: a check could not run (status error); no edit can fix that, so no retry",
                )
                .with("attempt", k - 1)
                .with("run_number", k),
            );
            Some(Stop(
                VerificationStatus::PartialPass,
                Termination::CheckError,
            ))
        } else if !outside_kill && unchanged && self.signatures.last() == Some(&sig) {
            ctx.progress.emit(ProgressEvent::status(
                "stopping: the attempt changed nothing and failed the same way as before",
            ));
            Some(Stop(
                VerificationStatus::PartialPass,
                Termination::NoProgress,
            ))
        } else {
            None
        };
        if stop.is_none() && !outside_kill {
            self.note_oscillation(k, &sig);
            self.signatures.push(sig);
        } else if stop.is_none() {
            ctx.progress.emit(
                ProgressEvent::status(
                    "a check was killed by a signal from outside (a shutdown?): this run is not compared with the others",
                )
                .with("attempt", k - 1)
                .with("run_number", k),
            );
        }
        // This attempt reached its verdict: a restart from here resumes after it.
        self.ledger
            .complete_attempt(&ctx.task.task_id, k, Some(self.carry()))
            .await;
        match stop {
            Some(stop) => Decision::Stop(stop),
            None if k > self.out.budget.max_retries => Decision::Stop(Stop(
                VerificationStatus::PartialPass,
                Termination::RetriesExhausted,
            )),
            None => Decision::Retry,
        }
    }

    /// A, B, A: the fix is flip-flopping (reported, not a reason to stop).
    fn note_oscillation(&mut self, k: u32, sig: &str) {
        let n = self.signatures.len();
        if n >= 2 && self.signatures[n - 2] == sig && self.signatures[n - 1] != sig {
            self.out.oscillation = true;
            self.ctx.progress.emit(
                ProgressEvent::status(format!(
                    "oscillation: attempt {k} fails like attempt {} (the fix is flip-flopping)",
                    k - 2
                ))
                .with("attempt", k - 1)
                .with("run_number", k),
            );
        }
    }

    /// What a restart needs to go on (module docs).
    fn carry(&self) -> serde_json::Value {
        let mut attempts = self.out.attempts.clone();
        for c in attempts.iter_mut().flat_map(|a| a.report.checks.iter_mut()) {
            c.output = crate::process::head_tail(&c.output, CARRIED_OUTPUT_BYTES);
        }
        let carry = Carry {
            attempts,
            tokens_in: self.out.tokens_in,
            tokens_out: self.out.tokens_out,
            equivalent_claude_cost_usd: self.out.equivalent_claude_cost_usd,
            execution_ms: self.out.execution_ms,
            executions: self.out.executions,
            plan: self.out.plan.clone(),
            last_output: crate::util::truncate_chars(
                &self.out.last_exec.output,
                prompt::PREVIOUS_OUTPUT_CHARS,
            ),
            signatures: self.signatures.clone(),
            oscillation: self.out.oscillation,
        };
        serde_json::to_value(carry).unwrap_or(serde_json::Value::Null)
    }

    // ---- correct ----------------------------------------------------------------------

    /// The next attempt's input: the self-contained corrective prompt (with the plan) and
    /// the short corrective turn for an executor that kept its conversation.
    fn correct(&mut self, k: u32) {
        let task = &self.ctx.task;
        let max = self.out.budget.max_retries;
        let plan = self.out.plan.as_ref();
        self.prompt = prompt::corrective_prompt(
            task,
            k,
            max,
            &self.out.attempts,
            &self.out.last_exec.output,
            plan,
        );
        self.followup = Some(prompt::corrective_turn(k, max, &self.out.attempts, plan));
    }

    // ---- report -----------------------------------------------------------------------

    /// Stop with `budget_exhausted`: `partial_pass` when some attempt was verified this run,
    /// else `execution_failed` carrying why (nothing was executed).
    fn stop_for_budget(&mut self, why: &str) -> Stop {
        self.ctx.progress.emit(ProgressEvent::status(format!(
            "stopping before spending: {why}"
        )));
        if self.out.attempts.is_empty() {
            self.out.last_exec = ExecOutcome::failed(format!("not run: {why}"));
            return Stop(
                VerificationStatus::ExecutionFailed,
                Termination::BudgetExhausted,
            );
        }
        Stop(
            VerificationStatus::PartialPass,
            Termination::BudgetExhausted,
        )
    }

    fn finish(mut self, stop: Stop) -> LoopOutcome {
        self.finish_ref(stop)
    }

    fn finish_ref(&mut self, Stop(status, reason): Stop) -> LoopOutcome {
        let mut out = self.out.clone();
        out.verification_status = status;
        out.termination_reason = reason;
        out
    }
}

/// Re-run each failed `test_passes` / `command_succeeds` once, within what is left of the
/// report's deadline; a pass on re-run marks the check `flaky` and leaves it `fail` (the loop
/// never counts it as verified: module docs).
async fn flaky_guard(
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
                tokens_in: 0,
                tokens_out: 0,
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
        // The plan in the specification's shape: goal, numbered steps, each verified.
        assert!(p.contains("PLAN\nGoal: "), "{p}");
        assert!(p.contains("1. <action> -> verify: <how"), "{p}");
        assert!(p.contains("each completion criterion"));
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
        let p = prompt::corrective_prompt(&task(), 2, 4, &h, &"y".repeat(3000), None);
        assert!(
            p.starts_with("VERIFICATION RETRY 2/4: fixing 1 failed check(s)."),
            "{p}"
        );
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
        // No plan was found: the corrective prompt asks for one; with a plan it carries it.
        assert!(p.contains("You did not write a plan"), "{p}");
        let plan = super::super::plan::Plan::find(
            "Goal: greet\nSteps:\n1. write hello.txt -> verify: grep hi",
            1,
        );
        let p = prompt::corrective_prompt(&task(), 2, 4, &h, "", plan.as_ref());
        assert!(p.contains("YOUR PLAN (made on attempt 1; keep to it, do not plan again"));
        assert!(p.contains("1. write hello.txt -> verify: grep hi"), "{p}");
        assert!(!p.contains("Before you change anything"), "{p}");
        // The short turn for a kept chat: what failed, no task, no previous output.
        let t = prompt::corrective_turn(2, 4, &h, plan.as_ref());
        assert!(t.starts_with("VERIFICATION RETRY 2/4: fixing 1 failed check(s)."));
        assert!(t.contains("FAILED CHECKS:") && t.contains("Keep to the plan you made"));
        assert!(!t.contains("ORIGINAL TASK") && !t.contains("YOUR PREVIOUS OUTPUT"));
        assert!(t.len() < p.len());
    }

    #[test]
    fn the_budget_rule_says_what_lowered_it() {
        let mut vcfg = crate::config::VerificationConfig::default();
        let mut t = task();
        t.max_verification_retries = Some(5);
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!(
            (b.max_retries, b.requested, b.limited_by),
            (3, 5, Some("retry_ceiling"))
        );
        assert!(
            b.note.contains("verification.retry_ceiling = 3"),
            "{}",
            b.note
        );
        vcfg.retry_ceiling = 5;
        t.max_verification_retries = Some(9);
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!((b.max_retries, b.limited_by), (5, Some("hub_cap")));
        t.max_verification_retries = None;
        vcfg.default_max_retries = 2;
        let b = RetryBudget::decide(&t, &vcfg, true);
        assert_eq!(
            (b.max_retries, b.requested_from, b.limited_by),
            (2, "config_default", None)
        );
        let b = RetryBudget::decide(&t, &vcfg, false);
        assert_eq!((b.max_retries, b.limited_by), (0, Some("shell_executor")));
    }
}
