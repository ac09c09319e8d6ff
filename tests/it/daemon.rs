//! Daemon core: hub link, task lifecycle, crash-safe state, outbox (issue: daemon core).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::{sample_shell_task, MockHubOptions};
use serde_json::{json, Value};

use crate::harness::{Harness, Setup};
use crate::util::*;

#[tokio::test]
async fn identifies_first_then_pings_and_gets_pongs() {
    let s = Harness::setup().await;
    let cfg = s.cfg();
    let mut h = s.start_unidentified(cfg);
    h.wait_for_type("ping", T).await.expect("a ping");
    let first = h.received()[0].clone();
    assert_eq!(first["type"], "identify");
    assert_eq!(first["agent_id"], "sidecar-test");
    assert_eq!(first["client_type"], "sidecar");
    assert_eq!(first["status"], "idle");
    assert!(h
        .frames()
        .iter()
        .any(|f| !f.inbound && f.frame["type"] == "pong"));
    assert!(wait_until(|| h.ops().snapshot().last_pong_age_ms.is_some(), T).await);
    assert_eq!(
        h.stop_daemon().await,
        hub_sidecar::daemon::ExitReason::Drained
    );
    h.finish().await;
}

#[tokio::test]
async fn reconnects_after_the_hub_restarts_on_the_same_port() {
    let h = Harness::start().await;
    h.stop().await;
    h.restart().await.unwrap();
    h.identified_nth(2).await;
    // And the new connection works: a task goes through.
    h.wait_for_nth("ping", 2, T).await.unwrap();
    h.assign(sample_shell_task("after-restart", "echo ok"));
    h.wait_for_type("task_complete", T)
        .await
        .expect("task on the new link");
    h.finish().await;
}

#[tokio::test]
async fn cooldown_close_is_honoured_before_the_next_identify() {
    let s = Harness::setup().await;
    s.hub.set_cooldown(2);
    let cfg = s.cfg();
    let h = s.start_unidentified(cfg);
    h.identified_nth(2).await;
    let ids: Vec<Instant> = h
        .frames()
        .iter()
        .filter(|f| f.inbound && f.frame["type"] == "identify")
        .map(|f| f.at)
        .collect();
    let gap = ids[1] - ids[0];
    assert!(
        gap >= Duration::from_millis(1900),
        "re-identified after {gap:?}, cooldown was 2 s"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_rejected_token_backs_off_to_the_maximum() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.token = "wrong-token".into();
    c.reconnect_min_ms = 50;
    c.reconnect_max_ms = 3000;
    let h = s.start(c).await;
    // With a 50 ms minimum, a plain reconnect loop would identify ~20 times in a second;
    // after an auth error the next try waits at least half the 3 s maximum.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        h.received_of("identify").len(),
        1,
        "hammered the hub with a bad token"
    );
    h.identified_nth(2).await;
    h.finish().await;
}

#[tokio::test]
async fn assign_accept_complete_echoes_generation_and_is_acked_once() {
    let h = Harness::start().await;
    let mut task = sample_shell_task("t-gen", "echo hello-from-task");
    task["generation"] = json!(7);
    h.assign(task);
    let acc = h.wait_for_type("task_accepted", T).await.unwrap();
    assert_eq!(acc["task_id"], "t-gen");
    let done = h.wait_for_type("task_complete", T).await.unwrap();
    assert_eq!(done["generation"], 7);
    assert_eq!(done["result"]["verification_status"], "verified");
    assert!(done["result"]["output"]
        .as_str()
        .unwrap()
        .contains("hello-from-task"));
    assert!(wait_until(|| h.acked_terminal("t-gen") == 1, T).await);
    // The runner is prepared beside the durable write of the assignment, but the hub hears
    // of the task first through `task_accepted`: no progress before it.
    let about: Vec<String> = h
        .received()
        .iter()
        .filter(|f| f["task_id"] == "t-gen")
        .map(|f| f["type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        about.first().map(String::as_str),
        Some("task_accepted"),
        "{about:?}"
    );
    assert!(about.iter().any(|t| t == "task_progress"), "{about:?}");
    // The outbox empties once acknowledged.
    let state = h.dir().join("queue.json");
    assert!(
        wait_until(
            || hub_sidecar::state::read_state(&state)
                .map(|s| s.outbox.is_empty() && s.active.is_none())
                .unwrap_or(false),
            T
        )
        .await
    );
    h.finish().await;
}

#[tokio::test]
async fn a_second_assign_while_busy_is_not_answered_and_the_running_task_goes_on() {
    // The hub's AgentFSM would apply a `task_failed` for busy-2 to busy-1 (issue 42).
    let h = Harness::start().await;
    let sleep = unique_sleep();
    h.assign(sample_shell_task("busy-1", &format!("sleep {sleep}")));
    h.wait_for_type("task_accepted", T).await.unwrap();
    let mut second = sample_shell_task("busy-2", "echo never");
    second["generation"] = json!(4);
    h.assign(second);
    // A ping round trip later the assignment has been handled: nothing said about it.
    let pings = h.received_of("ping").len();
    h.wait_for_nth("ping", pings + 2, T).await.unwrap();
    let said: Vec<Value> = h
        .received()
        .into_iter()
        .filter(|f| f["task_id"] == "busy-2")
        .collect();
    assert!(said.is_empty(), "{said:?}");
    assert_eq!(
        procs_with_arg(&sleep).len(),
        1,
        "the running task was stopped"
    );
    h.push(json!({"type": "task_cancelled", "task_id": "busy-1", "timestamp": 1}));
    assert!(wait_until(|| procs_with_arg(&sleep).is_empty(), T).await);
    h.finish().await;
}

#[tokio::test]
async fn cancel_kills_the_task_tree_within_a_second_and_frees_the_slot() {
    let h = Harness::start().await;
    let sleep = unique_sleep();
    // A pipeline and a background job: the whole tree must go.
    h.assign(sample_shell_task(
        "cancel-me",
        &format!("sleep {sleep} & sleep {sleep} | cat; wait"),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(
        wait_until(|| procs_with_arg(&sleep).len() >= 2, T).await,
        "sleeps started"
    );
    let t0 = Instant::now();
    h.push(json!({"type": "task_cancelled", "task_id": "cancel-me", "timestamp": 1}));
    assert!(
        wait_until(|| procs_with_arg(&sleep).is_empty(), Duration::from_secs(1)).await,
        "sleep processes still alive 1 s after task_cancelled: {:?}",
        procs_with_arg(&sleep)
    );
    let took = t0.elapsed();
    // The slot is free: the next task runs, and nothing was reported for the cancelled one.
    h.assign(sample_shell_task("after-cancel", "echo next"));
    let done = h.wait_for_type("task_complete", T).await.unwrap();
    assert_eq!(done["task_id"], "after-cancel");
    assert!(h.received_of("task_failed").is_empty());
    eprintln!("cancel → tree gone in {took:?}");
    h.finish().await;
}

#[tokio::test]
async fn result_survives_a_hub_outage_and_is_acked_exactly_once() {
    let h = Harness::start().await;
    let marker = probe(h.dir()).join("started");
    h.assign(sample_shell_task(
        "outage",
        &format!(
            "touch {}; sleep 1; echo finished-while-hub-down",
            marker.display()
        ),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| marker.exists(), T).await);
    h.stop().await;
    // The task finishes while the hub is down: the result must be on disk.
    let state = h.dir().join("queue.json");
    assert!(
        wait_until(
            || std::fs::read_to_string(&state)
                .map(|s| s.contains("finished-while-hub-down"))
                .unwrap_or(false),
            T
        )
        .await,
        "result not persisted in the outbox"
    );
    h.restart().await.unwrap();
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("re-sent after reconnect");
    assert_eq!(done["task_id"], "outage");
    assert!(wait_until(|| h.acked_terminal("outage") == 1, T).await);
    // Give a duplicate a chance to show up before asserting there is none.
    h.wait_for_nth("ping", h.received_of("ping").len() + 2, T)
        .await;
    assert_eq!(h.acked_terminal("outage"), 1);
    assert_eq!(h.received_of("task_complete").len(), 1);
    h.finish().await;
}

#[tokio::test]
async fn a_rate_limited_result_is_resent_after_retry_after() {
    let s = Setup::with_hub(MockHubOptions {
        // One token, refilled every 3 s: task_accepted takes it, so the immediate
        // task_complete is always denied.
        normal_capacity: 1,
        normal_per_minute: 20,
        ..MockHubOptions::default()
    })
    .await;
    let mut c = s.cfg();
    // No progress frame at all (not even the end-of-task flush): progress needs the bucket
    // full (2 tokens, 1 s to refill one), and task_accepted leaves it short for the few
    // milliseconds this task takes. Otherwise a rate_limited answer to a progress
    // frame would pause the daemon and its complete would pass first time, proving nothing.
    c.progress.capacity = 2;
    c.progress.reserve = 1;
    c.progress.heartbeat_secs = 600;
    let h = s.start(c).await;
    h.assign(sample_shell_task("limited", "echo x"));
    let done = h.wait_for_nth("task_complete", 2, T).await;
    let done = done.unwrap_or_else(|| {
        panic!(
            "not re-sent: {:#?}",
            h.frames()
                .iter()
                .map(|f| (f.inbound, f.frame.to_string()))
                .collect::<Vec<_>>()
        )
    });
    assert_eq!(done["task_id"], "limited");
    assert!(
        h.rate_limited_count() >= 1,
        "the hub never rate-limited: test proves nothing"
    );
    assert!(wait_until(|| h.acked_terminal("limited") == 1, T).await);
    h.finish().await;
}

#[tokio::test]
async fn garbage_frames_do_not_hurt_and_the_next_task_completes() {
    let h = Harness::start().await;
    h.wait_for_type("ping", T).await.unwrap();
    assert!(h.push_text("this is not json"));
    assert!(h.push_text("[1,2,3]"));
    assert!(h.push_text("\"a string\""));
    assert!(h.push_binary(vec![0, 159, 146, 150]));
    assert!(h.push(json!({"type": "task_assign", "description": "no task id"})));
    assert!(h.push(json!({"type": "no_such_type", "x": 1})));
    assert!(h.push(json!({"type": "task_ack"})));
    assert!(h.push(json!({"type": "task_assign", "task_id": 5})));
    let mut huge = sample_shell_task("huge", "echo huge");
    huge["description"] = json!("x".repeat(1024 * 1024));
    h.assign(huge);
    h.wait_for(
        |f| f["type"] == "task_complete" && f["task_id"] == "huge",
        T,
    )
    .await
    .expect("1 MB description task handled");
    h.assign(sample_shell_task("valid", "echo still-alive"));
    let done = h
        .wait_for(
            |f| f["type"] == "task_complete" && f["task_id"] == "valid",
            T,
        )
        .await
        .expect("daemon survived the garbage");
    assert!(done["result"]["output"]
        .as_str()
        .unwrap()
        .contains("still-alive"));
    assert_eq!(
        h.connections_total(),
        1,
        "garbage should not cost the connection"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_shell_task_without_shell_command_fails_clearly_and_never_runs_the_description() {
    let h = Harness::start().await;
    let marker = h.dir().join("pwned");
    let mut task = sample_shell_task("prose", "true");
    task["metadata"] = json!({});
    task["description"] = json!(format!("touch {}", marker.display()));
    h.assign(task);
    let failed = h.wait_for_type("task_failed", T).await.unwrap();
    assert!(failed["reason"].as_str().unwrap().contains("shell_command"));
    assert!(!marker.exists());
    h.finish().await;
}

#[tokio::test]
async fn a_corrupt_state_file_is_kept_aside_and_the_daemon_still_works() {
    let s = Harness::setup().await;
    std::fs::write(s.dir().join("queue.json"), b"{\"active\": [garbage").unwrap();
    let mut h = s.start_bin("test-token", "", &[]).await;
    // The state file is read while the daemon identifies (src/daemon/mod.rs), so it may
    // still be in place right after `identify`; no frame is handled before it was read, so
    // once a task completed it has been moved aside.
    h.assign(sample_shell_task("after-corrupt", "echo fine"));
    h.wait_for_type("task_complete", T).await.unwrap();
    let aside: Vec<_> = std::fs::read_dir(h.dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("queue.json.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "corrupt file not moved aside");
    assert_eq!(
        std::fs::read(aside[0].path()).unwrap(),
        b"{\"active\": [garbage"
    );
    h.bin().signal("TERM");
    assert_eq!(h.bin_mut().wait(T).await, Some(0));
    let logs = h.bin().logs();
    assert!(logs.contains("corrupt"), "not reported in the log:\n{logs}");
    h.finish().await;
}

#[tokio::test]
async fn the_token_never_appears_in_logs() {
    let mut h = Setup::with_hub(MockHubOptions {
        agents: vec![("sidecar-test".into(), "tok-UNIQUE-7f3a9c2e".into())],
        ..MockHubOptions::default()
    })
    .await
    .start_bin("tok-UNIQUE-7f3a9c2e", "", &[("RUST_LOG", "trace")])
    .await;
    // A task that echoes the token from its environment must not leak it either.
    h.assign(sample_shell_task(
        "leak",
        "echo tok-UNIQUE-7f3a9c2e; echo $HUB_SIDECAR_TOKEN",
    ));
    let done = h.wait_for_type("task_complete", T).await.unwrap();
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let logs = h.bin().logs();
    assert!(logs.len() > 200, "expected trace logs, got:\n{logs}");
    assert!(
        !logs.contains("tok-UNIQUE-7f3a9c2e"),
        "token leaked into logs"
    );
    let frames: String = h
        .received()
        .iter()
        .filter(|f| f["type"] != "identify")
        .map(|f| f.to_string())
        .collect();
    assert!(
        !frames.contains("tok-UNIQUE-7f3a9c2e"),
        "token leaked to the hub: {done}"
    );
    h.finish().await;
}

#[tokio::test]
async fn an_oversized_frame_is_refused_and_the_link_recovers() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.max_frame_bytes = 64 * 1024;
    let h = s.start(c).await;
    let mut big = sample_shell_task("too-big", "echo never");
    big["description"] = json!("x".repeat(256 * 1024));
    h.assign(big);
    // The frame is refused (connection reset by the size limit), the daemon reconnects and
    // works; the oversized task was never accepted.
    h.identified_nth(2).await;
    h.assign(sample_shell_task("fits", "echo fine"));
    let done = h.wait_for_type("task_complete", T).await.unwrap();
    assert_eq!(done["task_id"], "fits");
    assert!(h
        .received_of("task_accepted")
        .iter()
        .all(|f| f["task_id"] != "too-big"));
    h.finish().await;
}

#[tokio::test]
async fn resource_reports_flow_after_identify() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.resource_report_interval_secs = 1;
    let h = s.start_unidentified(c);
    let r = h
        .wait_for_type("resource_report", T)
        .await
        .expect("a resource_report");
    assert!(r["ram_total_bytes"].as_u64().unwrap() > 0);
    assert!(r["ram_used_bytes"].as_u64().unwrap() <= r["ram_total_bytes"].as_u64().unwrap());
    assert!(r["cpu_percent"].is_number());
    h.wait_for_nth("resource_report", 2, T)
        .await
        .expect("periodic");
    h.finish().await;
}

#[tokio::test]
async fn an_assignment_right_after_a_cancel_is_accepted_and_waits_for_the_old_tree() {
    let s = Harness::setup().await;
    let (mut c, ws) = s.cfg_with_workspace();
    c.executor.kill_grace_ms = 1500;
    let h = s.start(c).await;
    let sleep = unique_sleep();
    // Ignores SIGTERM, so the cancelled tree lives until SIGKILL after the grace period.
    h.assign(sample_shell_task(
        "stubborn",
        &format!("trap '' TERM; sleep {sleep} & echo $! > sleep.pid; wait"),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| ws.join("sleep.pid").exists(), T).await);
    h.push(json!({"type": "task_cancelled", "task_id": "stubborn", "timestamp": 1}));
    // The hub thinks this agent is idle now and assigns at once.
    // The old tree lived in its own PID namespace: look for its sleep by argv, not by pid.
    let check_gone = format!("for d in /proc/[0-9]*; do if [ \"$(tr '\\0' ' ' < $d/cmdline 2>/dev/null)\" = 'sleep {sleep} ' ] && ! grep -q ') Z' $d/stat 2>/dev/null; then echo overlap; exit 1; fi; done; echo clean");
    let check_gone = check_gone.as_str();
    h.assign(sample_shell_task("next", check_gone));
    let accepted = h
        .wait_for(
            |f| f["type"] == "task_accepted" && f["task_id"] == "next",
            T,
        )
        .await;
    assert!(accepted.is_some(), "next task not accepted");
    let done = h
        .wait_for(
            |f| {
                f["task_id"] == "next"
                    && (f["type"] == "task_complete" || f["type"] == "task_failed")
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        done["result"]["output"].as_str().unwrap().contains("clean"),
        "{done}"
    );
    assert!(procs_with_arg(&sleep).is_empty());
    assert!(h.received_of("task_failed").is_empty(), "refused as busy");
    h.finish().await;
}

/// A stand-in `claude` (test double) costing $0.25 a run, logging each run in the workspace;
/// its second run hangs (the daemon is killed during it) and records its pid for cleanup.
fn costly_claude(dir: &Path) -> PathBuf {
    let path = dir.join("claude");
    let script = r#"#!/bin/sh
# Test double for the claude CLI: never fixes anything, costs $0.25 per run.
echo run >> "$PWD/claude-runs.log"
n=$(wc -l < "$PWD/claude-runs.log")
if [ "$n" -eq 2 ]; then echo $$ > "$PWD/hang.pid"; exec sleep 60; fi
echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":5,"num_turns":1,"result":"Tried.","session_id":"s-c","total_cost_usd":0.25,"usage":{"input_tokens":5,"output_tokens":3}}'
"#;
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn the_daily_cap_holds_when_the_daemon_restarts_in_the_middle_of_a_task() {
    let s = Harness::setup().await;
    let ws = s.dir().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let claude = costly_claude(&probe(s.dir()));
    let extra = format!(
        "repo_dir = \"{}\"\n[executor]\nclaude_path = \"{}\"\n[verification]\nmax_cost_usd_per_day = 0.6\nretry_ceiling = 5\n",
        ws.display(),
        claude.display()
    );
    let mut h = s.start_bin("test-token", &extra, &[]).await;
    let mut task = sample_shell_task("capped", "unused");
    task["description"] = json!("Make never.txt appear");
    task["max_verification_retries"] = json!(5);
    task["verification_steps"] = json!([{"type": "file_exists", "target": "never.txt"}]);
    task["routing_decision"]["target_type"] = json!("claude");
    task["complexity"]["effective_tier"] = json!("standard");
    h.assign(task);
    // Run 1 costs $0.25; the daemon dies during run 2.
    let pid_file = ws.join("hang.pid");
    assert!(
        wait_until(|| pid_file.exists(), T).await,
        "{}",
        h.bin().logs()
    );
    // The hub dies too (its task table kept), so on restart it answers `task_continue` at
    // the generation on disk: the task's own, resumed.
    h.stop().await;
    h.bin_mut().kill9().await;
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    }
    h.restart().await.unwrap();
    h.start_bin_again(&[]);
    let done = h
        .wait_for_type("task_complete", T)
        .await
        .expect("the continued task ends");
    let r = &done["result"];
    assert_eq!(r["termination_reason"], "budget_exhausted", "{done:#}");
    // Resumed with $0.25 spent and attempt 1 done: attempt 2 (cut short) runs again, then
    // attempt 3, bringing the day to $0.75; the cap stops the next one before it runs. A
    // daemon that forgot the day would have run 3 more ($1.00 in all).
    let runs = std::fs::read_to_string(ws.join("claude-runs.log")).unwrap();
    assert_eq!(runs.lines().count(), 4, "{}", h.bin().logs());
    assert!(
        (r["estimated_cost_usd"].as_f64().unwrap() - 0.75).abs() < 1e-9,
        "{r}"
    );
    let runs: Vec<&Value> = done["verification_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["run_number"])
        .collect();
    assert_eq!(
        runs,
        [&json!(1), &json!(2), &json!(3)],
        "the attempt count resumed, and attempt 1's report is kept"
    );
    let ledger: Value =
        serde_json::from_str(&std::fs::read_to_string(h.dir().join("spend.json")).unwrap())
            .unwrap();
    assert!((ledger["spent_today_usd"].as_f64().unwrap() - 0.75).abs() < 1e-9);
    h.finish().await;
}

/// A task that spends nothing writes no spend ledger: no cost to remember, and no attempt
/// to resume once its loop has stopped. Each ledger write is a temp file, two fsyncs and a
/// rename: a verified shell task with a check made three of them (issue 30, figure 3c on
/// disk).
#[tokio::test]
async fn a_verified_shell_task_that_spent_nothing_leaves_no_spend_ledger() {
    let h = Harness::start().await;
    let mut task = sample_shell_task("free", "echo done > out.txt");
    task["verification_steps"] = json!([{"type": "file_exists", "target": "out.txt"}]);
    h.assign(task);
    let done = h.terminal("free").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    assert!(
        !h.dir().join("spend.json").exists(),
        "{}",
        std::fs::read_to_string(h.dir().join("spend.json")).unwrap_or_default()
    );
    h.finish().await;
}

/// `Shutdown::immediate` during a forced stop: the daemon stops waiting out the task's kill
/// grace (60 s here, for a task that ignores SIGTERM), kills its processes at once, keeps the
/// task for recovery and says `Interrupted`. This is what the third stop signal asks for.
#[tokio::test]
async fn an_immediate_stop_kills_a_task_in_its_kill_grace_and_keeps_it_for_recovery() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.executor.kill_grace_ms = 60_000;
    // Without a PID namespace, so SIGTERM reaches the shell itself (which ignores it)
    // rather than the namespace's supervisor (which would take the whole tree down).
    c.containment = Some(hub_sidecar::sandbox::Containment::Off);
    let mut h = s.start(c).await;
    let sleep = unique_sleep();
    h.assign(sample_shell_task(
        "stubborn",
        &format!("trap '' TERM; sleep {sleep}"),
    ));
    h.wait_for_type("task_accepted", T).await.unwrap();
    assert!(wait_until(|| !procs_with_arg(&sleep).is_empty(), T).await);
    // Abort first, as the second signal does: the task shrugs off its SIGTERM, so the forced
    // stop would wait the whole grace. Immediate cuts that short wherever the stop is.
    h.shutdown().abort.cancel();
    h.shutdown().immediate.cancel();
    let state = h.dir().join("queue.json");
    let reason = tokio::time::timeout(T, h.exited())
        .await
        .expect("an immediate stop must not wait out the 60 s kill grace");
    assert_eq!(reason, hub_sidecar::daemon::ExitReason::Interrupted);
    let gone = wait_until(|| procs_with_arg(&sleep).is_empty(), T).await;
    for pid in procs_with_arg(&sleep) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(gone, "the task's processes outlived the immediate stop");
    let st = hub_sidecar::state::read_state(&state).unwrap();
    let phase = serde_json::to_value(&st).unwrap()["active"]["phase"].clone();
    assert_eq!(phase, "recovering");
    assert!(h.received_of("task_complete").is_empty());
    h.finish().await;
}

#[tokio::test]
async fn the_hub_s_acknowledgement_is_logged_in_the_protocol_s_word() {
    let mut h = Harness::setup()
        .await
        .start_bin("test-token", "", &[])
        .await;
    // A failed task: the hub acknowledges it with `retried`.
    h.assign(sample_shell_task("acked", "exit 3"));
    h.wait_for_type("task_failed", T).await.unwrap();
    assert!(
        wait_until(|| h.bin().logs().contains("result acknowledged"), T).await,
        "no acknowledgement logged:\n{}",
        h.bin().logs()
    );
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let logs = h.bin().logs();
    let line = logs
        .lines()
        .find(|l| l.contains("result acknowledged"))
        .unwrap();
    assert!(line.contains("status=retried"), "{line}");
    assert!(!line.contains("Some("), "{line}");
    h.finish().await;
}
