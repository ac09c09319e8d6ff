//! Hub restarts: tasks keep running while the mock hub crashes at random moments, and no
//! result is lost or delivered twice.

use super::*;

/// `tasks` tasks in a row while the hub crashes (`stop()`: task table kept, nothing
/// re-queued) and comes back at random moments, `restarts` times.
async fn survive_hub_restarts(tasks: usize, restarts: u32, seed: u64) {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let d = spawn(cfg(&hub, dir.path()));
    hub.wait_for_type("identify", T).await.unwrap();
    let chaos = tokio::spawn({
        let hub = hub.clone();
        async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            for _ in 0..restarts {
                // The sleeps are the fault: a crash at a random moment of a task's life.
                tokio::time::sleep(Duration::from_millis(rng.u64(150..1200))).await;
                hub.stop().await;
                tokio::time::sleep(Duration::from_millis(rng.u64(20..600))).await;
                hub.restart().await.unwrap();
            }
        }
    });
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut assigns = 0;
    let t0 = Instant::now();
    for i in 0..tasks {
        let id = format!("restart-{i}");
        let cmd = format!("sleep 0.{}; echo out-{i}", rng.u32(0..4));
        assigns += drive_to_ack(
            &hub,
            &id,
            &sample_shell_task(&id, &cmd),
            false,
            Duration::from_secs(90),
        )
        .await;
    }
    chaos.await.unwrap();
    // One more task after the last restart: the link works.
    drive_to_ack(
        &hub,
        "after-chaos",
        &sample_shell_task("after-chaos", "echo ok"),
        false,
        T * 2,
    )
    .await;
    settle(&hub).await;
    for i in 0..tasks {
        let id = format!("restart-{i}");
        assert_eq!(
            hub.acked_terminal(&id),
            1,
            "{id} acked ≠ once:\n{}",
            dump(&hub, &id)
        );
        assert_eq!(hub.task(&id).unwrap().state, MockTaskState::Complete);
    }
    // Tasks whose acceptance and acknowledged result went over different connections:
    // a crash hit them in flight.
    let frames = hub.frames();
    let conn_of = |ty: &str, id: &str| {
        frames
            .iter()
            .rev()
            .find(|f| f.frame["type"] == ty && f.frame["task_id"] == id)
            .map(|f| f.conn)
    };
    let crossed = (0..tasks)
        .map(|i| format!("restart-{i}"))
        .filter(|id| conn_of("task_accepted", id) != conn_of("task_ack", id))
        .count();
    eprintln!(
        "hub restarts: {restarts} restarts survived, {tasks} tasks ({crossed} hit in flight), {assigns} assignments, 0 lost, 0 double-acked, {:?}",
        t0.elapsed()
    );
    d.stop().await;
    assert_no_violations(&hub);
}

#[tokio::test]
async fn hub_crashes_at_random_moments_lose_no_result() {
    survive_hub_restarts(20, 8, 0xC0FFEE).await;
}

#[tokio::test]
#[ignore = "long: scripts/soak.sh"]
async fn long_hub_crashes_at_random_moments_lose_no_result() {
    survive_hub_restarts(40, 20, 0xBADC0DE).await;
}
