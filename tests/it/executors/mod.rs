//! The Claude Code CLI and Ollama executors against test doubles that speak the real wire
//! formats: a stand-in `claude` script emitting `stream-json` lines, and a fake Ollama HTTP
//! server answering `/api/chat` with NDJSON streams and tool calls.
//!
//! Layout: this file holds the shared context builders and process probes; `claude`, `ollama`
//! and `tools` hold each executor's tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::{kinds, Events};
use hub_sidecar::config::Config;
use hub_sidecar::executor::{Attempt, ExecContext, ExecStatus};
use hub_sidecar::process::ChildEnv;
use hub_sidecar::progress::{EventKind, ProgressSink};
use hub_sidecar::task::Task;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

mod claude;
mod ollama;
mod tools;

/// An execution context for `task` in `workspace`, recording every progress event.
fn context(
    task: Value,
    workspace: &Path,
    env: ChildEnv,
    cfg: impl FnOnce(&mut Config),
) -> (ExecContext, Events) {
    let mut config = Config::default();
    config.executor.kill_grace_ms = 200;
    config.executor.claude_retry_delays_ms = vec![10, 10, 10];
    cfg(&mut config);
    let events: Events = Arc::default();
    let seen = events.clone();
    let progress = ProgressSink::with_observer(8192, move |e| seen.lock().unwrap().push(e.clone()));
    let ctx = ExecContext {
        task: Arc::new(Task::from_value(task).unwrap()),
        workspace: workspace.to_path_buf(),
        config: Arc::new(config),
        env,
        progress,
        cancel: CancellationToken::new(),
        remaining_budget_usd: None,
    };
    (ctx, events)
}

fn attempt(prompt: &str) -> Attempt {
    Attempt::new(1, prompt)
}

/// The pid in `marker` is gone (or a zombie) within 1 s.
async fn assert_gone(marker: &Path) {
    let pid: i32 = std::fs::read_to_string(marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for _ in 0..50 {
        if !crate::procfs::is_live(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} survived");
}

/// Wait (bounded) until `path` exists: a signal from a child, not a fixed sleep.
async fn wait_for_file(path: &Path) {
    let until = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
