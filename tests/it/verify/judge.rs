//! `llm_judge` checks against the fake Ollama server and a stand-in `claude`.

use super::*;

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
        |c| c.verification.judge_backend = hub_sidecar::config::JudgeBackend::Claude,
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

/// A task with success criteria and no steps, run once; the judge (a fake answering
/// `verdict`) is configured when `judge` is true.
async fn criteria_only(verdict: &str, judge: bool) -> (LoopOutcome, Vec<Value>, Events) {
    let fake = crate::fakes::FakeOllama::answering(verdict, 4).await;
    let dir = tempfile::tempdir().unwrap();
    let (ctx, events) = ctx_with(
        dir.path(),
        json!({"description": "Write a greeting file", "max_verification_retries": 0,
            "success_criteria": ["hello.txt greets the reader", "it is one line"],
            "routing_decision": {"selected_endpoint": fake.addr.to_string(), "selected_model": "judge-m"}}),
        |c| c.verification.judge_configured = judge,
    );
    let (out, _) = run_llm(&ctx, &LoopOptions::default(), 0.0, |ws, _| {
        std::fs::write(ws.join("hello.txt"), "hello\n").unwrap();
    })
    .await;
    (out, fake.requests(), events)
}

/// Seed 004: a claimed success is not accepted until each criterion was checked. With a
/// judge configured, every success criterion is one `llm_judge` check of what changed.
#[tokio::test]
async fn success_criteria_without_steps_are_judged_where_a_judge_is_configured() {
    let yes = r#"{"match": true, "confidence": 0.95, "reason": "file added"}"#;
    let (out, reqs, _) = criteria_only(yes, true).await;
    assert_eq!(out.termination_reason, "verified");
    let report = &out.attempts[0].report;
    assert_eq!(report.status, ReportStatus::Pass);
    let judged: Vec<(String, &str)> = report
        .checks
        .iter()
        .map(|c| (c.check_type.to_string(), c.target.as_str()))
        .collect();
    assert_eq!(
        judged,
        [
            ("llm_judge".to_string(), "hello.txt greets the reader"),
            ("llm_judge".to_string(), "it is one line")
        ]
    );
    assert_eq!(reqs.len(), 2, "one judge call per criterion");
    assert!(reqs[0].to_string().contains("added: hello.txt"));
    assert_eq!(out.not_verified, None);
    // A criterion the judge rejects is a failed check, not a pass.
    let no = r#"{"match": false, "confidence": 0.9, "reason": "not a greeting"}"#;
    let (out, _, _) = criteria_only(no, true).await;
    assert_eq!(out.verification_status, VerificationStatus::PartialPass);
    assert_eq!(out.attempts[0].report.summary.failed, 2);
}

/// Seed 002: no steps is `auto_pass`. With no judge to check prose the report stays so, but
/// the result and the progress say plainly that nothing was verified, and no judge is asked.
#[tokio::test]
async fn success_criteria_without_steps_or_judge_say_nothing_was_verified() {
    let (out, reqs, events) = criteria_only("{}", false).await;
    assert_eq!(out.attempts[0].report.status, ReportStatus::AutoPass);
    assert!(reqs.is_empty());
    let said = out.not_verified.clone().expect("the result says so");
    assert!(
        said.starts_with(
            "nothing was verified: the task gives 2 success criteria but no verification_steps"
        ),
        "{said}"
    );
    let result = hub_sidecar::runner::result_json(&out);
    assert_eq!(result["not_verified"], json!(said));
    assert!(kinds(&events, EventKind::Status)
        .iter()
        .any(|e| e.text.starts_with("nothing was verified")));
}
