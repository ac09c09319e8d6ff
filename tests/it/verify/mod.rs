//! The verification loop end to end: real workspaces in temp dirs, real check commands, a
//! real shell executor, an attempt closure standing in for an LLM (it edits real files), and
//! a fake Ollama HTTP server on 127.0.0.1:0 for `llm_judge`.
//!
//! Layout: this file holds the shared context builders; `attempts`, `judge` and `limits` hold
//! the tests by topic.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::procfs::procs_with;
use crate::util::{kinds, Events};
use hub_sidecar::config::Config;
use hub_sidecar::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};
use hub_sidecar::process::ChildEnv;
use hub_sidecar::progress::{EventKind, ProgressSink};
use hub_sidecar::spend::SpendLedger;
use hub_sidecar::task::Task;
use hub_sidecar::verify::report::{CheckStatus, ReportStatus};
use hub_sidecar::verify::retry_loop::{self, FnAttempter, LoopOptions, LoopOutcome};
use hub_sidecar::verify::VerificationStatus;
use serde_json::{json, Value};

mod attempts;
mod judge;
mod limits;

/// A context over `ws` for `task` (task_id filled in), recording every progress event.
fn ctx_with(ws: &Path, mut task: Value, tweak: impl FnOnce(&mut Config)) -> (ExecContext, Events) {
    task["task_id"] = json!("t-it-verify");
    let events: Events = Arc::default();
    let ev = events.clone();
    let mut cfg = Config::for_hub("ws://127.0.0.1:1/ws", ws);
    tweak(&mut cfg);
    let ctx = ExecContext {
        task: Arc::new(Task::from_value(task).unwrap()),
        workspace: ws.to_path_buf(),
        config: Arc::new(cfg),
        env: ChildEnv::inherit(),
        progress: ProgressSink::with_observer(8192, move |e| ev.lock().unwrap().push(e.clone())),
        cancel: tokio_util::sync::CancellationToken::new(),
        remaining_budget_usd: None,
    };
    (ctx, events)
}

fn ctx_for(ws: &Path, task: Value) -> (ExecContext, Events) {
    ctx_with(ws, task, |_| {})
}

/// A successful execution costing `cost_usd`.
fn ok(cost_usd: f64) -> ExecOutcome {
    let mut o = ExecOutcome::failed("");
    o.status = ExecStatus::Succeeded;
    o.error = None;
    o.output = "done".into();
    o.tokens_in = 10;
    o.tokens_out = 5;
    o.cost_usd = cost_usd;
    o.execution_ms = 1;
    o
}

/// Run the loop as an LLM executor whose attempt `k` calls `edit(workspace, k)`.
/// Returns the outcome and the prompts the "LLM" received.
async fn run_llm(
    ctx: &ExecContext,
    opts: &LoopOptions,
    cost_usd: f64,
    edit: impl Fn(&Path, u32) + Clone + 'static,
) -> (LoopOutcome, Vec<String>) {
    let prompts: Arc<Mutex<Vec<String>>> = Arc::default();
    let p = prompts.clone();
    let ws: PathBuf = ctx.workspace.clone();
    let mut attempter = FnAttempter(move |a: Attempt| {
        p.lock().unwrap().push(a.prompt.clone());
        let ws = ws.clone();
        let edit = edit.clone();
        async move {
            edit(&ws, a.number);
            ok(cost_usd)
        }
    });
    let out = retry_loop::run_with(&mut attempter, true, ctx, opts).await;
    let prompts = prompts.lock().unwrap().clone();
    (out, prompts)
}
