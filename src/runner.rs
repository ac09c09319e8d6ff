//! Runs one task to its terminal frame: workspace, task branch, executor, verification
//! loop, commit/push/PR, result.
//!
//! The runner owns nothing durable: it returns the frame, which the daemon puts in the
//! outbox, and what the task leaves to remove ([`Leftovers`]), which the daemon removes once
//! the frame is on its way. Everything it sends is redacted first, with the task's own
//! secrets (a password in its `repo` URL) added to the daemon's.
//!
//! Layout: this file runs the phases and builds the terminal frame; `prepare.rs` is the
//! first phase (workspace, task branch, the children's sandbox); `ahead.rs` makes the next
//! task's directories and sandbox while the daemon is idle; `leftovers.rs` removes what
//! the task leaves and reports a tree set aside.

use std::sync::Arc;
use std::time::Duration;

use std::fmt::Write as _;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};
use crate::git::branch::TaskBranch;
use crate::git::publish::{self, Publish};
use crate::git::{url::url_secrets, GitRunner};
use crate::hub::budget::RateBudget;
use crate::hub::link::TURNAROUND;
use crate::hub::proto::Outbound;
use crate::ops::Ops;
use crate::process::head_tail;
use crate::process::ChildEnv;
use crate::progress::{FrameSender, ProgressEvent, ProgressSink, Pump};
use crate::recorder::{Recorder, TaskRecord};
use crate::redact::Redactor;
use crate::sandbox;
use crate::spend::SpendLedger;
use crate::task::Task;
use crate::telemetry::TaskTrace;
use crate::verify::retry_loop::{self, Attempter, LoopOptions, LoopOutcome};
use crate::verify::VerificationStatus;
use crate::workspace::{self, Workspace};

mod ahead;
mod leftovers;
mod prepare;

pub use ahead::{Ahead, AheadPool, TaskDirs, RENEW_EVERY};

use ahead::handover;
pub use leftovers::Leftovers;

use prepare::prepare;

/// What the daemon gives every runner.
#[derive(Clone)]
pub struct RunnerDeps {
    /// The daemon's configuration.
    pub config: Arc<Config>,
    /// The filtered environment every task's children start from.
    pub env: ChildEnv,
    /// Scrubs the config's secrets from everything sent or logged.
    pub redactor: Arc<Redactor>,
    /// The hub's rate budget, shared with the link.
    pub budget: Arc<RateBudget>,
    /// Where progress frames go.
    pub out: Arc<dyn FrameSender>,
    /// Metrics and the live status for the ops endpoints.
    pub ops: Ops,
    /// The daemon-wide spend ledger, for the cost caps and resuming after a restart.
    pub ledger: Arc<SpendLedger>,
    /// How tasks are confined, decided once at start.
    pub containment: Arc<sandbox::Policy>,
    /// The flight recorder (disabled for offline runs).
    pub recorder: Recorder,
    /// OpenTelemetry export of each task's trace (disabled unless `[otel]` turns it on).
    pub telemetry: crate::telemetry::Telemetry,
}

/// How a task run ended.
#[derive(Debug)]
pub enum TaskOutcome {
    /// `task_complete` or `task_failed`, ready for the outbox.
    Terminal(Outbound),
    /// Cancelled (by the hub or a forced stop): no terminal frame.
    Cancelled,
}

/// A runner's end: how the task ended, and what it leaves to remove.
pub struct Finished {
    /// The terminal frame, or a cancellation.
    pub outcome: TaskOutcome,
    /// The task's temp workspace (or its hold on a managed clone) and private TMPDIR.
    pub leftovers: Leftovers,
}

/// One debug line on the turnaround target (see [`TURNAROUND`]) as a task passes a phase:
/// with the log's timestamps, where the daemon's share of a round trip goes (BENCHMARKS.md,
/// figure 3g).
pub(crate) fn phase(task_id: &str, phase: &'static str) {
    tracing::debug!(target: TURNAROUND, task_id = %task_id, phase, "task phase");
}

/// Result output kept in `task_complete.result.output` (head and tail).
const RESULT_OUTPUT_CAP: usize = 64 * 1024;

/// Run `task` to a terminal frame. `progress` may carry an observer (terminal display).
pub async fn run_task(
    task: Arc<Task>,
    deps: RunnerDeps,
    progress: ProgressSink,
    cancel: CancellationToken,
    dirs: TaskDirs,
) -> Finished {
    // A password in the task's repo URL is this task's secret: scrubbed from all it sends.
    // So is the agent login as the task's copy is made from it now (the operator may have
    // logged in again since the daemon started).
    let redactor = match task.repo.as_deref() {
        Some(url) => deps.redactor.with_extra(url_secrets(url)),
        None => (*deps.redactor).clone(),
    };
    let (login, ahead) = handover(&deps, dirs.ahead).await;
    let redactor = Arc::new(redactor.with_credentials(login));
    // Secrets are scrubbed as output arrives, so none can leave split across two frames.
    progress.set_redactor(redactor.clone());
    let executor_name = task
        .executor_kind()
        .ok()
        .and_then(|k| serde_json::to_value(k).ok())
        .and_then(|v| v.as_str().map(str::to_string));
    let record = deps
        .recorder
        .open(&task, executor_name.as_deref(), redactor.clone());
    let trace = deps
        .telemetry
        .task(&task, executor_name.as_deref(), redactor.clone());
    {
        let (record, trace) = (record.clone(), trace.clone());
        progress.set_tap(move |ev| {
            record.on_event(ev);
            trace.on_event(ev);
        });
    }
    let finished = run_recorded(
        task,
        &deps,
        (progress, cancel),
        (dirs.name, ahead),
        redactor,
        (&record, &trace),
    )
    .await;
    match &finished.outcome {
        TaskOutcome::Terminal(frame) => record.terminal(frame),
        TaskOutcome::Cancelled => {
            record.cancelled("cancelled by the hub or stopped by a forced shutdown")
        }
    }
    trace.finish(match &finished.outcome {
        TaskOutcome::Terminal(frame) => Some(frame.kind()),
        TaskOutcome::Cancelled => None,
    });
    finished
}

/// [`run_task`] once the task's flight record is open.
async fn run_recorded(
    task: Arc<Task>,
    deps: &RunnerDeps,
    (progress, cancel): (ProgressSink, CancellationToken),
    (dirs, ahead): (String, Option<prepare::Handed>),
    redactor: Arc<Redactor>,
    (record, trace): (&TaskRecord, &TaskTrace),
) -> Finished {
    let cfg = deps.config.clone();
    // The pump starts first: its heartbeat keeps the task fresh at the hub during a long clone.
    let pump_cancel = cancel.child_token();
    let pump = Pump {
        sink: progress.clone(),
        task_id: task.task_id.clone(),
        budget: deps.budget.clone(),
        out: deps.out.clone(),
        redactor: redactor.clone(),
        min_interval: Duration::from_millis(cfg.progress.min_interval_ms),
        heartbeat: Duration::from_secs(cfg.progress.heartbeat_secs),
        dropped: cancel.clone(),
        held: deps.env.fence().map(crate::process::Fence::watch),
    };
    let pump = tokio::spawn(pump.run(pump_cancel.clone()));
    let tmp = workspace::task_tmp_dir(&cfg, &dirs);
    let prepared = prepare(&task, deps, (&dirs, ahead), &tmp, &progress, &cancel);
    let (git, ws, branch, mut env) = match prepared.await {
        Ok(prepared) => prepared,
        Err(reason) => {
            deps.ops.metrics().task_finished("execution_failed");
            pump_cancel.cancel();
            let _ = pump.await;
            return Finished {
                outcome: failed(&task, &redactor, &reason.to_string(), &cancel),
                leftovers: Leftovers::new(None, tmp, record, &deps.ops),
            };
        }
    };
    phase(&task.task_id, "prepared");
    // From here the task's children run: what confines them is counted and recorded.
    let containment = deps.containment.ran_under();
    deps.ops
        .metrics()
        .task_started(deps.containment.level_name());
    record.containment(containment.clone());
    if let Some(tp) = trace.traceparent_for_children() {
        // `[otel] propagate_to_children`: what the task's children export joins its trace.
        env.set("TRACEPARENT", &tp);
    }
    let ctx = ExecContext {
        task: task.clone(),
        workspace: ws.path.clone(),
        config: cfg.clone(),
        env,
        progress: progress.clone(),
        cancel: cancel.clone(),
        remaining_budget_usd: None,
    };
    let outcome = match run_loop(&ctx, deps, (record, trace)).await {
        Err(frame) => Some(frame),
        Ok(lo) if cancel.is_cancelled() || lo.last_exec.status == ExecStatus::Cancelled => None,
        Ok(lo) => Some(report(&ctx, &lo, &ws, branch.as_ref(), &git, &redactor, trace).await),
    };
    pump_cancel.cancel();
    let last_progress = pump.await.ok().flatten();
    // The frame is self-contained: the sandboxes, the workspace and TMPDIR go once it is
    // sent.
    let leftovers = Leftovers::new(Some(ws), tmp, record, &deps.ops).closing(ctx.env, git);
    let outcome = match outcome {
        None => TaskOutcome::Cancelled,
        Some(mut frame) => {
            if let Some(ev) = last_progress {
                attach_last_progress(&mut frame, ev);
            }
            attach_containment(&mut frame, &containment);
            redact_frame(&redactor, &mut frame);
            TaskOutcome::Terminal(frame)
        }
    };
    Finished { outcome, leftovers }
}

/// Plan, execute, verify, decide, correct: the task's executor under the verification loop
/// ([`retry_loop`], whose phases carry those names), each attempt and the loop's end written
/// to the flight record. `Err` is the `task_failed` of a task no executor can run.
async fn run_loop(
    ctx: &ExecContext,
    deps: &RunnerDeps,
    (record, trace): (&TaskRecord, &TaskTrace),
) -> Result<LoopOutcome, Outbound> {
    let task = &ctx.task;
    let mut executor = match Executor::for_task(ctx) {
        Ok(e) => e,
        Err(reason) => {
            deps.ops.metrics().task_finished("execution_failed");
            return Err(Outbound::task_failed(
                &task.task_id,
                task.generation,
                &reason.to_string(),
            ));
        }
    };
    ctx.progress.emit(ProgressEvent::status(format!(
        "executor {:?} started",
        executor.kind()
    )));
    let opts = LoopOptions {
        ledger: Some(deps.ledger.clone()),
    };
    let is_llm = executor.is_llm();
    let mut attempter = RecordingAttempter {
        executor: &mut executor,
        record,
        trace,
        ops: &deps.ops,
    };
    let lo = retry_loop::run_with(&mut attempter, is_llm, ctx, &opts).await;
    phase(&task.task_id, "verified");
    record_loop(record, &lo);
    trace.loop_done(&lo);
    if let Some(sb) = ctx.env.sandbox() {
        record.network(&sb.network_use());
    }
    record_metrics(&deps.ops, &lo);
    Ok(lo)
}

/// Report: the terminal frame for the loop's verdict, with what publishing the work (when
/// the git workflow applies) added to the result.
async fn report(
    ctx: &ExecContext,
    lo: &LoopOutcome,
    ws: &Workspace,
    branch: Option<&TaskBranch>,
    git: &GitRunner,
    redactor: &Redactor,
    trace: &TaskTrace,
) -> Outbound {
    let mut frame = frame_for(&ctx.task, lo);
    // Nothing is published while the hub link is down: the hub may have given the task to
    // another agent meanwhile (and then this run is cancelled while it waits here).
    if let Some(fence) = ctx.env.fence() {
        if !fence.open(&ctx.cancel).await {
            return frame;
        }
    }
    if let (Some(tb), Outbound::TaskComplete { result, .. }) = (branch, &mut frame) {
        let p = Publish {
            cfg: &ctx.config,
            task: &ctx.task,
            path: &ws.path,
            branch: tb,
            git,
            credentials: redactor.credentials(),
        };
        let started = std::time::SystemTime::now();
        let extra = publish_verified_work(p, lo).await;
        trace.publish(started, &extra);
        if let Some(obj) = result.as_object_mut() {
            obj.extend(extra);
        }
    }
    frame
}

/// After the loop: what the verification status allows to be published. `verified` work
/// is committed, pushed and proposed; `partial_pass` only as a draft with `git.push_drafts`.
async fn publish_verified_work(p: Publish<'_>, lo: &LoopOutcome) -> Map<String, Value> {
    let draft = match lo.verification_status {
        VerificationStatus::Verified => false,
        VerificationStatus::PartialPass if p.cfg.git.push_drafts => true,
        VerificationStatus::PartialPass => {
            let mut r = Map::new();
            r.insert("branch".into(), json!(p.branch.name));
            r.insert("pushed".into(), json!(false));
            r.insert(
                "git_note".into(),
                json!("partial_pass: nothing committed or pushed (git.push_drafts is off)"),
            );
            return r;
        }
        VerificationStatus::ExecutionFailed => {
            let mut r = Map::new();
            r.insert("branch".into(), json!(p.branch.name));
            return r;
        }
    };
    publish::publish(p, &pr_body(p.task, lo), draft).await
}

/// The pull request body: what was asked, how it was verified, what it cost.
pub fn pr_body(task: &Task, lo: &LoopOutcome) -> String {
    let mut b = String::new();
    let _ = writeln!(b, "## Task\n\n{}\n", task.description.trim());
    if !task.success_criteria.is_empty() {
        let _ = writeln!(b, "## Success criteria\n");
        for c in &task.success_criteria {
            let _ = writeln!(b, "- {c}");
        }
        b.push('\n');
    }
    let _ = writeln!(b, "## Verification\n");
    let _ = writeln!(
        b,
        "| attempt | status | passed | failed |\n|---|---|---|---|"
    );
    for a in &lo.attempts {
        let rep = &a.report;
        let status = serde_json::to_value(rep.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            b,
            "| {} | {} | {} | {} |",
            rep.run_number,
            status,
            rep.summary.passed,
            rep.summary.failed + rep.summary.errors + rep.summary.timed_out
        );
    }
    let _ = writeln!(
        b,
        "\nAttempts: {} · cost: ${:.4} ({} tokens in, {} out)\n\nTask-Id: {}",
        lo.attempts.len(),
        lo.cost_usd,
        lo.tokens_in,
        lo.tokens_out,
        task.task_id
    );
    b
}

/// `task_failed` for a task that failed before execution (workspace, branch), redacted;
/// nothing when the failure was a cancellation.
fn failed(task: &Task, r: &Redactor, reason: &str, cancel: &CancellationToken) -> TaskOutcome {
    if cancel.is_cancelled() {
        return TaskOutcome::Cancelled;
    }
    let mut frame = Outbound::task_failed(&task.task_id, task.generation, reason);
    redact_frame(r, &mut frame);
    TaskOutcome::Terminal(frame)
}

/// The task's [`Executor`] with each attempt's prompt and outcome written to the record as
/// it happens (the loop itself stays unaware of the recorder).
struct RecordingAttempter<'a> {
    executor: &'a mut Executor,
    record: &'a TaskRecord,
    trace: &'a TaskTrace,
    ops: &'a Ops,
}

impl Attempter for RecordingAttempter<'_> {
    async fn attempt(&mut self, ctx: &ExecContext, attempt: Attempt) -> ExecOutcome {
        let n = attempt.number;
        // An attempt (an LLM conversation runs in this process, not in a child) starts only
        // with the task's fence open.
        if let Some(fence) = ctx.env.fence() {
            fence.open(&ctx.cancel).await;
        }
        // What the model is sent: a kept chat gets the short corrective turn.
        let prompt = self.executor.prompt_for(&attempt);
        self.record.attempt_start(n, prompt);
        self.trace.attempt_start(n, prompt);
        self.ops.attempt_started(n);
        let out = self.executor.execute(ctx, &attempt).await;
        phase(&ctx.task.task_id, "executed");
        self.record.attempt_end(n, &out);
        self.trace.attempt_end(n, &out);
        out
    }
}

/// Each attempt's full report and observations, and why the loop stopped.
fn record_loop(record: &TaskRecord, lo: &LoopOutcome) {
    for a in &lo.attempts {
        let report = serde_json::to_value(&a.report).unwrap_or(Value::Null);
        record.verification(a.report.run_number, report, &a.observations);
    }
    record.final_decision(
        lo.executions,
        lo.termination_reason.as_str(),
        json!({
            "verification_status": lo.verification_status,
            "cost_usd": lo.cost_usd,
            "tokens": lo.tokens_in + lo.tokens_out,
            "executions": lo.executions,
            "oscillation": lo.oscillation,
            "retry_budget": lo.budget,
            "plan": lo.plan,
        }),
    );
}

fn record_metrics(ops: &Ops, lo: &LoopOutcome) {
    let m = ops.metrics();
    let outcome = match lo.verification_status {
        VerificationStatus::Verified => "verified",
        VerificationStatus::PartialPass => "partial_pass",
        VerificationStatus::ExecutionFailed => "execution_failed",
    };
    if lo.last_exec.status == ExecStatus::Cancelled {
        m.task_finished("cancelled");
    } else {
        m.task_finished(outcome);
    }
    m.verification_attempts.observe(lo.attempts.len() as f64);
    for check in lo.attempts.iter().flat_map(|a| &a.report.checks) {
        m.check_seconds.observe(check.duration_ms as f64 / 1000.0);
    }
    m.execution_seconds.observe(lo.execution_ms as f64 / 1000.0);
    m.tokens.inc_by(lo.tokens_in + lo.tokens_out);
    m.cost_usd.inc_by(lo.cost_usd);
}

/// The terminal frame for a finished loop: `task_failed` for an execution failure,
/// `task_complete` with every attempt's report otherwise.
pub fn frame_for(task: &Task, lo: &LoopOutcome) -> Outbound {
    if lo.verification_status == VerificationStatus::ExecutionFailed {
        let reason = lo
            .last_exec
            .error
            .clone()
            .unwrap_or_else(|| format!("execution {:?}", lo.last_exec.status));
        let mut frame = Outbound::task_failed(&task.task_id, task.generation, &reason);
        // What was spent and what earlier attempts found is not lost with the failure.
        if let Outbound::TaskFailed {
            tokens_used,
            result,
            verification_history,
            ..
        } = &mut frame
        {
            if lo.executions > 0 || lo.cost_usd > 0.0 {
                *tokens_used = Some(lo.tokens_in + lo.tokens_out);
                *result = Some(result_json(lo));
                *verification_history = history_json(lo);
            }
        }
        return frame;
    }
    let history = history_json(lo);
    Outbound::TaskComplete {
        task_id: task.task_id.clone(),
        generation: task.generation,
        result: result_json(lo),
        tokens_used: lo.tokens_in + lo.tokens_out,
        // The last report without its observation list: that list is in the history once.
        verification_report: lo
            .attempts
            .last()
            .map(|a| serde_json::to_value(&a.report).expect("reports serialize")),
        verification_history: history,
    }
}

/// The progress batch the budget had no room for rides in the result (`last_progress`, a
/// field the hub ignores but stores with the result), so it is never dropped.
fn attach_last_progress(frame: &mut Outbound, ev: Value) {
    match frame {
        Outbound::TaskComplete { result, .. } => {
            if let Some(obj) = result.as_object_mut() {
                obj.insert("last_progress".into(), ev);
            }
        }
        Outbound::TaskFailed { result, .. } => {
            result
                .get_or_insert_with(|| json!({}))
                .as_object_mut()
                .map(|obj| obj.insert("last_progress".into(), ev));
        }
        _ => {}
    }
}

/// The containment the task's children ran under, in its result (`containment`: `strict`,
/// `best-effort` or `off`; `containment_not_enforced`: the layers missing below strict), so
/// a reader of any result can tell how confined its work was. Fields the hub ignores.
fn attach_containment(frame: &mut Outbound, ran_under: &Value) {
    let result = match frame {
        Outbound::TaskComplete { result, .. } => Some(result),
        Outbound::TaskFailed { result, .. } => Some(result.get_or_insert_with(|| json!({}))),
        _ => None,
    };
    if let Some(obj) = result.and_then(Value::as_object_mut) {
        obj.insert("containment".into(), ran_under["level"].clone());
        if let Some(missing) = ran_under.get("not_enforced") {
            obj.insert("containment_not_enforced".into(), missing.clone());
        }
    }
}

/// Every attempt's report with its observations.
fn history_json(lo: &LoopOutcome) -> Vec<Value> {
    lo.attempts
        .iter()
        .map(|a| serde_json::to_value(a).expect("reports serialize"))
        .collect()
}

/// `task_complete.result` (PROTOCOL.md §7), plus the fields docs/protocol.md lists
/// (the hub ignores fields it does not know and stores the result whole): `retry_budget` and
/// `max_verification_retries` (the effective budget and why), `plan`, `resumed_at`,
/// `flaky_checks` when the loop stopped for a flaky check, `not_verified` when success
/// criteria went unchecked (no steps, no judge), and for a shell task `shell_runs` (every
/// run of its command: `run`, `exit`, `error`, `execution_ms`).
pub fn result_json(lo: &LoopOutcome) -> Value {
    let status = match lo.verification_status {
        VerificationStatus::Verified => "success",
        VerificationStatus::PartialPass => "partial",
        VerificationStatus::ExecutionFailed => "failed",
    };
    let mut v = json!({
        "status": status,
        "output": head_tail(&lo.last_exec.output, RESULT_OUTPUT_CAP),
        "model_used": lo.last_exec.model_used,
        "tokens_in": lo.tokens_in,
        "tokens_out": lo.tokens_out,
        "estimated_cost_usd": lo.cost_usd,
        "equivalent_claude_cost_usd": lo.equivalent_claude_cost_usd,
        "execution_ms": lo.execution_ms,
        "verification_status": lo.verification_status,
        "verification_attempts": lo.attempts.len(),
        "termination_reason": lo.termination_reason,
        "iterations_used": lo.last_exec.iterations_used,
        // A subscription login's cost (claude) is an API-equivalent estimate, not spend.
        "cost_is_estimate": lo.last_exec.cost_is_estimate,
        "permission_denials": lo.last_exec.permission_denials,
        // The specification's field: the retries this task was allowed, and why.
        "max_verification_retries": lo.budget.max_retries,
        "retry_budget": lo.budget,
        "plan": lo.plan,
    });
    if let Some(k) = lo.resumed_at {
        v["resumed_at"] = json!(k);
    }
    if !lo.flaky_checks.is_empty() {
        v["flaky_checks"] = json!(lo.flaky_checks);
    }
    if let Some(why) = &lo.not_verified {
        v["not_verified"] = json!(why);
    }
    if !lo.last_exec.shell_runs.is_empty() {
        v["shell_runs"] = json!(lo.last_exec.shell_runs);
    }
    v
}

fn redact_frame(r: &Redactor, frame: &mut Outbound) {
    match frame {
        Outbound::TaskComplete {
            result,
            verification_report,
            verification_history,
            ..
        } => {
            r.scrub_value(result);
            if let Some(v) = verification_report {
                r.scrub_value(v);
            }
            verification_history
                .iter_mut()
                .for_each(|v| r.scrub_value(v));
        }
        Outbound::TaskFailed {
            error,
            reason,
            result,
            verification_history,
            ..
        } => {
            *error = r.scrub(error);
            *reason = r.scrub(reason);
            if let Some(v) = result {
                r.scrub_value(v);
            }
            verification_history
                .iter_mut()
                .for_each(|v| r.scrub_value(v));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_counts_both_caps_when_two_apply() {
        let original: String = (0..5000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let mut first = crate::process::CappedBuf::new(1000);
        first.push(original.as_bytes());
        let captured = first.to_string_lossy();
        assert!(captured.contains("[… 4000 bytes elided …]"));
        let out = head_tail(&captured, 100);
        assert_eq!(out.matches("bytes elided").count(), 1, "{out}");
        assert!(out.contains("[… 4900 bytes elided …]"), "{out}");
        assert!(
            out.starts_with(&original[..50]) && out.ends_with(&original[4950..]),
            "{out}"
        );
        // One cap only: unchanged behaviour.
        assert!(head_tail(&original, 100).contains("[… 4900 bytes elided …]"));
    }
}
