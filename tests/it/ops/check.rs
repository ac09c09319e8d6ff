//! `hub-sidecar check` beside a running daemon (issue 44): the hub line is the daemon's
//! own link, and `check` never identifies as the daemon's agent, which would make the hub
//! reclaim the daemon's running task (PROTOCOL.md §8; the mock hub reclaims an agent's
//! tasks when any identified connection of that agent closes, as the hub does when the
//! replaced connection closes).

use super::subcommands::run_bin;
use super::*;
use hub_sidecar::mock_hub::MockTaskState;

/// Against a daemon running a task the hub scheduled: `check` reports the daemon's link
/// and containment from its status socket, identifies nothing, and the task completes at
/// its first generation, run once. Run as root and as the unprivileged user
/// (`scripts/test-unprivileged.sh check_beside`): as a non-root user the daemon admits
/// `check` only if `check` asked before it went non-dumpable.
#[tokio::test]
async fn check_beside_a_running_daemon_reports_its_link_and_leaves_its_task_alone() {
    let s = Harness::setup().await;
    let h = s.start_bin("test-token", "", &[]).await;
    let started = h.probe().join("busy.started");
    let go = h.probe().join("busy.go");
    let runs = h.probe().join("busy.runs");
    let cmd = format!(
        "echo run >> {runs}; touch {started}; while [ ! -e {go} ]; do sleep 0.05; done; echo done",
        runs = runs.display(),
        started = started.display(),
        go = go.display()
    );
    let task_id = h.submit(sample_shell_task("busy", &cmd));
    h.accepted(&task_id).await;
    assert!(wait_until(|| started.exists(), T).await, "the task started");

    let config = h.dir().join("hub-sidecar.toml");
    let (code, out, err) = run_bin(&["check", "--config", config.to_str().unwrap()], &[]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let hub_line = out
        .lines()
        .find(|l| l.contains("✓ hub"))
        .unwrap_or_else(|| panic!("no passing hub line:\n{out}\n{}", h.bin().logs()));
    assert!(
        hub_line.contains("the running daemon's link is connected since")
            && hub_line.contains("last frame")
            && hub_line.contains("check did not identify"),
        "{hub_line}"
    );
    assert!(
        out.contains("the running daemon (its answer counts) runs tasks strict"),
        "the daemon's own containment answer is shown:\n{out}\n{}",
        h.bin().logs()
    );
    assert!(
        !h.bin().logs().contains("peer refused"),
        "the daemon refused check:\n{}",
        h.bin().logs()
    );
    assert_eq!(
        h.received_of("identify").len(),
        1,
        "only the daemon identified: check did not"
    );

    std::fs::write(&go, b"").unwrap();
    let done = h.completed(&task_id).await;
    assert_eq!(done["generation"], 1, "completed at its first generation");
    let row = h.task(&task_id).expect("the hub's row");
    assert_eq!(
        (row.generation, row.state),
        (1, MockTaskState::Complete),
        "never reclaimed"
    );
    assert_eq!(h.received_of("task_accepted").len(), 1, "accepted once");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "the task ran once"
    );
    h.finish().await;
}
