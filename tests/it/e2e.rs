//! End to end through the daemon and the mock hub: each executor, the corrective loop, the
//! heartbeat during a long check, and progress under the hub's real budget.

use std::path::Path;
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::{json, Value};

use crate::fakes::{answer, tool_calls, FakeOllama};
use crate::harness::Harness;
use crate::util::*;

/// The demo's stand-in `claude` (a test double speaking the real stream-json format that
/// gets the task wrong once), wrapped so every prompt it receives is appended to `log`.
fn recording_stand_in(dir: &Path, log: &Path) -> std::path::PathBuf {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude/claude");
    let path = dir.join("claude");
    let script = format!(
        "#!/bin/sh\n# Test double: records the prompt (stdin), then runs the stand-in claude on it.\np=$(cat)\nprintf '%s\\n=====\\n' \"$p\" >> '{}'\nprintf '%s' \"$p\" | exec '{}' \"$@\"\n",
        log.display(),
        real.display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn claude_task_fails_a_check_then_the_corrective_prompt_fixes_it() {
    let s = Harness::setup().await;
    let log = probe(s.dir()).join("prompts.log");
    let (mut c, _ws) = s.cfg_with_workspace();
    c.executor.claude_path = Some(recording_stand_in(&probe(s.dir()), &log));
    // The recording wrapper execs the stand-in where it lives, in the repository.
    c.sandbox
        .read_paths
        .push(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude"));
    let h = s.start(c).await;
    h.assign(hub_sidecar::commands::demo::sample_task());
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("task_complete");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified");
    assert_eq!(r["verification_attempts"], 2);
    assert_eq!(r["model_used"], "claude-sonnet-4-5");
    assert_eq!(
        done["tokens_used"],
        2 * (850 + 40),
        "tokens summed over attempts"
    );
    assert!((r["estimated_cost_usd"].as_f64().unwrap() - 0.0062).abs() < 1e-9);
    let history = done["verification_history"].as_array().unwrap();
    let runs: Vec<&Value> = history.iter().map(|h| &h["run_number"]).collect();
    assert_eq!(runs, [&json!(1), &json!(2)]);
    assert_eq!(history[0]["status"], "fail");
    assert_eq!(history[1]["status"], "pass");
    // The last report, without the observation list the history already carries.
    let mut last = history[1].clone();
    last.as_object_mut().unwrap().remove("observations");
    assert_eq!(done["verification_report"], last);
    assert!(done["verification_report"].get("observations").is_none());

    let prompts = std::fs::read_to_string(&log).unwrap();
    let prompts: Vec<&str> = prompts
        .split("\n=====\n")
        .filter(|p| !p.is_empty())
        .collect();
    assert_eq!(prompts.len(), 2, "one prompt per attempt");
    assert!(prompts[0].contains("greeting.txt") && !prompts[0].contains("VERIFICATION RETRY"));
    let fix = prompts[1];
    assert!(fix.contains("VERIFICATION RETRY 1/2"), "{fix}");
    let failed = &fix[fix.find("FAILED CHECKS").expect("failed section")..];
    assert!(
        failed.contains("grep -qx 'Hello, hub!' greeting.txt"),
        "{fix}"
    );
    let passed = &fix[fix.find("PASSED CHECKS").expect("passed section")..];
    assert!(passed.contains("file_exists"), "{fix}");
    assert!(
        fix.contains("greeting.txt (+1 lines)"),
        "observations missing: {fix}"
    );
    assert!(fix.contains("ORIGINAL TASK"));
    h.finish().await;
}

#[tokio::test]
async fn ollama_agentic_task_writes_through_the_sandbox_and_is_verified() {
    let ollama = FakeOllama::start(vec![
        tool_calls(&[(
            "write_file",
            json!({"path": "notes/done.txt", "content": "done\n"}),
        )]),
        answer("Wrote notes/done.txt."),
    ])
    .await;
    let s = Harness::setup().await;
    let (c, ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    h.assign(json!({
        "task_id": "ollama-e2e", "description": "Write notes/done.txt saying done.", "generation": 1,
        "routing_decision": {"target_type": "ollama", "effective_tier": "standard",
                             "selected_endpoint": ollama.endpoint(), "selected_model": "qwen3:8b"},
        "verification_steps": [{"type": "file_exists", "target": "notes/done.txt"}]
    }));
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("task_complete");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(r["model_used"], "qwen3:8b");
    assert_eq!(r["termination_reason"], "verified");
    assert_eq!(r["iterations_used"], 2);
    assert_eq!(r["estimated_cost_usd"], 0.0);
    assert!(r["equivalent_claude_cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(done["tokens_used"], 100 + 10 + 50 + 5);
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/done.txt")).unwrap(),
        "done\n"
    );
    // The tool call was reported as progress.
    assert!(h
        .received_of("task_progress")
        .iter()
        .any(|f| f.to_string().contains("write_file")));
    h.finish().await;
}

#[tokio::test]
async fn a_45_s_check_times_out_at_the_deadline_and_pings_keep_flowing() {
    let h = Harness::start().await;
    let sleep = format!("45.{:03}", fastrand::u32(1..999));
    let mut task = sample_shell_task("long-check", "true");
    task["verification_steps"] =
        json!([{"type": "command_succeeds", "target": format!("sleep {sleep}")}]);
    task["verification_timeout_ms"] = json!(5000);
    let t0 = Instant::now();
    h.assign(task);
    let done = h
        .wait_for_type("task_complete", Duration::from_secs(30))
        .await
        .unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(6500), "verdict after {took:?}");
    assert_eq!(done["verification_report"]["status"], "timeout");
    assert_eq!(done["result"]["verification_status"], "partial_pass");
    assert!(
        procs_with_arg(&sleep).is_empty(),
        "the check's sleep survived"
    );
    // The link kept pinging (every 1 s here) while the check ran: the hub saw no silence.
    let pings: Vec<Instant> = h
        .frames()
        .iter()
        .filter(|f| f.inbound && f.frame["type"] == "ping" && f.at >= t0 && f.at <= t0 + took)
        .map(|f| f.at)
        .collect();
    assert!(
        pings.len() >= 4,
        "only {} pings during a {took:?} check",
        pings.len()
    );
    let max_gap = pings.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(max_gap < Duration::from_secs(3), "ping gap {max_gap:?}");
    h.finish().await;
}

#[tokio::test]
async fn a_200k_line_flood_stays_under_the_hub_budget_and_keeps_head_and_tail() {
    // The hub's limiter at its real defaults (60 normal frames a minute).
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.progress = Default::default();
    let h = s.start(c).await;
    h.assign(sample_shell_task("flood", "seq 1 200000"));
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("task_complete delivered");
    let out = done["result"]["output"].as_str().unwrap();
    assert!(out.starts_with("1\n2\n3\n"), "head lost: {}", &out[..40]);
    assert!(out.trim_end().ends_with("199999\n200000"), "tail lost");
    assert!(
        out.contains("bytes elided"),
        "the middle is elided with a marker"
    );
    assert_eq!(h.rate_limited_count(), 0, "the hub had to rate-limit us");
    assert!(wait_until(|| h.acked_terminal("flood") == 1, T).await);
    let progress = h.received_of("task_progress");
    assert!(
        progress.len() <= 5,
        "{} progress frames for a sub-second task",
        progress.len()
    );
    for p in &progress {
        assert!(p["execution_event"]["text"].as_str().unwrap().len() <= 8 * 1024 + 64);
    }
    h.finish().await;
}

#[tokio::test]
async fn a_quiet_task_still_sends_heartbeat_progress() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.progress.heartbeat_secs = 1;
    let h = s.start(c).await;
    h.assign(sample_shell_task("quiet", "sleep 3.5"));
    h.wait_for_type("task_complete", T).await.unwrap();
    let beats = h
        .received_of("task_progress")
        .iter()
        .filter(|f| f.to_string().contains("still working"))
        .count();
    assert!(
        beats >= 2,
        "only {beats} heartbeat frames in 3.5 s of silence"
    );
    h.finish().await;
}

/// A shell command runs once by default: a failing one is reported with its exit code and
/// stderr, and not run again (a migration, a deploy, a push must not run twice).
#[tokio::test]
async fn a_failing_shell_command_runs_once_and_is_reported_with_exit_code_and_stderr() {
    let h = Harness::start().await;
    let always = probe(h.dir()).join("always");
    let failing = format!(
        "echo x >> {}; echo boom-on-stderr >&2; exit 3",
        always.display()
    );
    h.assign(sample_shell_task("broken-cmd", &failing));
    let failed = h.wait_for_type("task_failed", T).await.unwrap();
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.contains("exit code 3") && reason.contains("boom-on-stderr"),
        "{reason}"
    );
    assert_eq!(
        std::fs::read_to_string(&always).unwrap().lines().count(),
        1,
        "run exactly once"
    );
    let runs = &failed["result"]["shell_runs"];
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{failed}");
    assert_eq!(runs[0]["exit"], "exit code 3");
    assert!(!failed.to_string().contains("retrying"), "{failed}");
    h.finish().await;
}

/// Re-running is the operator's explicit choice (`executor.shell_retries`): announced in
/// progress, and every run kept in the result, first first, so the first failure is never
/// hidden by a later one (an install that failed on TLS, then "venv already exists").
#[tokio::test]
async fn shell_retries_is_announced_and_every_run_is_kept_in_the_result() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.executor.shell_retries = 1;
    let h = s.start(c).await;
    let marker = probe(h.dir()).join("venv");
    let cmd = format!(
        "if [ -e {0} ]; then echo 'error: a virtual environment already exists' >&2; exit 2; fi; touch {0}; echo 'error: TLS handshake failed' >&2; exit 1",
        marker.display()
    );
    h.assign(sample_shell_task("twice", &cmd));
    let failed = h.wait_for_type("task_failed", T).await.unwrap();
    let reason = failed["reason"].as_str().unwrap();
    let first = reason.find("TLS handshake failed").expect(reason);
    let second = reason.find("already exists").expect(reason);
    assert!(first < second, "the first failure comes first: {reason}");
    assert!(reason.contains("executor.shell_retries = 1"), "{reason}");
    let runs = failed["result"]["shell_runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 2, "{failed}");
    assert_eq!(
        (&runs[0]["run"], &runs[0]["exit"]),
        (&json!(1), &json!("exit code 1"))
    );
    assert!(runs[0]["error"]
        .as_str()
        .unwrap()
        .contains("TLS handshake failed"));
    assert_eq!(
        (&runs[1]["run"], &runs[1]["exit"]),
        (&json!(2), &json!("exit code 2"))
    );
    assert!(runs[1]["error"]
        .as_str()
        .unwrap()
        .contains("already exists"));
    // What the hub was told while it ran (progress frames, and the last batch that may
    // ride in the result).
    let mut said: String = h
        .received_of("task_progress")
        .iter()
        .filter(|f| f["task_id"] == "twice")
        .map(|f| f["execution_event"].to_string())
        .collect();
    said.push_str(&failed["result"]["last_progress"].to_string());
    assert!(
        said.contains("executor.shell_retries = 1: a failing shell command is run again"),
        "{said}"
    );
    assert!(
        said.contains("shell command failed on run 1 (exit code 1); running it again"),
        "{said}"
    );
    h.finish().await;
}

/// A stand-in `claude` (test double) that fails every run: exit 2 with a message on stderr,
/// counting its runs in `runs`.
fn failing_claude(dir: &Path, runs: &Path) -> std::path::PathBuf {
    let path = dir.join("claude-failing");
    let script = format!(
        "#!/bin/sh\n# Test double: the Claude CLI failing (e.g. an API outage).\necho run >> '{}'\necho 'API Error: 529 overloaded' >&2\nexit 2\n",
        runs.display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_failing_claude_is_retried_then_reported_as_task_failed() {
    let s = Harness::setup().await;
    let runs = probe(s.dir()).join("runs");
    let mut c = s.cfg();
    c.executor.claude_path = Some(failing_claude(&probe(s.dir()), &runs));
    c.executor.claude_retry_delays_ms = vec![10, 10, 10];
    let h = s.start(c).await;
    let mut task = hub_sidecar::commands::demo::sample_task();
    task["task_id"] = json!("claude-down");
    h.assign(task);
    let failed = h
        .wait_for_type("task_failed", T)
        .await
        .expect("task_failed");
    let reason = failed["reason"].as_str().unwrap();
    assert!(reason.contains("529 overloaded"), "{reason}");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        4,
        "1 run + 3 retries"
    );
    assert!(h.received_of("task_complete").is_empty());
    h.finish().await;
}

#[tokio::test]
async fn an_ollama_that_keeps_failing_fails_the_task_with_status_and_body() {
    use crate::fakes::Reply;
    let ollama = FakeOllama::start(
        (0..3)
            .map(|_| Reply::Status(500, "model runner crashed".into()))
            .collect(),
    )
    .await;
    let h = Harness::start().await;
    h.assign(json!({
        "task_id": "ollama-down", "description": "say hi", "generation": 1,
        "metadata": {"agentic": false},
        "routing_decision": {"target_type": "ollama", "selected_endpoint": ollama.endpoint(),
                             "selected_model": "qwen3:8b"}
    }));
    let failed = h
        .wait_for_type("task_failed", T)
        .await
        .expect("task_failed");
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.contains("500") && reason.contains("model runner crashed"),
        "{reason}"
    );
    assert_eq!(ollama.requests().len(), 3, "1 call + 2 retries");
    h.finish().await;
}

/// A stand-in `claude` (test double) that starts a long child and never answers.
fn hanging_claude(dir: &Path, sleep: &str) -> std::path::PathBuf {
    let path = dir.join("claude-hanging");
    let script = format!(
        "#!/bin/sh\n# Test double: a Claude CLI that never finishes.\nsleep {sleep} &\nwait\n"
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_claude_run_is_cancelled_by_the_hub_and_times_out_by_tier() {
    let s = Harness::setup().await;
    let sleep = unique_sleep();
    let mut c = s.cfg();
    c.executor.claude_path = Some(hanging_claude(&probe(s.dir()), &sleep));
    c.executor.trivial_timeout_secs = 2;
    let h = s.start(c).await;

    // Cancelled by the hub: the CLI's whole tree is gone within a second, nothing reported.
    let mut task = hub_sidecar::commands::demo::sample_task();
    task["task_id"] = json!("claude-cancel");
    h.assign(task);
    assert!(wait_until(|| !procs_with_arg(&sleep).is_empty(), T).await);
    h.push(json!({"type": "task_cancelled", "task_id": "claude-cancel", "timestamp": 1}));
    assert!(
        wait_until(|| procs_with_arg(&sleep).is_empty(), Duration::from_secs(1)).await,
        "claude's tree survived the cancel"
    );

    // A trivial task times out after its tier's execution timeout (2 s here).
    let mut task = hub_sidecar::commands::demo::sample_task();
    task["task_id"] = json!("claude-slow");
    task["routing_decision"]["effective_tier"] = json!("trivial");
    let t0 = Instant::now();
    h.assign(task);
    let failed = h
        .wait_for_type("task_failed", T)
        .await
        .expect("task_failed");
    assert_eq!(failed["task_id"], "claude-slow");
    assert!(
        failed["reason"].as_str().unwrap().contains("timed out"),
        "{failed}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "took {:?}",
        t0.elapsed()
    );
    assert!(wait_until(|| procs_with_arg(&sleep).is_empty(), T).await);
    assert!(h.received_of("task_complete").is_empty());
    h.finish().await;
}
