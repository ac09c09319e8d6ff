//! Daemon SIGKILL: the real binary killed at random points of a task's life and restarted
//! loses no task.

use super::*;

/// Kill the real binary `n` times at a random point of a task's life and restart it.
async fn survive_daemon_kills(n: usize, seed: u64) {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&hub, dir.path(), "test-token", "");
    let state = dir.path().join("queue.json");
    let mut bin = Bin::start(dir.path(), &config, &[]);
    hub.wait_for_type("identify", T).await.unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut via_recovering, mut via_outbox, mut not_persisted) = (0, 0, 0);
    for i in 0..n {
        let id = format!("kill-{i}");
        let marker = probe(dir.path()).join(format!("started-{i}"));
        let cmd = format!(
            "touch {}; sleep 0.{}; echo out-{i}",
            marker.display(),
            rng.u32(3..9)
        );
        let task = sample_shell_task(&id, &cmd);
        assert!(
            wait_until(|| hub.connected(), T).await,
            "daemon not connected"
        );
        let point = i % 3;
        match point {
            // Before accept: the kill lands while the assignment is in flight.
            0 => {
                hub.assign(task.clone());
                tokio::time::sleep(Duration::from_millis(rng.u64(0..25))).await;
            }
            // During execution.
            1 => {
                hub.assign(task.clone());
                assert!(wait_until(|| marker.exists(), T).await);
                tokio::time::sleep(Duration::from_millis(rng.u64(0..200))).await;
            }
            // After the result was sent, before the hub acknowledged it.
            _ => {
                hub.set_ack_terminal(false);
                hub.assign(task.clone());
                hub.wait_for(|f| f["type"] == "task_complete" && f["task_id"] == id, T)
                    .await
                    .expect("result sent");
            }
        }
        bin.kill9().await;
        hub.set_ack_terminal(true);
        let st = state_json(&state);
        let on_disk_active = active_id(&st).as_deref() == Some(id.as_str());
        let on_disk_outbox = outbox_has(&st, &id);
        // The invariant behind "nothing lost": accepted ⇒ on disk (or already acknowledged).
        if count_of(&hub, "task_accepted", &id) > 0 {
            assert!(
                on_disk_active || on_disk_outbox || hub.acked_terminal(&id) == 1,
                "{id} was accepted but is not in the state file: {st:#}"
            );
        }
        let identifies = hub.received_of("identify").len();
        let recovering_before = count_of(&hub, "task_recovering", &id);
        let terminal_before = terminal_count(&hub, &id);
        bin = Bin::start(dir.path(), &config, &[]);
        hub.wait_for_nth("identify", identifies + 1, T)
            .await
            .expect("re-identify");
        if on_disk_active {
            hub.wait_for(|f| f["type"] == "task_recovering" && f["task_id"] == id, T)
                .await;
            assert!(
                count_of(&hub, "task_recovering", &id) > recovering_before,
                "{id} on disk but no task_recovering"
            );
            // The hub answered (task_reassign) as it recorded the frame; its re-assignment
            // follows on the same connection, in order. (The hub assigning it back *before*
            // answering is a_recovering_task_assigned_again_is_run_not_refused_as_busy.)
            via_recovering += 1;
        } else if on_disk_outbox {
            assert!(
                wait_until(|| terminal_count(&hub, &id) > terminal_before, T).await,
                "{id} in the outbox but not re-sent after restart"
            );
            assert!(wait_until(|| !outbox_has(&state_json(&state), &id), T).await);
            via_outbox += 1;
        } else {
            not_persisted += 1;
        }
        // The hub re-queued the task when the socket dropped (generation + 1): it assigns
        // the new generation and the task must then complete, acknowledged once.
        drive_to_ack(&hub, &id, &task, true, Duration::from_secs(60)).await;
    }
    settle(&hub).await;
    for i in 0..n {
        let id = format!("kill-{i}");
        assert_eq!(hub.acked_terminal(&id), 1, "{id}:\n{}", dump(&hub, &id));
    }
    eprintln!(
        "daemon SIGKILL: {n} kills survived ({via_recovering} via task_recovering, {via_outbox} re-sent from the outbox, {not_persisted} killed before the task reached the disk), 0 lost"
    );
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    assert_no_violations(&hub);
}

#[tokio::test]
async fn sigkill_at_random_points_loses_no_task() {
    survive_daemon_kills(8, 0x5161).await;
}

#[tokio::test]
#[ignore = "long: scripts/soak.sh"]
async fn long_sigkill_at_random_points_loses_no_task() {
    survive_daemon_kills(20, 0x9161).await;
}
