//! After a SIGKILL of the real binary mid-task: what the hub answers about the task found on
//! disk, and what runs (issue 39: a generation the sidecar did not accept is never run).
//! The fleet view of the same, with two agents, is in `fleet.rs`.

use hub_sidecar::mock_hub::{sample_shell_task, MockTaskState, RecoveryAnswer};

use crate::harness::Harness;
use crate::util::*;

/// Kill the real binary mid-task; on restart the task is reported with `task_recovering`.
/// `hub_too`: the hub is killed first (its task table kept, so it still holds the task for
/// this agent at the same generation), and restarted before the daemon; else the hub sees
/// the disconnect and re-queues the task (generation + 1).
async fn kill_mid_task_then_restart(answer: Option<RecoveryAnswer>, hub_too: bool) -> Harness {
    let mut h = Harness::setup()
        .await
        .start_bin("test-token", "", &[])
        .await;
    let marker = h.probe().join("runs");
    let cmd = format!(
        "echo run >> {}; sleep 2; echo recovered-output",
        marker.display()
    );
    h.assign(sample_shell_task("crash-me", &cmd));
    h.accepted("crash-me").await;
    assert!(wait_until(|| marker.exists(), T).await);
    if hub_too {
        h.stop().await;
    }
    h.bin_mut().kill9().await;
    if hub_too {
        h.restart().await.unwrap();
    }
    if let Some(answer) = answer {
        h.set_recovery_answer("crash-me", answer);
    }
    h.start_bin_again(&[]);
    let rec = h.frame("task_recovering", "crash-me").await;
    assert_eq!(rec["task_id"], "crash-me");
    h
}

#[tokio::test]
async fn after_sigkill_with_the_hub_killed_too_task_continue_at_the_same_generation_reruns_the_task(
) {
    // The only `task_continue` that is the task's own: a hub killed outright kept it.
    let h = kill_mid_task_then_restart(None, true).await;
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("re-run completes");
    assert_eq!(done["task_id"], "crash-me");
    assert_eq!(done["generation"], 1);
    assert!(done["result"]["output"]
        .as_str()
        .unwrap()
        .contains("recovered-output"));
    let runs = std::fs::read_to_string(h.probe().join("runs")).unwrap();
    assert_eq!(
        runs.lines().count(),
        2,
        "ran once before the kill and once after"
    );
    h.finish().await;
}

#[tokio::test]
async fn after_sigkill_a_continue_at_a_new_generation_runs_the_task_only_once_the_hub_says_it_is_ours(
) {
    let mut h = Harness::setup()
        .await
        .start_bin("test-token", "", &[])
        .await;
    let runs = h.probe().join("runs");
    let cmd = format!("echo run >> {}; sleep 1; echo done", runs.display());
    h.assign(sample_shell_task("given-back", &cmd));
    assert!(wait_until(|| runs.exists(), T).await);
    h.bin_mut().kill9().await;
    // The hub re-queues it on the disconnect (generation 2) and gives it back to this agent
    // while it is down: that `task_assign` is lost. Its table holds the task for this agent
    // at a generation the sidecar never saw.
    assert!(
        wait_until(
            || h.task("given-back").unwrap().state == MockTaskState::Queued,
            T
        )
        .await
    );
    let mut again = sample_shell_task("given-back", &cmd);
    again.as_object_mut().unwrap().remove("generation");
    h.assign(again);
    h.start_bin_again(&[]);
    // `task_continue` carries generation 2, not the 1 on disk: not adopted, but asked about.
    let report = h.frame("state_report", "given-back").await;
    assert_eq!(
        (report["generation"].as_u64(), report["status"].as_str()),
        (Some(2), Some("dropped"))
    );
    // The hub's answer (`continue`: its table holds it for this agent at 2) makes it that
    // assignment: accepted, so the hub is not left waiting, and run once more.
    let done = h.completed("given-back").await;
    assert_eq!(done["generation"], 2);
    assert_eq!(h.task("given-back").unwrap().state, MockTaskState::Complete);
    let runs = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(
        runs.lines().count(),
        2,
        "once cut short by the kill, once after"
    );
    h.finish().await;
}

#[tokio::test]
async fn after_sigkill_task_reassign_drops_the_task() {
    let h = kill_mid_task_then_restart(Some(RecoveryAnswer::Reassign), false).await;
    let state = h.dir().join("queue.json");
    assert!(
        wait_until(
            || hub_sidecar::state::read_state(&state)
                .map(|s| s.active.is_none())
                .unwrap_or(false),
            T
        )
        .await,
        "reassigned task not dropped from state"
    );
    // Still usable, and nothing was reported for the dropped task.
    h.assign(sample_shell_task("next", "echo next"));
    h.wait_for_type("task_complete", T).await.unwrap();
    assert!(h
        .received()
        .iter()
        .all(|f| f["task_id"] != "crash-me" || f["type"] != "task_complete"));
    h.finish().await;
}
