//! Stopping the real binary: the first signal drains, the second cancels and keeps the task
//! for recovery, the third exits at once; the drain timeout.

use super::*;

/// A shell task that signals it started (a file) and then waits for `go` to exist.
fn gated_task(task_id: &str, dir: &Path) -> (Value, PathBuf, PathBuf) {
    let started = dir.join(format!("{task_id}.started"));
    let go = dir.join(format!("{task_id}.go"));
    let cmd = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo {task_id}-finished",
        started.display(),
        go.display()
    );
    (sample_shell_task(task_id, &cmd), started, go)
}

#[tokio::test]
async fn first_sigterm_drains_refuses_new_work_delivers_the_result_and_exits_0() {
    let s = Harness::setup().await;
    let mut h = s.start_bin("test-token", "", &[]).await;
    let (task, started, go) = gated_task("drain-me", &probe(h.dir()));
    h.assign(task);
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| started.exists(), T).await);

    h.bin().signal("TERM");
    wait_log(h.bin(), "stop requested").await;
    // Busy and draining: a new assignment is never run, and not answered either (the hub's
    // state machine would apply a `task_failed` to the running task: issue 42). A ping
    // round trip later it has been handled.
    h.assign(sample_shell_task("while-draining", "echo never-run"));
    let pings = h.received_of("ping").len();
    h.wait_for_nth("ping", pings + 2, T).await.unwrap();
    assert!(h
        .received()
        .iter()
        .all(|f| f["task_id"] != "while-draining"));

    // The running task finishes; its result is withheld (swallowed) once so the daemon is
    // idle-but-draining for a moment: an assignment now gets sidecar_shutting_down.
    h.set_ack_terminal(false);
    std::fs::write(&go, b"").unwrap();
    h.wait_for(
        |f| f["type"] == "task_complete" && f["task_id"] == "drain-me",
        T,
    )
    .await
    .expect("the drained task's result");
    h.assign(sample_shell_task("after-finish", "echo never-run"));
    h.set_ack_terminal(true);
    let late = h
        .wait_for(
            |f| f["type"] == "task_failed" && f["task_id"] == "after-finish",
            T,
        )
        .await
        .expect("assignment after the task finished refused");
    assert_eq!(late["reason"], "sidecar_shutting_down");

    assert_eq!(
        h.bin_mut().wait(T).await,
        Some(0),
        "exit code after a drain"
    );
    assert_eq!(h.acked_terminal("drain-me"), 1, "result acked once");
    let done = h
        .received_of("task_complete")
        .into_iter()
        .find(|f| f["task_id"] == "drain-me")
        .unwrap();
    assert_eq!(done["result"]["verification_status"], "verified");
    assert!(h
        .received()
        .iter()
        .all(|f| f["task_id"] != "while-draining" || f["type"] != "task_accepted"));
    assert_eq!(close_codes(h.hub()).await, vec![1000], "closed cleanly");
    let state = state_json(h.dir());
    assert_eq!(state["active"], Value::Null);
    assert_eq!(state["outbox"], json!([]));
    h.finish().await;
}

#[tokio::test]
async fn second_signal_cancels_the_task_keeps_it_recovering_and_the_next_start_reports_it() {
    let s = Harness::setup().await;
    let mut h = s.start_bin("test-token", "", &[]).await;
    let sleep = unique_sleep();
    h.assign(sample_shell_task(
        "abort-me",
        &format!("sleep {sleep} | cat; echo never"),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| !procs_with_arg(&sleep).is_empty(), T).await);

    h.bin().signal("TERM");
    wait_log(h.bin(), "stop requested").await;
    h.bin().signal("INT");
    assert_eq!(
        h.bin_mut().wait(T).await,
        Some(0),
        "exit code after a forced stop"
    );
    assert!(
        wait_until(|| procs_with_arg(&sleep).is_empty(), T).await,
        "the task's process group outlived the daemon: {:?}",
        procs_with_arg(&sleep)
    );
    assert_eq!(active_phase(h.dir()).as_deref(), Some("recovering"));
    assert!(h.received_of("task_complete").is_empty());
    assert!(h.received_of("task_failed").is_empty());
    assert_eq!(close_codes(h.hub()).await, vec![1000]);

    // Next start: the hub is asked about the task.
    h.set_recovery_answer("abort-me", RecoveryAnswer::Reassign);
    h.start_bin_again(&[]);
    let rec = h
        .wait_for_type("task_recovering", T)
        .await
        .expect("task_recovering after restart");
    assert_eq!(rec["task_id"], "abort-me");
    assert!(wait_until(|| active_phase(h.dir()).is_none(), T).await);
    h.finish().await;
}

#[tokio::test]
async fn third_signal_exits_at_once() {
    let s = Harness::setup().await;
    // A long kill grace and a task that ignores SIGTERM: the forced stop would wait ~60 s.
    let mut h = s
        .start_bin("test-token", "[executor]\nkill_grace_ms = 60000\n", &[])
        .await;
    let sleep = unique_sleep();
    h.assign(sample_shell_task(
        "stubborn",
        &format!("trap '' TERM; sleep {sleep}"),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| !procs_with_arg(&sleep).is_empty(), T).await);
    h.bin().signal("TERM");
    wait_log(h.bin(), "stop requested").await;
    h.bin().signal("TERM");
    wait_log(h.bin(), "second stop signal").await;
    let t0 = Instant::now();
    h.bin().signal("TERM");
    let code = h.bin_mut().wait(T).await;
    let took = t0.elapsed();
    // The task ignores SIGTERM and was still in its kill grace: it goes with the daemon.
    let gone = wait_until(|| procs_with_arg(&sleep).is_empty(), T).await;
    for pid in procs_with_arg(&sleep) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(gone, "the task's processes outlived an immediate exit");
    assert_eq!(code, Some(130), "third signal exit code");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(h.bin().logs().contains("third stop signal"));
    // The state on disk still names the task: the next start asks the hub.
    assert!(active_phase(h.dir()).is_some());
}

#[tokio::test]
async fn a_small_drain_timeout_cancels_the_task_and_keeps_it_recovering() {
    let s = Harness::setup().await;
    let mut h = s
        .start_bin("test-token", "drain_timeout_secs = 1", &[])
        .await;
    let sleep = unique_sleep();
    h.assign(sample_shell_task("too-slow", &format!("sleep {sleep}")));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| !procs_with_arg(&sleep).is_empty(), T).await);
    h.bin().signal("TERM");
    assert_eq!(h.bin_mut().wait(T).await, Some(0));
    assert!(
        h.bin().logs().contains("drain timeout reached"),
        "{}",
        h.bin().logs()
    );
    assert!(wait_until(|| procs_with_arg(&sleep).is_empty(), T).await);
    assert_eq!(active_phase(h.dir()).as_deref(), Some("recovering"));
    assert!(h.received_of("task_complete").is_empty());
    assert_eq!(close_codes(h.hub()).await, vec![1000]);
    h.finish().await;
}
