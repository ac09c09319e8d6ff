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
//!   shape, [`crate::plan`]).
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
//! # Flaky guard (the choice, documented in docs/design.md)
//!
//! A failed command check is re-run once within what is left of the report's deadline. A
//! pass on re-run does NOT verify the task — its first run may have created what the second
//! looks for. The check stays `fail` in the report, marked `flaky` (so the report and the
//! result never disagree); when every failing check is flaky the loop stops with
//! `partial_pass`, reason `flaky`, and lists them in `result.flaky_checks`.
//!
//! # Restart
//!
//! Every execution's cost is counted whatever its status, and so is a judge's: dollars,
//! tokens, time and the execution itself are written to the ledger the moment they are known,
//! before any check runs, so a restart at any point of an attempt keeps them (in the result
//! and under the per-task cap). After each verdict the attempt number and a [`Carry`]
//! (reports, plan, last output) are persisted with them, so a restart — then
//! `task_continue` — resumes with the corrective prompt of the next retry and the earlier
//! attempts in the result; an attempt cut short before its verdict runs again.
//!
//! The phases are in `phases.rs`; the budgets are [`super::budget`], the flaky guard
//! [`super::flaky`].
//!
//! [`run`] is what the runner calls; [`run_with`] is the same loop over any [`Attempter`],
//! so tests can drive it with a closure that edits a real workspace.

use std::future::Future;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::executor::{Attempt, ExecContext, ExecOutcome, Executor};
use crate::spend::SpendLedger;

use super::budget::RetryBudget;
use super::{Termination, VerificationStatus};
use crate::plan::Plan;

mod phases;
use phases::run_phases;

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
    /// Why nothing was verified although the task gave success criteria (no steps, no judge
    /// configured: [`super::criteria`]); `result.not_verified`.
    pub not_verified: Option<String>,
}

/// What the loop persists with each verdict so a restarted task goes on where it was
/// (kept in the [`SpendLedger`] with the attempt number, written in one update). What the
/// task spent (dollars, tokens, time, executions) is not here: the ledger records it when it
/// is spent ([`SpendLedger::charge`]), so a restart before a verdict keeps it too.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Carry {
    /// Every verification run so far (check outputs cut to [`CARRIED_OUTPUT_BYTES`]).
    pub attempts: Vec<AttemptRecord>,
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

/// How the loop ends: the status and the reason.
#[derive(Debug, Clone, Copy)]
struct Stop(VerificationStatus, Termination);

/// What the decide phase concluded.
enum Decision {
    Stop(Stop),
    Retry,
}
