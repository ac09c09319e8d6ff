//! The fuzzing check for one inbound text frame, shared by the cargo-fuzz target
//! (`fuzz_targets/frames.rs`) and the stable fallback (`examples/fuzz_frames.rs`), which both
//! include this file with `#[path]`: `Inbound::parse` on any text, `Task::from_value` on any
//! JSON, and what the link and daemon do with a parsed frame (budget arithmetic on the hub's
//! numbers, executor choice, the workspace path derived from `task_id`, the answer frame).
//! Any panic is a finding.

use std::path::{Component, Path};
use std::time::Duration;

use hub_sidecar::hub::budget::RateBudget;
use hub_sidecar::hub::proto::{Inbound, Outbound};
use hub_sidecar::task::Task;
use serde_json::Value;

/// What the link and daemon do with one inbound text frame, minus the socket.
pub(crate) fn check(text: &str) {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        let _ = Task::from_value(v);
    }
    let Ok(frame) = Inbound::parse(text) else {
        return;
    };
    let budget = RateBudget::new(60, 60, 12);
    match frame {
        Inbound::RateLimited { retry_after_ms, .. } => {
            budget.on_rate_limited(Duration::from_millis(retry_after_ms));
            let _ = budget.try_lifecycle();
        }
        Inbound::RateLimitWarning { remaining, .. } => budget.on_warning(remaining),
        Inbound::TaskAssign(task) => {
            let _ = task.executor_kind();
            let _ = task.retry_budget();
            let cfg =
                hub_sidecar::config::Config::for_hub("ws://127.0.0.1:1/ws", Path::new("/state"));
            let ws = hub_sidecar::workspace::workspace_for(&cfg, &task);
            assert!(ws.starts_with("/state/work"), "{ws:?}");
            assert!(
                ws.components().all(|c| !matches!(c, Component::ParentDir)),
                "{ws:?}"
            );
            let answer = Outbound::task_failed(&task.task_id, task.generation, "sidecar_busy");
            assert!(answer.to_text().starts_with('{'));
            let text = serde_json::to_string(&task).expect("a parsed task serialises");
            let back: Task = serde_json::from_str(&text).expect("a serialised task parses back");
            assert_eq!(back.task_id, task.task_id);
        }
        _ => {}
    }
}
