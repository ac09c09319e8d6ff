//! A stuck hub: detected, the task paused meanwhile (the hub may have given it to another
//! agent: issue 42), memory stays bounded, the result is delivered once it answers.

use super::*;

#[tokio::test]
async fn a_stuck_hub_is_detected_memory_stays_bounded_and_the_result_is_delivered_after() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        "[progress]\nmin_interval_ms = 50\n",
    );
    let state = dir.path().join("queue.json");
    let mut bin = Bin::start(dir.path(), &config, &[]);
    hub.wait_for_type("identify", T).await.unwrap();
    let pid = bin.pid();
    // ~6 MB of output over ~15 s: longer than the dead link takes to be noticed (a ping a
    // second, 3 s for its pong), so the task is still running when it is paused.
    let cmd = "for i in $(seq 1 60); do seq 1 20000; sleep 0.25; done; echo noisy-done";
    let task = sample_shell_task("stuck", cmd);
    hub.assign(task.clone());
    hub.wait_for(
        |f| f["type"] == "task_progress" && f["task_id"] == "stuck",
        T,
    )
    .await
    .expect("progress flowing");
    let rss_before = rss_kb(pid);
    let conns = hub.connections_total();
    hub.set_stall(true);
    let t0 = Instant::now();
    let mut rss_max = rss_before;
    // The dead link is detected (no pong / write timeout) and a new connection tried.
    let detected = wait_until(
        || {
            rss_max = rss_max.max(rss_kb(pid));
            hub.connections_total() > conns
        },
        T,
    )
    .await;
    assert!(detected, "stuck hub never detected");
    let detect_time = t0.elapsed();
    // Meanwhile the task is paused: nothing of it runs, no result is made.
    assert!(
        wait_until(
            || {
                rss_max = rss_max.max(rss_kb(pid));
                bin.logs().contains("task paused")
            },
            T
        )
        .await,
        "the task was not paused while the hub was stuck:\n{}",
        bin.logs()
    );
    assert!(!outbox_has(&state_json(&state), "stuck"));
    assert!(bin.child.try_wait().unwrap().is_none(), "daemon died");
    hub.set_stall(false);
    // The stuck connection's late close makes the hub re-queue the task (PROTOCOL §8): the
    // paused run is dropped or resumed as the hub answers, and the hub assigns it again.
    let assigns = drive_to_ack(&hub, "stuck", &task, true, Duration::from_secs(60)).await;
    assert!(
        hub.received().iter().any(|f| f["type"] == "task_complete"
            && f["task_id"] == "stuck"
            && f["result"]["output"]
                .as_str()
                .unwrap_or("")
                .contains("noisy-done")),
        "result not delivered after the hub reads again"
    );
    let logs = bin.logs();
    assert!(
        logs.contains("no pong") || logs.contains("did not complete"),
        "dead link not reported in the log:\n{logs}"
    );
    eprintln!(
        "stuck hub: detected after {detect_time:?}; RSS {rss_before} KiB before, max {rss_max} KiB while stuck; {assigns} re-assignment(s)"
    );
    assert!(
        rss_max < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {rss_max} KiB while the hub was stuck"
    );
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    assert_no_violations(&hub);
}
