//! The real rate budget: a noisy task at the hub's real budget is never rate limited.

use super::*;

#[tokio::test]
async fn a_noisy_task_at_the_real_hub_budget_is_never_rate_limited() {
    // The hub's limiter at its defaults (60/min normal, bucket of 60).
    let s = Harness::setup().await;
    let mut c = s.cfg();
    // Progress as eager as it can be: only the budget mirror holds it back.
    c.progress.min_interval_ms = 50;
    let h = s.start(c).await;
    // ~8–10 s, a chunk every ~50 ms: the bucket is spent down to the reserve within ~3 s,
    // then progress must live on the refill (1/s).
    let noisy = "for i in $(seq 1 150); do seq 1 5000; sleep 0.03; done; echo loud-done";
    h.assign(sample_shell_task("loud", noisy));
    let done = h
        .wait_for(
            |f| f["type"] == "task_complete" && f["task_id"] == "loud",
            T * 2,
        )
        .await
        .expect("noisy task completes");
    assert!(done["result"]["output"]
        .as_str()
        .unwrap()
        .contains("loud-done"));
    // Right after, with the bucket at its reserve: the next task's lifecycle still fits.
    h.assign(sample_shell_task("after-loud", "echo quiet"));
    h.wait_for(
        |f| f["type"] == "task_complete" && f["task_id"] == "after-loud",
        T,
    )
    .await
    .expect("second task completes");
    assert!(
        wait_until(
            || h.acked_terminal("loud") == 1 && h.acked_terminal("after-loud") == 1,
            T
        )
        .await
    );
    let progress = count_of(h.hub(), "task_progress", "loud");
    // The budget was the binding constraint: replay the hub's normal-tier bucket (60, refill
    // 1/s) over what it received; it came down to the reserve and never below zero.
    let mut tokens = 60.0f64;
    let mut min_tokens = tokens;
    let mut last: Option<Instant> = None;
    for f in h.frames().iter().filter(|f| {
        f.inbound && !matches!(f.frame["type"].as_str(), Some("identify" | "ping") | None)
    }) {
        if let Some(l) = last {
            tokens = (tokens + f.at.duration_since(l).as_secs_f64()).min(60.0);
        }
        last = Some(f.at);
        tokens -= 1.0;
        min_tokens = min_tokens.min(tokens);
    }
    eprintln!(
        "rate budget: {progress} progress frames, the hub's bucket down to {min_tokens:.1} of 60, {} rate_limited",
        h.rate_limited_count()
    );
    assert_eq!(h.rate_limited_count(), 0, "the hub rate-limited us");
    assert!(
        progress >= 48,
        "only {progress} progress frames: the budget above the reserve was never spent"
    );
    assert!(
        min_tokens < 14.5,
        "the hub's bucket stayed at {min_tokens:.1}: the reserve was never reached"
    );
    assert_eq!(count_of(h.hub(), "task_accepted", "loud"), 1);
    assert_eq!(count_of(h.hub(), "task_accepted", "after-loud"), 1);
    h.finish().await;
}
