//! The real hub after its own restart (PROTOCOL.md § 8): its AgentFSM waits in `assigned`
//! for a task it still holds for this agent, and only `task_accepted` moves it on. So after
//! `identified` the daemon sends `task_accepted` for a task whose result waits in the
//! outbox before re-sending it; a task that was running is paused by the drop (issue 42)
//! and accepted again once the hub answers its `state_report` with `continue`, well inside
//! the state machine's 60 s.

use hub_sidecar::mock_hub::{sample_shell_task, MockHub};
use serde_json::{json, Value};

use crate::harness::Harness;
use crate::util::*;

/// Inbound frames after the `n`-th identify (1-based), as `(type, task_id)`.
fn after_identify(hub: &MockHub, n: usize) -> Vec<(String, String)> {
    let frames = hub.received();
    let start = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| f["type"] == "identify")
        .nth(n - 1)
        .map(|(i, _)| i)
        .expect("identify");
    frames[start + 1..]
        .iter()
        .map(|f: &Value| {
            (
                f["type"].as_str().unwrap_or_default().to_string(),
                f["task_id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn position(frames: &[(String, String)], ty: &str, id: &str) -> Option<usize> {
    frames.iter().position(|(t, i)| t == ty && i == id)
}

#[tokio::test]
async fn after_a_hub_restart_a_running_task_is_accepted_again_once_its_state_report_says_continue()
{
    let mut h = Harness::start().await;
    let marker = probe(h.dir()).join("started");
    h.assign(sample_shell_task(
        "long",
        &format!("touch {}; sleep 30", marker.display()),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| marker.exists(), T).await);
    h.stop().await;
    h.restart().await.unwrap();
    h.identified_nth(2).await;
    h.wait_for(|f| f["type"] == "state_report", T)
        .await
        .expect("state_report");
    h.wait_for_nth("task_accepted", 2, T)
        .await
        .expect("no task_accepted after the answer");
    let frames = after_identify(h.hub(), 2);
    let accepted =
        position(&frames, "task_accepted", "long").expect("no task_accepted after re-identify");
    let report = position(&frames, "state_report", "long").unwrap();
    assert!(
        report < accepted,
        "a paused task is accepted only after the hub's answer: {frames:?}"
    );
    assert!(
        h.received()
            .iter()
            .any(|f| f["type"] == "state_report" && f["status"] == "paused"),
        "the report does not say paused"
    );
    h.push(json!({"type": "task_cancelled", "task_id": "long", "timestamp": 1}));
    h.stop_daemon().await;
}

#[tokio::test]
async fn after_a_hub_restart_an_outboxed_result_is_accepted_again_before_it_is_resent() {
    let h = Harness::start().await;
    h.set_ack_terminal(false);
    h.assign(sample_shell_task("quick", "echo done"));
    h.wait_for_type("task_complete", T).await.unwrap();
    h.stop().await;
    h.set_ack_terminal(true);
    h.restart().await.unwrap();
    h.identified_nth(2).await;
    h.wait_for_nth("task_complete", 2, T)
        .await
        .expect("result re-sent");
    let frames = after_identify(h.hub(), 2);
    let accepted =
        position(&frames, "task_accepted", "quick").expect("no task_accepted after re-identify");
    let resent = position(&frames, "task_complete", "quick").unwrap();
    assert!(
        accepted < resent,
        "task_accepted must come first: {frames:?}"
    );
    assert!(wait_until(|| h.acked_terminal("quick") >= 1, T).await);
    h.finish().await;
}
