//! What ends a loop from outside: the cost caps (per task, per day, across a restart), the
//! global deadline, cancellation.

use super::*;

#[tokio::test]
async fn per_task_cost_cap_crossed_on_attempt_two_stops_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 5,
            "metadata": {"max_cost_usd": 0.015},
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.01, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(out.termination_reason, "budget_exhausted");
    assert_eq!(out.attempts.len(), 2);
    assert!((out.cost_usd - 0.02).abs() < 1e-9);
}

#[tokio::test]
async fn shared_daily_cap_stops_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_with(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 5,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
        |c| c.verification.max_cost_usd_per_day = Some(1.0),
    );
    let daily = Arc::new(SpendLedger::in_memory());
    daily.add("another-task", 0.95).await;
    let opts = LoopOptions {
        ledger: Some(daily.clone()),
    };
    let (out, _) = run_llm(&ctx, &opts, 0.1, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    assert_eq!(out.termination_reason, "budget_exhausted");
    assert_eq!(out.attempts.len(), 1);
    assert!((daily.spent_today().await - 1.05).abs() < 1e-9);
}

#[tokio::test]
async fn hanging_check_hits_the_global_deadline_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "verification_timeout_ms": 5000,
        "verification_steps": [
            {"type": "command_succeeds", "target": "sleep 45.4321"},
            {"type": "file_exists", "target": "x"}
        ]}),
    );
    // A heartbeat stand-in: it must keep ticking while the check hangs.
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let t = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let t0 = Instant::now();
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |_, _| {}).await;
    let took = t0.elapsed();
    ticker.abort();
    assert!(took < Duration::from_millis(5500), "took {took:?}");
    let report = &out.attempts[0].report;
    assert_eq!(report.status, ReportStatus::Timeout);
    assert_eq!(report.checks[0].status, CheckStatus::Timeout);
    assert_eq!(report.checks[1].status, CheckStatus::Timeout);
    assert!(
        ticks.load(std::sync::atomic::Ordering::Relaxed) >= 30,
        "runtime was blocked"
    );
    let mut left = procs_with("sleep 45.4321");
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        left = procs_with("sleep 45.4321");
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn cancelled_execution_ends_the_loop_as_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 3,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
    );
    let cancel = ctx.cancel.clone();
    let mut attempter = FnAttempter(move |a: Attempt| {
        let cancel = cancel.clone();
        async move {
            if a.number == 2 {
                cancel.cancel();
                let mut o = ExecOutcome::failed("cancelled");
                o.status = ExecStatus::Cancelled;
                return o;
            }
            ok(0.0)
        }
    });
    let out = retry_loop::run_with(&mut attempter, true, &ctx, &LoopOptions::default()).await;
    assert_eq!(out.termination_reason, "cancelled");
    assert_eq!(out.verification_status, VerificationStatus::ExecutionFailed);
    assert_eq!(out.attempts.len(), 1);
    assert_eq!(out.executions, 2);
}

#[tokio::test]
async fn the_flaky_rerun_stays_within_what_is_left_of_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    // Fails on its first run (0.8 s of a 1 s deadline); it would pass on a second run given
    // the time, but only 0.2 s are left, so the re-run is cut off and the failure stands.
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "verification_timeout_ms": 1000,
            "verification_steps": [{"type": "command_succeeds",
                "target": "echo run >> runs.log; sleep 0.8; [ $(wc -l < runs.log) -ge 2 ]"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, _| {
        std::fs::write(ws.join("work.txt"), "w\n").unwrap();
    })
    .await;
    let check = &out.attempts[0].report.checks[0];
    assert_ne!(check.status, CheckStatus::Pass, "{check:?}");
    assert!(!check.flaky);
    assert_ne!(out.verification_status, VerificationStatus::Verified);
}

#[tokio::test]
async fn an_exhausted_daily_cap_stops_before_the_first_execution() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_with(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 2,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
        |c| c.verification.max_cost_usd_per_day = Some(0.6),
    );
    let ledger = Arc::new(SpendLedger::in_memory());
    ledger.add("earlier-task", 0.6).await;
    let opts = LoopOptions {
        ledger: Some(ledger.clone()),
    };
    let (out, prompts) = run_llm(&ctx, &opts, 1.0, |_, _| {}).await;
    assert!(prompts.is_empty(), "nothing may be spent past the cap");
    assert_eq!(out.executions, 0);
    assert_eq!(out.termination_reason, "budget_exhausted");
    assert_eq!(out.verification_status, VerificationStatus::ExecutionFailed);
    let why = out.last_exec.error.clone().unwrap();
    assert!(why.contains("daily cost cap"), "{why}");
    assert_eq!(ledger.spent_today().await, 0.6);
}

#[tokio::test]
async fn a_killed_run_s_cost_counts_and_the_budget_is_handed_to_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_with(
        dir.path(),
        json!({"description": "x", "metadata": {"max_cost_usd": 2.0},
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
        |c| c.verification.max_cost_usd_per_day = Some(5.0),
    );
    let ledger = Arc::new(SpendLedger::in_memory());
    ledger.add("earlier-task", 3.5).await;
    let seen: Arc<Mutex<Option<Option<f64>>>> = Arc::default();
    struct Killed(Arc<Mutex<Option<Option<f64>>>>);
    impl retry_loop::Attempter for Killed {
        async fn attempt(&mut self, ctx: &ExecContext, _a: Attempt) -> ExecOutcome {
            *self.0.lock().unwrap() = Some(ctx.remaining_budget_usd);
            let mut o = ExecOutcome::failed("claude timed out after 1800 s; killed");
            o.status = ExecStatus::TimedOut;
            o.cost_usd = 0.75; // the executor's estimate for the killed run
            o
        }
    }
    let opts = LoopOptions {
        ledger: Some(ledger.clone()),
    };
    let out = retry_loop::run_with(&mut Killed(seen.clone()), true, &ctx, &opts).await;
    assert_eq!(out.termination_reason, "execution_failed");
    assert!((out.cost_usd - 0.75).abs() < 1e-9);
    assert!((ledger.spent_today().await - 4.25).abs() < 1e-9);
    // min(task: 2.0 - 0, day: 5.0 - 3.5)
    let handed = seen.lock().unwrap().unwrap().unwrap();
    assert!((handed - 1.5).abs() < 1e-9, "{handed}");
}

#[tokio::test]
async fn the_daily_cap_holds_across_a_restart_in_the_middle_of_a_task() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let ledger_path = state.path().join("spend.json");
    let (ctx, _) = ctx_with(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 5,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
        |c| {
            c.verification.max_cost_usd_per_day = Some(0.6);
            c.verification.retry_ceiling = 5;
        },
    );
    // First life: two attempts at $0.25, then the daemon dies during the second attempt's
    // verification (modelled by cancelling: the task stays on disk for task_continue).
    let ledger = Arc::new(SpendLedger::open(ledger_path.clone()).await);
    let opts = LoopOptions {
        ledger: Some(ledger),
    };
    let cancel = ctx.cancel.clone();
    let (out, _) = run_llm(&ctx, &opts, 0.25, move |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
        if k == 2 {
            cancel.cancel();
        }
    })
    .await;
    assert_eq!(out.termination_reason, "cancelled");
    assert_eq!(out.executions, 2);

    // Second life: a fresh ledger from the same file, the task run again (task_continue).
    let ctx2 = ExecContext {
        cancel: tokio_util::sync::CancellationToken::new(),
        ..ctx.clone()
    };
    let ledger = Arc::new(SpendLedger::open(ledger_path).await);
    assert!(
        (ledger.spent_today().await - 0.5).abs() < 1e-9,
        "the day's spend survived"
    );
    let opts = LoopOptions {
        ledger: Some(ledger.clone()),
    };
    let (out, prompts) = run_llm(&ctx2, &opts, 0.25, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    // Attempt 3 runs ($0.50 < $0.60), then the cap stops the loop before attempt 4.
    assert_eq!(prompts.len(), 1, "{prompts:?}");
    assert_eq!(
        out.executions, 3,
        "the task's executions, the first life's included"
    );
    assert_eq!(out.termination_reason, "budget_exhausted");
    assert!((ledger.spent_today().await - 0.75).abs() < 1e-9);
    assert!(
        (out.cost_usd - 0.75).abs() < 1e-9,
        "the task's spend resumed too"
    );
    let runs: Vec<u32> = out.attempts.iter().map(|a| a.report.run_number).collect();
    assert_eq!(
        runs,
        [1, 2, 3],
        "the attempt count and the earlier reports resumed"
    );
}
