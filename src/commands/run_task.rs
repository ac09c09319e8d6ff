//! `hub-sidecar run-task TASK.json`: run one task offline, without a hub.
//!
//! The same path as the daemon ([`crate::runner::run_task`]: executor, verification loop,
//! result frame, redaction) with progress shown in the terminal instead of sent to a hub.
//! The result — the `task_complete` / `task_failed` frame the hub would get — goes to stdout
//! or `--out`. Exit 0 iff the task was verified. The task's flight record is written under the
//! configured state directory, so `tasks` and `show` tell its story like a daemon task's.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::RunTaskArgs;
use crate::config::{Config, Layers};
use crate::hub::budget::RateBudget;
use crate::hub::proto::Outbound;
use crate::ops::Ops;
use crate::process::ChildEnv;
use crate::progress::FrameSender;
use crate::runner::{self, RunnerDeps, TaskOutcome};
use crate::spend::SpendLedger;

/// Progress frames have nowhere to go offline: the terminal shows progress instead.
struct Discard;

impl FrameSender for Discard {
    fn send_progress(&self, _frame: Outbound) {}
}

/// A config for offline work: file (when given), `HUB_SIDECAR_*` environment and defaults;
/// the hub keys are optional. State goes to `state_dir` when given (a temporary directory),
/// else to the configured one.
pub fn offline_config(file: Option<&Path>, state_dir: Option<&Path>) -> anyhow::Result<Config> {
    let mut cfg = load_offline(file)?;
    if let Some(dir) = state_dir {
        cfg.state_dir = dir.to_path_buf();
        cfg.state_file = None;
    }
    Ok(cfg)
}

/// The config as the file and environment give it, hub keys optional.
fn load_offline(file: Option<&Path>) -> anyhow::Result<Config> {
    let mut layers = Layers {
        file: file.map(Path::to_path_buf),
        env: std::env::vars().collect(),
        flags: Vec::new(),
    };
    let cfg = match Config::load(&layers) {
        Ok(c) => c,
        Err(first) => {
            // The hub is not used offline: fill in the hub keys the file or environment lack
            // and report the original error if that was not the problem.
            layers.flags = vec![
                ("agent_id".into(), "offline".into()),
                ("token".into(), "offline-unused".into()),
                ("hub_url".into(), "ws://127.0.0.1:9/ws".into()),
            ];
            Config::load(&layers).map_err(|_| first)?
        }
    };
    Ok(cfg)
}

/// A fresh temporary directory (created off the runtime threads).
pub async fn temp_dir(prefix: &'static str) -> anyhow::Result<tempfile::TempDir> {
    tokio::task::spawn_blocking(move || tempfile::Builder::new().prefix(prefix).tempdir())
        .await?
        .context("creating a temporary directory")
}

/// Run the task and print its result frame.
pub async fn run(args: RunTaskArgs) -> anyhow::Result<ExitCode> {
    let task = super::read_task(&args.task).await?;
    // The configured state directory, so hand-run tasks share the daemon's dependency caches
    // and records; a temporary one only when none is configured. Records then go to the
    // default state directory, and only if it exists: a hand run must not create the
    // daemon's state directory (as root, it would then belong to root).
    let names_state_dir = Layers::from_process(args.config.clone(), Vec::new()).names_state_dir();
    let configured = load_offline(args.config.as_deref())?.state_dir;
    let state = if names_state_dir {
        None
    } else {
        Some(temp_dir("hub-sidecar-state-").await?)
    };
    let mut cfg = offline_config(args.config.as_deref(), state.as_ref().map(|s| s.path()))?;
    if names_state_dir {
        tokio::fs::create_dir_all(&cfg.state_dir)
            .await
            .with_context(|| {
                format!(
                    "creating the configured state_dir {} (run as the user the daemon runs as)",
                    cfg.state_dir.display()
                )
            })?;
    }
    let records = tokio::fs::metadata(&configured)
        .await
        .is_ok_and(|m| m.is_dir())
        .then(|| crate::recorder::root(&configured));
    let workspace = match &args.workspace {
        Some(w) => {
            tokio::fs::create_dir_all(w)
                .await
                .with_context(|| format!("creating the workspace {}", w.display()))?;
            // Resolved once: a relative path would otherwise be resolved again against the
            // workspace by every `git -C` of the observation.
            tokio::fs::canonicalize(w)
                .await
                .with_context(|| format!("resolving the workspace path {}", w.display()))?
        }
        None => temp_dir("hub-sidecar-run-task-").await?.keep(),
    };
    eprintln!("task {} in workspace {}", task.task_id, workspace.display());
    cfg.repo_dir = Some(workspace);
    // The loop's own rule, so the progress line counts what the loop will do.
    let is_llm = task.executor_kind().ok() != Some(crate::task::ExecutorKind::Shell);
    let budget = crate::verify::budget::RetryBudget::decide(&task, &cfg.verification, is_llm);
    let max_attempts = u64::from(budget.max_retries) + 1;
    let cfg = Arc::new(cfg);
    let env = ChildEnv::from_config(&cfg);
    let redactor = Arc::new(env.redactor(&cfg).await);
    let (recorder, record_writer) = match &records {
        Some(root) => crate::recorder::Recorder::start(root.clone(), cfg.recorder.clone()),
        None => (
            crate::recorder::Recorder::disabled(),
            tokio::spawn(async {}),
        ),
    };
    let deps = RunnerDeps {
        env,
        redactor: redactor.clone(),
        budget: Arc::new(RateBudget::from_config(&cfg.progress)),
        out: Arc::new(Discard),
        ops: Ops::new(),
        containment: Arc::new(crate::sandbox::Policy::probe_and_decide(cfg.containment).await),
        recorder: recorder.clone(),
        telemetry: crate::telemetry::Telemetry::disabled(),
        ledger: Arc::new(SpendLedger::in_memory()),
        config: cfg.clone(),
    };
    let line = crate::term::ProgressLine::start(max_attempts);
    let sink = line.sink(cfg.progress.max_text_bytes);
    let cancel = CancellationToken::new();
    let task_id = task.task_id.clone();
    let dirs = runner::TaskDirs::of(&task, None);
    let mut run = Box::pin(runner::run_task(
        Arc::new(task),
        deps,
        sink,
        cancel.clone(),
        dirs,
    ));
    let runner::Finished { outcome, leftovers } = tokio::select! {
        o = &mut run => o,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted: cancelling the task (its processes are killed)");
            cancel.cancel();
            (&mut run).await
        }
    };
    leftovers.remove().await;
    line.finish().await;
    // Every handle to the recorder gone, its writer ends once the last line is on disk.
    drop((run, recorder));
    match (record_writer.await, &records) {
        (Ok(()), Some(root)) if cfg.recorder.enabled => eprintln!(
            "flight record under {} (`hub-sidecar tasks` / `show {task_id}` with this config)",
            root.display()
        ),
        (_, None) if cfg.recorder.enabled => eprintln!(
            "no flight record: the state directory {} does not exist (set state_dir in --config)",
            configured.display()
        ),
        _ => {}
    }
    if let Some(state) = state {
        tokio::task::spawn_blocking(move || drop(state)).await?;
    }
    let frame = match outcome {
        TaskOutcome::Cancelled => {
            eprintln!("task cancelled: no result");
            return Ok(ExitCode::from(130));
        }
        TaskOutcome::Terminal(frame) => frame,
    };
    let value: serde_json::Value =
        serde_json::from_str(&frame.to_text()).context("re-reading the result frame")?;
    let verified =
        value["type"] == "task_complete" && value["result"]["verification_status"] == "verified";
    let text = serde_json::to_string_pretty(&value)? + "\n";
    match &args.out {
        Some(path) => {
            tokio::fs::write(path, &text)
                .await
                .with_context(|| format!("writing the result to {}", path.display()))?;
            eprintln!("result written to {}", path.display());
        }
        None => print!("{text}"),
    }
    eprintln!("{}", summary(&value));
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line for the terminal: what the result is.
fn summary(v: &serde_json::Value) -> String {
    if v["type"] == "task_failed" {
        return format!("task_failed: {}", v["reason"].as_str().unwrap_or(""));
    }
    let r = &v["result"];
    format!(
        "{} after {} attempt(s) ({})",
        r["verification_status"].as_str().unwrap_or("?"),
        r["verification_attempts"],
        r["termination_reason"].as_str().unwrap_or("?")
    )
}
