//! Runs one task to its terminal frame: workspace, task branch, executor, verification
//! loop, commit/push/PR, result.
//!
//! The runner owns nothing durable: it returns the frame and the daemon puts it in the
//! outbox. Everything it sends is redacted first, with the task's own secrets (a password in
//! its `repo` URL) added to the daemon's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::executor::{ExecContext, ExecStatus, Executor};
use crate::hub::budget::RateBudget;
use crate::hub::proto::Outbound;
use crate::ops::Ops;
use crate::process::ChildEnv;
use crate::progress::{FrameSender, ProgressEvent, ProgressSink, Pump};
use crate::redact::Redactor;
use crate::spend::SpendLedger;
use crate::task::Task;
use crate::verify::retry_loop::{self, LoopOptions, LoopOutcome};
use crate::verify::VerificationStatus;
use crate::workspace::{self, GitRunner};

/// What the daemon gives every runner.
#[derive(Clone)]
pub struct RunnerDeps {
    pub config: Arc<Config>,
    pub env: ChildEnv,
    pub redactor: Arc<Redactor>,
    pub budget: Arc<RateBudget>,
    pub out: Arc<dyn FrameSender>,
    pub ops: Ops,
    /// The daemon-wide spend ledger, for the cost caps and resuming after a restart.
    pub ledger: Arc<SpendLedger>,
}

/// How a task run ended.
#[derive(Debug)]
pub enum TaskOutcome {
    /// `task_complete` or `task_failed`, ready for the outbox.
    Terminal(Outbound),
    /// Cancelled (by the hub or a forced stop): no terminal frame.
    Cancelled,
}

/// Result output kept in `task_complete.result.output` (head and tail).
const RESULT_OUTPUT_CAP: usize = 64 * 1024;

/// The workspace for a task without a repository: `repo_dir`, else a per-task directory
/// (which [`workspace::prepare`] treats as temporary).
pub fn workspace_for(cfg: &Config, task: &Task) -> PathBuf {
    match &cfg.repo_dir {
        Some(d) => d.clone(),
        None => {
            let safe: String = task
                .task_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(100)
                .collect();
            cfg.state_dir.join("work").join(safe)
        }
    }
}

/// Run `task` to a terminal frame. `progress` may carry an observer (terminal display).
pub async fn run_task(
    task: Arc<Task>,
    deps: RunnerDeps,
    progress: ProgressSink,
    cancel: CancellationToken,
) -> TaskOutcome {
    let cfg = deps.config.clone();
    // A password in the task's repo URL is this task's secret: scrubbed from all it sends.
    let redactor = Arc::new(match task.repo.as_deref() {
        Some(url) => deps.redactor.with_extra(workspace::url_secrets(url)),
        None => (*deps.redactor).clone(),
    });
    // Secrets are scrubbed as output arrives, so none can leave split across two frames.
    progress.set_redactor(redactor.clone());
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
    };
    let pump = tokio::spawn(pump.run(pump_cancel.clone()));
    let git = GitRunner::new(&cfg, &deps.env, cancel.clone());
    let (ws, branch) = match prepare_workspace(&cfg, &task, &git, &progress).await {
        Ok(prepared) => prepared,
        Err(reason) => {
            deps.ops.metrics().task_finished("execution_failed");
            pump_cancel.cancel();
            let _ = pump.await;
            return failed(&task, &redactor, &reason, &cancel);
        }
    };
    let workspace = ws.path.clone();
    let ctx = ExecContext {
        task: task.clone(),
        workspace,
        config: cfg.clone(),
        env: deps.env.clone(),
        progress: progress.clone(),
        cancel: cancel.clone(),
        remaining_budget_usd: None,
    };
    let outcome = match Executor::for_task(&ctx) {
        Err(reason) => {
            deps.ops.metrics().task_finished("execution_failed");
            Some(Outbound::task_failed(
                &task.task_id,
                task.generation,
                &reason,
            ))
        }
        Ok(mut executor) => {
            progress.emit(ProgressEvent::status(format!(
                "executor {:?} started",
                executor.kind()
            )));
            let opts = LoopOptions {
                ledger: Some(deps.ledger.clone()),
            };
            let lo = retry_loop::run_with_options(&mut executor, &ctx, &opts).await;
            record_metrics(&deps.ops, &lo);
            if cancel.is_cancelled() || lo.last_exec.status == ExecStatus::Cancelled {
                None
            } else {
                let mut frame = frame_for(&task, &lo);
                if let (Some(tb), Outbound::TaskComplete { result, .. }) = (&branch, &mut frame) {
                    let extra = workspace::finish(&cfg, &task, &lo, &ws, tb, &git).await;
                    if let Some(obj) = result.as_object_mut() {
                        obj.extend(extra);
                    }
                }
                Some(frame)
            }
        }
    };
    pump_cancel.cancel();
    let last_progress = pump.await.ok().flatten();
    // The frame is self-contained, so a temp workspace can go before it is sent.
    ws.release().await;
    match outcome {
        None => TaskOutcome::Cancelled,
        Some(mut frame) => {
            if let Some(ev) = last_progress {
                attach_last_progress(&mut frame, ev);
            }
            redact_frame(&redactor, &mut frame);
            TaskOutcome::Terminal(frame)
        }
    }
}

/// The task's workspace and, when the git workflow applies, its task branch.
async fn prepare_workspace(
    cfg: &Config,
    task: &Task,
    git: &GitRunner,
    progress: &ProgressSink,
) -> Result<(workspace::Workspace, Option<workspace::TaskBranch>), String> {
    if task.repo.is_some() {
        progress.emit(ProgressEvent::status("preparing the repository workspace"));
    }
    let ws = workspace::prepare(cfg, task, git).await?;
    match workspace::start_branch(cfg, task, &ws, git).await {
        Ok(branch) => {
            if let Some(b) = &branch {
                progress.emit(ProgressEvent::status(format!(
                    "git: task branch {} from {}",
                    b.name, b.base
                )));
            }
            Ok((ws, branch))
        }
        Err(e) => {
            ws.release().await;
            Err(format!("creating the task branch: {e}"))
        }
    }
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

/// Every attempt's report with its observations.
fn history_json(lo: &LoopOutcome) -> Vec<Value> {
    lo.attempts
        .iter()
        .map(|a| serde_json::to_value(a).expect("reports serialize"))
        .collect()
}

/// `task_complete.result` (PROTOCOL.md §7), plus `flaky_checks` when the loop stopped for
/// a flaky check.
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
    });
    if !lo.flaky_checks.is_empty() {
        v["flaky_checks"] = json!(lo.flaky_checks);
    }
    v
}

/// `s` cut to about `max` bytes keeping head and tail, with a marker saying what was cut.
pub fn head_tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut buf = crate::process::CappedBuf::new(max);
    buf.push(s.as_bytes());
    buf.to_string_lossy()
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
