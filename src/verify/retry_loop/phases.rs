//! The phases of one loop run (`LoopRun`): plan, execute, verify, decide, correct, report —
//! each a method, in that order; the parent module's docs say what each decides.

use crate::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus};
use crate::plan::Plan;
use crate::progress::{EventKind, ProgressEvent};
use crate::spend::{SpendLedger, Usage};
use crate::verify::budget::{Caps, RetryBudget};
use crate::verify::checks;
use crate::verify::criteria;
use crate::verify::flaky;
use crate::verify::observe::{self, Snapshot};
use crate::verify::prompt;
use crate::verify::report::{AttemptRecord, CheckStatus, VerificationReport};
use crate::verify::signature::{failure_signature, interrupted};
use crate::verify::{Termination, VerificationStatus};

use super::{Attempter, Carry, Decision, LoopOutcome, Stop, CARRIED_OUTPUT_BYTES};

/// The specification's loop, phase by phase (module docs).
pub(super) async fn run_phases<A: Attempter>(
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
                    && c.output.starts_with(crate::verify::judge::BUDGET_EXHAUSTED)
            }),
            check_errors: report.summary.errors > 0,
            sig: failure_signature(report),
            outside_kill: interrupted(report),
            unchanged: observe::is_unchanged(&record.observations),
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
            nothing_to_verify: task.skip_verification
                || (task.verification_steps.is_empty()
                    && criteria::judged_steps(task, vcfg).is_empty()),
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
                not_verified: criteria::not_verified(task, vcfg),
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
        if let Some(why) = &run.out.not_verified {
            ctx.progress.emit(ProgressEvent::status(why.clone()));
        }
        run.resume().await?;
        Ok(run)
    }

    /// A task run again after a restart (`task_continue`) keeps its attempt count, spend,
    /// reports, tokens and plan, and continues with the corrective prompt of its next retry;
    /// an attempt the restart cut short runs again.
    ///
    /// What the task spent — dollars, tokens, time, executions — is restored whenever the
    /// ledger has it, also when the restart came before the first verdict: it was written
    /// when spent, so the result and the per-task cap count every life of the task.
    async fn resume(&mut self) -> Result<(), LoopOutcome> {
        let task = &self.ctx.task;
        let Some(prev) = self.ledger.task(&task.task_id).await else {
            return Ok(());
        };
        if prev.attempt == 0 && prev.spent_usd == 0.0 && prev.used == Usage::default() {
            return Ok(());
        }
        let max = self.out.budget.max_retries;
        self.first = prev.attempt + 1;
        self.out.resumed_at = Some(self.first);
        self.out.cost_usd = prev.spent_usd;
        self.out.tokens_in = prev.used.tokens_in;
        self.out.tokens_out = prev.used.tokens_out;
        self.out.equivalent_claude_cost_usd = prev.used.equivalent_claude_cost_usd;
        self.out.execution_ms = prev.used.execution_ms;
        self.out.executions = prev.used.executions;
        let carry: Option<Carry> = prev.carry.and_then(|c| serde_json::from_value(c).ok());
        if let Some(c) = carry {
            self.out.attempts = c.attempts;
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

    /// Count an execution whatever its status: a killed or failed run spent money too. It
    /// is written to the ledger at once (dollars, tokens, time), before any check runs.
    async fn charge_execution(&mut self, exec: &ExecOutcome) {
        let used = Usage {
            tokens_in: exec.tokens_in,
            tokens_out: exec.tokens_out,
            equivalent_claude_cost_usd: exec.equivalent_claude_cost_usd,
            execution_ms: exec.execution_ms,
            executions: 1,
        };
        let out = &mut self.out;
        out.executions += 1;
        out.tokens_in += exec.tokens_in;
        out.tokens_out += exec.tokens_out;
        out.equivalent_claude_cost_usd += exec.equivalent_claude_cost_usd;
        out.execution_ms += exec.execution_ms;
        out.cost_usd += exec.cost_usd;
        let task_id = &self.ctx.task.task_id;
        self.today = self.ledger.charge(task_id, exec.cost_usd, &used).await;
    }

    /// The task's totals so far, as the ledger keeps them with each verdict.
    fn used(&self) -> Usage {
        Usage {
            tokens_in: self.out.tokens_in,
            tokens_out: self.out.tokens_out,
            equivalent_claude_cost_usd: self.out.equivalent_claude_cost_usd,
            execution_ms: self.out.execution_ms,
            executions: self.out.executions,
        }
    }

    /// The plan is made once: looked for until found, then kept for every later prompt.
    fn look_for_plan(&mut self, k: u32, exec: &ExecOutcome) {
        // Only where a plan was asked for (never in a shell command's output).
        let asked = self.prompt.contains(crate::plan::REQUEST);
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
            report = flaky::guard(&vctx, report, &observations).await;
        }
        let check_cost: f64 = report.checks.iter().map(|c| c.cost_usd).sum();
        let judged = Usage {
            tokens_in: report.checks.iter().map(|c| c.tokens_in).sum(),
            tokens_out: report.checks.iter().map(|c| c.tokens_out).sum(),
            ..Usage::default()
        };
        self.out.tokens_in += judged.tokens_in;
        self.out.tokens_out += judged.tokens_out;
        self.out.cost_usd += check_cost;
        self.today = self
            .ledger
            .charge(&ctx.task.task_id, check_cost, &judged)
            .await;
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
        let decision = match stop {
            Some(stop) => Decision::Stop(stop),
            None if k > self.out.budget.max_retries => Decision::Stop(Stop(
                VerificationStatus::PartialPass,
                Termination::RetriesExhausted,
            )),
            None => Decision::Retry,
        };
        // This attempt reached its verdict: a restart from here resumes after it. Only
        // where there is an after: a loop that stops here forgets the task's record at
        // once (`finish_task`), unless cancelled (a restart may continue it), so writing
        // the record first would be two fsyncs for nothing.
        let resumable = match &decision {
            Decision::Retry => true,
            Decision::Stop(Stop(_, termination)) => *termination == Termination::Cancelled,
        };
        if resumable {
            self.ledger
                .complete_attempt(&ctx.task.task_id, k, Some(self.carry()), self.used())
                .await;
        }
        decision
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
            plan: self.out.plan.clone(),
            // Whole lines, more than a prompt quotes: the prompt rebuilt after a restart
            // cuts them the same way as one built before it.
            last_output: prompt::head_lines(
                self.out.last_exec.output.trim(),
                2 * prompt::PREVIOUS_OUTPUT_CHARS,
            )
            .0,
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
