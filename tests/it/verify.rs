//! The verification loop end to end: real workspaces in temp dirs, real check commands, a
//! real shell executor, an attempt closure standing in for an LLM (it edits real files), and
//! a fake Ollama HTTP server on 127.0.0.1:0 for `llm_judge`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::procfs::procs_with;
use crate::util::{kinds, Events};
use hub_sidecar::config::Config;
use hub_sidecar::executor::{Attempt, ExecContext, ExecOutcome, ExecStatus, Executor};
use hub_sidecar::process::ChildEnv;
use hub_sidecar::progress::{EventKind, ProgressSink};
use hub_sidecar::spend::SpendLedger;
use hub_sidecar::task::Task;
use hub_sidecar::verify::report::{CheckStatus, ReportStatus};
use hub_sidecar::verify::retry_loop::{self, FnAttempter, LoopOptions, LoopOutcome};
use hub_sidecar::verify::VerificationStatus;
use serde_json::{json, Value};

/// A context over `ws` for `task` (task_id filled in), recording every progress event.
fn ctx_with(ws: &Path, mut task: Value, tweak: impl FnOnce(&mut Config)) -> (ExecContext, Events) {
    task["task_id"] = json!("t-it-verify");
    let events: Events = Arc::default();
    let ev = events.clone();
    let mut cfg = Config::for_hub("ws://127.0.0.1:1/ws", ws);
    tweak(&mut cfg);
    let ctx = ExecContext {
        task: Arc::new(Task::from_value(task).unwrap()),
        workspace: ws.to_path_buf(),
        config: Arc::new(cfg),
        env: ChildEnv::inherit(),
        progress: ProgressSink::with_observer(8192, move |e| ev.lock().unwrap().push(e.clone())),
        cancel: tokio_util::sync::CancellationToken::new(),
        remaining_budget_usd: None,
    };
    (ctx, events)
}

fn ctx_for(ws: &Path, task: Value) -> (ExecContext, Events) {
    ctx_with(ws, task, |_| {})
}

/// A successful execution costing `cost_usd`.
fn ok(cost_usd: f64) -> ExecOutcome {
    let mut o = ExecOutcome::failed("");
    o.status = ExecStatus::Succeeded;
    o.error = None;
    o.output = "done".into();
    o.tokens_in = 10;
    o.tokens_out = 5;
    o.cost_usd = cost_usd;
    o.execution_ms = 1;
    o
}

/// Run the loop as an LLM executor whose attempt `k` calls `edit(workspace, k)`.
/// Returns the outcome and the prompts the "LLM" received.
async fn run_llm(
    ctx: &ExecContext,
    opts: &LoopOptions,
    cost_usd: f64,
    edit: impl Fn(&Path, u32) + Clone + 'static,
) -> (LoopOutcome, Vec<String>) {
    let prompts: Arc<Mutex<Vec<String>>> = Arc::default();
    let p = prompts.clone();
    let ws: PathBuf = ctx.workspace.clone();
    let mut attempter = FnAttempter(move |a: Attempt| {
        p.lock().unwrap().push(a.prompt.clone());
        let ws = ws.clone();
        let edit = edit.clone();
        async move {
            edit(&ws, a.number);
            ok(cost_usd)
        }
    });
    let out = retry_loop::run_with(&mut attempter, true, ctx, opts).await;
    let prompts = prompts.lock().unwrap().clone();
    (out, prompts)
}

#[tokio::test]
async fn fails_then_fixed_on_second_attempt_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, events) = ctx_for(
        dir.path(),
        json!({"description": "Create a.txt and make b.txt say fixed",
        "success_criteria": ["b.txt says fixed"],
        "max_verification_retries": 3,
        "verification_steps": [
            {"type": "file_exists", "target": "a.txt"},
            {"type": "command_succeeds", "target": "grep -q fixed b.txt"}
        ]}),
    );
    let (out, prompts) = run_llm(&ctx, &LoopOptions::default(), 0.01, |ws, k| {
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        std::fs::write(
            ws.join("b.txt"),
            if k == 1 { "broken\n" } else { "fixed\n" },
        )
        .unwrap();
    })
    .await;
    assert_eq!(out.verification_status, VerificationStatus::Verified);
    assert_eq!(out.termination_reason, "verified");
    let runs: Vec<u32> = out.attempts.iter().map(|a| a.report.run_number).collect();
    assert_eq!(runs, vec![1, 2]);
    let done = kinds(&events, EventKind::VerificationRetryComplete);
    let running: Vec<f64> = done
        .iter()
        .map(|e| e.fields["cost_usd_so_far"].as_f64().unwrap())
        .collect();
    assert!(
        (running[0] - 0.01).abs() < 1e-9 && (running[1] - 0.02).abs() < 1e-9,
        "{running:?}"
    );
    assert_eq!(out.attempts[0].report.status, ReportStatus::Fail);
    assert_eq!(out.attempts[1].report.status, ReportStatus::Pass);
    assert_eq!((out.tokens_in, out.tokens_out), (20, 10));
    assert!((out.cost_usd - 0.02).abs() < 1e-9);
    // First prompt: task, criteria, completion criteria, plan instruction.
    assert!(
        prompts[0].contains("Create a.txt")
            && prompts[0].contains("- command_succeeds: grep -q fixed b.txt")
    );
    assert!(prompts[0].contains("Plan your approach"));
    // Corrective prompt: failed check, passed check, observations, original task.
    let p = &prompts[1];
    assert!(p.starts_with("VERIFICATION RETRY 1/3"), "{p}");
    assert!(
        p.contains("type: command_succeeds | target: grep -q fixed b.txt | status: fail"),
        "{p}"
    );
    assert!(
        p.contains("PASSED CHECKS (keep these passing):\n- file_exists: a.txt"),
        "{p}"
    );
    assert!(p.contains("- added: b.txt (+1 lines)"), "{p}");
    assert!(p.contains("ORIGINAL TASK:\nCreate a.txt"), "{p}");
    assert!(p.contains("YOUR PREVIOUS OUTPUT:\ndone"), "{p}");
    let starts = kinds(&events, EventKind::VerificationRetryStart);
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].fields["attempt"], 1, "the first retry is retry 1");
    assert_eq!(starts[0].fields["max_retries"], 3);
    let results = kinds(&events, EventKind::VerificationCheckResult);
    assert_eq!(results.len(), 4);
    assert_eq!(results[1].fields["check_status"], "fail");
    assert_eq!(results[3].fields["attempt"], 2);
    let done = kinds(&events, EventKind::VerificationRetryComplete);
    assert_eq!(done.len(), 2);
    assert_eq!(done[1].fields["status"], "pass");
    assert_eq!(done[0].fields["passed"], 1);
    assert_eq!(done[0].fields["failed"], 1);
    // The history serialises as §7 reports plus observations.
    let v = serde_json::to_value(&out.attempts[0]).unwrap();
    assert_eq!(v["run_number"], 1);
    assert_eq!(v["checks"][1]["type"], "command_succeeds");
    assert!(v["observations"].is_array());
}

#[tokio::test]
async fn retries_exhausted_gives_partial_pass_with_n_plus_one_reports() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 2,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
    );
    let (out, prompts) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(out.termination_reason, "retries_exhausted");
    assert_eq!(out.attempts.len(), 3);
    assert_eq!(prompts.len(), 3);
    assert!(prompts[2].starts_with("VERIFICATION RETRY 2/2"));
    assert!(
        prompts[2].contains("- attempt 1: 0 passed"),
        "{}",
        prompts[2]
    );
}

#[tokio::test]
async fn retry_cap_of_five_holds_for_a_task_asking_nine() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_with(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 9,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
        |c| c.verification.retry_ceiling = 9,
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    assert_eq!(out.termination_reason, "retries_exhausted");
    assert_eq!(out.attempts.len(), 6);
    assert_eq!(out.executions, 6);
}

#[tokio::test]
async fn the_default_local_retry_ceiling_caps_what_the_hub_fills_in() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 5,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
    );
    assert_eq!(
        ctx.config.verification.retry_ceiling,
        hub_sidecar::config::DEFAULT_RETRY_CEILING
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    assert_eq!(out.termination_reason, "retries_exhausted");
    assert_eq!(
        out.executions,
        hub_sidecar::config::DEFAULT_RETRY_CEILING + 1
    );
}

#[tokio::test]
async fn unchanged_workspace_with_same_failure_stops_for_no_progress() {
    let dir = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("git")
        .arg("-C")
        .arg(dir.path())
        .args(["init", "-q"])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 5,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |_, _| {}).await;
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(out.termination_reason, "no_progress");
    assert_eq!(out.attempts.len(), 2);
    assert_eq!(
        out.attempts[1].observations,
        vec!["workspace unchanged".to_string()]
    );
}

#[tokio::test]
async fn a_check_passing_only_on_rerun_is_partial_pass_flaky_never_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, events) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 3,
            "verification_steps": [{"type": "command_succeeds",
                "target": "n=$(cat counter 2>/dev/null || echo 0); echo $((n+1)) > counter; [ \"$n\" -ge 1 ]"}]}),
    );
    let (out, prompts) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, _| {
        std::fs::write(ws.join("work.txt"), "w\n").unwrap();
    })
    .await;
    // The check's first run created what its second run looks for: not verified work.
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(out.termination_reason, "flaky");
    assert_eq!(out.flaky_checks.len(), 1);
    assert!(out.flaky_checks[0].starts_with("command_succeeds "));
    let result = hub_sidecar::runner::result_json(&out);
    assert_eq!(result["status"], "partial");
    assert_eq!(result["flaky_checks"], json!(out.flaky_checks));
    assert_eq!(prompts.len(), 1, "no corrective prompt");
    let check = &out.attempts[0].report.checks[0];
    assert_eq!(check.status, CheckStatus::Pass);
    assert!(check.flaky);
    assert_eq!(out.attempts[0].report.status, ReportStatus::Pass);
    let v = serde_json::to_value(check).unwrap();
    assert_eq!(v["flaky"], true);
    assert!(kinds(&events, EventKind::Status)
        .iter()
        .any(|e| e.text.contains("flaky")));
}

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
async fn oscillating_failures_are_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, events) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 2,
            "verification_steps": [{"type": "command_succeeds", "target": "cat f; false"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, k| {
        std::fs::write(
            ws.join("f"),
            if k % 2 == 1 {
                "variant A\n"
            } else {
                "variant B\n"
            },
        )
        .unwrap();
    })
    .await;
    assert_eq!(out.attempts.len(), 3);
    assert!(out.oscillation);
    assert!(kinds(&events, EventKind::Status)
        .iter()
        .any(|e| e.text.contains("oscillation")));
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
async fn shell_executor_runs_once_and_is_never_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, events) = ctx_for(
        dir.path(),
        json!({"description": "make out.txt",
        "routing_decision": {"target_type": "sidecar"},
        "metadata": {"shell_command": "echo run >> out.txt"},
        "max_verification_retries": 3,
        "verification_steps": [
            {"type": "file_exists", "target": "out.txt"},
            {"type": "file_exists", "target": "missing.txt"}
        ]}),
    );
    let mut exec = Executor::for_task(&ctx).unwrap();
    assert!(!exec.is_llm());
    let out = retry_loop::run(&mut exec, &ctx).await;
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(out.termination_reason, "retries_exhausted");
    assert_eq!(out.attempts.len(), 1);
    assert_eq!(out.executions, 1);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "run\n"
    );
    assert!(kinds(&events, EventKind::VerificationRetryStart).is_empty());

    // A passing shell task is verified; a failing one is execution_failed with no report.
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "ok", "routing_decision": {"target_type": "sidecar"},
            "metadata": {"shell_command": "true"},
            "verification_steps": [{"type": "file_exists", "target": "out.txt"}]}),
    );
    let mut exec = Executor::for_task(&ctx).unwrap();
    let out = retry_loop::run(&mut exec, &ctx).await;
    assert_eq!(out.verification_status, VerificationStatus::Verified);
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "bad", "routing_decision": {"target_type": "sidecar"},
            "metadata": {"shell_command": "exit 4"},
            "verification_steps": [{"type": "file_exists", "target": "out.txt"}]}),
    );
    let mut exec = Executor::for_task(&ctx).unwrap();
    let out = retry_loop::run(&mut exec, &ctx).await;
    assert_eq!(out.verification_status, VerificationStatus::ExecutionFailed);
    assert_eq!(out.termination_reason, "execution_failed");
    assert!(out.attempts.is_empty());
}

/// One LLM attempt (writing hello.txt unless `change` is false) judged by a fake answering
/// `content`. Returns the judge check and the requests the fake saw.
async fn judged(
    content: &str,
    change: bool,
) -> (hub_sidecar::verify::report::CheckResult, Vec<Value>) {
    let fake = crate::fakes::FakeOllama::answering(content, 4).await;
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "Write a greeting file",
            "success_criteria": ["hello.txt greets the reader"],
            "routing_decision": {"selected_endpoint": fake.addr.to_string(), "selected_model": "judge-m"},
            "verification_steps": [{"type": "llm_judge", "target": "hello.txt exists and greets"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, move |ws, _| {
        if change {
            std::fs::write(ws.join("hello.txt"), "SECRET-CONTENT-XYZ hello\n").unwrap();
        }
    })
    .await;
    let check = out.attempts[0].report.checks[0].clone();
    let reqs = fake.requests();
    (check, reqs)
}

#[tokio::test]
async fn llm_judge_passes_on_a_confident_match_and_sees_only_observations() {
    let (check, reqs) = judged(
        r#"{"match": true, "confidence": 0.95, "reason": "file added"}"#,
        true,
    )
    .await;
    assert_eq!(check.status, CheckStatus::Pass, "{check:?}");
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r["stream"], false);
    assert_eq!(r["format"], "json");
    assert_eq!(r["model"], "judge-m");
    let text = r.to_string();
    assert!(text.contains("Write a greeting file"));
    assert!(text.contains("hello.txt greets the reader"));
    assert!(text.contains("hello.txt exists and greets"));
    assert!(text.contains("added: hello.txt (+1 lines)"));
    assert!(
        !text.contains("SECRET-CONTENT-XYZ"),
        "the judge must never see the repo"
    );
}

#[tokio::test]
async fn llm_judge_fails_on_low_confidence() {
    let (check, _) = judged(
        r#"{"match": true, "confidence": 0.5, "reason": "maybe"}"#,
        true,
    )
    .await;
    assert_eq!(check.status, CheckStatus::Fail);
}

#[tokio::test]
async fn llm_judge_mismatch_fails_whatever_the_reason_says() {
    let (check, _) = judged(
        r#"```json
{"match": false, "confidence": 0.99, "reason": "the task was completed successfully"}
```"#,
        true,
    )
    .await;
    assert_eq!(check.status, CheckStatus::Fail);
}

#[tokio::test]
async fn llm_judge_invalid_json_fails() {
    let (check, _) = judged("I think it is fine!", true).await;
    assert_eq!(check.status, CheckStatus::Fail);
    assert_eq!(check.output, "judge returned no valid verdict");
}

#[tokio::test]
async fn llm_judge_unchanged_workspace_fails_without_asking() {
    let (check, reqs) = judged(
        r#"{"match": true, "confidence": 1.0, "reason": "x"}"#,
        false,
    )
    .await;
    assert_eq!(check.status, CheckStatus::Fail);
    assert!(check.output.contains("workspace unchanged"));
    assert!(reqs.is_empty(), "the fake saw a request");
}

#[tokio::test]
async fn llm_judge_is_not_asked_once_the_cap_is_spent() {
    let fake = crate::fakes::FakeOllama::answering(
        r#"{"match": true, "confidence": 0.99, "reason": "ok"}"#,
        4,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "Write a greeting file", "metadata": {"max_cost_usd": 0.5},
            "routing_decision": {"selected_endpoint": fake.addr.to_string(), "selected_model": "judge-m"},
            "verification_steps": [{"type": "llm_judge", "target": "hello.txt exists"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.5, |ws, _| {
        std::fs::write(ws.join("hello.txt"), "hi\n").unwrap();
    })
    .await;
    assert!(
        fake.requests().is_empty(),
        "the judge was asked past the cap"
    );
    assert_eq!(out.termination_reason, "budget_exhausted");
    assert_eq!(out.attempts[0].report.checks[0].status, CheckStatus::Error);
}

#[tokio::test]
async fn llm_judge_claude_backend_uses_claude_print_stream_json() {
    let bin = tempfile::tempdir().unwrap();
    let args_file = bin.path().join("args.txt");
    let script = bin.path().join("claude");
    std::fs::write(
        &script,
        r#"#!/bin/sh
printf '%s\n' "$@" > "$JUDGE_ARGS_FILE"
printf '%s\n' '{"type":"result","subtype":"success","is_error":false,"result":"Verdict: {\"match\":true,\"confidence\":0.9,\"reason\":\"ok\"}","usage":{"input_tokens":10,"output_tokens":5},"total_cost_usd":0.01,"num_turns":1}'
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut ctx, _) = ctx_with(
        dir.path(),
        json!({"description": "Write a greeting file",
            "verification_steps": [{"type": "llm_judge", "target": "hello.txt exists"}]}),
        |c| c.verification.judge_backend = "claude".into(),
    );
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    ctx.env.set("PATH", &path);
    ctx.env.set("JUDGE_ARGS_FILE", &args_file.to_string_lossy());
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, _| {
        std::fs::write(ws.join("hello.txt"), "hi\n").unwrap();
    })
    .await;
    let check = &out.attempts[0].report.checks[0];
    assert_eq!(check.status, CheckStatus::Pass, "{check:?}");
    // The judge's own cost is the task's cost too (the execution here cost nothing).
    assert!((check.cost_usd - 0.01).abs() < 1e-9, "{check:?}");
    assert!((out.cost_usd - 0.01).abs() < 1e-9, "{}", out.cost_usd);
    let args = std::fs::read_to_string(&args_file).unwrap();
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(args[0], "-p");
    assert!(
        args.windows(2)
            .any(|w| w == ["--output-format", "stream-json"]),
        "{args:?}"
    );
    // The prompt goes on stdin, not in argv.
    assert!(
        !args.iter().any(|a| a.contains("Write a greeting file")),
        "{args:?}"
    );
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
async fn a_check_no_edit_can_fix_stops_the_loop_at_once_with_check_error() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 3,
        "verification_steps": [
            {"type": "test_passes", "target": "auto"},
            {"type": "file_exists", "target": "never.txt"}
        ]}),
    );
    let (out, prompts) = run_llm(&ctx, &LoopOptions::default(), 0.01, |ws, k| {
        std::fs::write(ws.join(format!("try{k}.txt")), "x\n").unwrap();
    })
    .await;
    assert_eq!(out.termination_reason, "check_error");
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(
        out.executions, 1,
        "no retry is spent on a check that cannot run"
    );
    assert_eq!(prompts.len(), 1);
    assert_eq!(out.attempts[0].report.status, ReportStatus::Error);
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
    assert_eq!(out.executions, 1, "{prompts:?}");
    assert_eq!(out.termination_reason, "budget_exhausted");
    assert!((ledger.spent_today().await - 0.75).abs() < 1e-9);
    assert!(
        (out.cost_usd - 0.75).abs() < 1e-9,
        "the task's spend resumed too"
    );
    assert_eq!(
        out.attempts[0].report.run_number, 3,
        "the attempt count resumed"
    );
}

#[tokio::test]
async fn an_executor_failure_on_attempt_two_keeps_the_record_in_task_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, _) = ctx_for(
        dir.path(),
        json!({"description": "x", "max_verification_retries": 3,
            "verification_steps": [{"type": "file_exists", "target": "never.txt"}]}),
    );
    let ws = ctx.workspace.clone();
    let mut attempter = FnAttempter(move |a: Attempt| {
        let ws = ws.clone();
        async move {
            std::fs::write(ws.join(format!("try{}.txt", a.number)), "x\n").unwrap();
            if a.number == 1 {
                return ok(0.2);
            }
            let mut o = ExecOutcome::failed("claude exited with code 1");
            o.tokens_in = 100;
            o.tokens_out = 7;
            o.cost_usd = 0.3;
            o
        }
    });
    let out = retry_loop::run_with(&mut attempter, true, &ctx, &LoopOptions::default()).await;
    assert_eq!(out.termination_reason, "execution_failed");
    let frame = hub_sidecar::runner::frame_for(&ctx.task, &out);
    let v: Value = serde_json::from_str(&frame.to_text()).unwrap();
    assert_eq!(v["type"], "task_failed");
    assert_eq!(v["reason"], "claude exited with code 1");
    assert_eq!(v["tokens_used"], 10 + 5 + 100 + 7);
    assert!((v["result"]["estimated_cost_usd"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(v["result"]["termination_reason"], "execution_failed");
    let history = v["verification_history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "attempt 1's report is kept");
    assert_eq!(history[0]["run_number"], 1);
    assert!(
        hub_sidecar::mock_hub::schema::validate(&v).is_ok(),
        "the hub's schema accepts the extra fields: {:?}",
        hub_sidecar::mock_hub::schema::validate(&v)
    );
}

/// The figure for the issue: the `task_complete` of an attempt that created 100,000 files.
/// `cargo test --test it task_complete_size_under_100k -- --ignored --nocapture`
#[tokio::test]
#[ignore]
async fn task_complete_size_under_100k_created_files() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    for args in [
        &["init", "-q"][..],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "i",
        ],
    ] {
        assert!(std::process::Command::new("git")
            .args(args)
            .current_dir(ws)
            .status()
            .unwrap()
            .success());
    }
    let (ctx, _) = ctx_for(
        ws,
        json!({"description": "x", "verification_steps": [
            {"type": "file_exists", "target": "never.txt"}]}),
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, _| {
        for d in 0..100 {
            let sub = ws.join(format!("gen{d:03}"));
            std::fs::create_dir_all(&sub).unwrap();
            for f in 0..1000 {
                std::fs::write(sub.join(format!("f{f:04}.txt")), "x\n").unwrap();
            }
        }
    })
    .await;
    let frame = hub_sidecar::runner::frame_for(&ctx.task, &out).to_text();
    let obs = &out.attempts[0].observations;
    assert_eq!(obs.last().unwrap(), "… and 99,800 more changes not listed");
    println!(
        "FIGURE task_complete: 100,000 created files → {} bytes ({} observation lines)",
        frame.len(),
        obs.len()
    );
    assert!(frame.len() < 100_000, "{}", frame.len());
}
