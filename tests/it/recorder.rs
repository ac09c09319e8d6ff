//! Flight recorder (issue 16): tasks run through the real daemon against the mock hub, then
//! read back through the real binary's `show --json`, `show`, `tasks` and `status`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};
use serde_json::Value;

use crate::harness::Harness;
use crate::util::*;

const SECRET: &str = "sk-live-RECORDER-93f1";

fn stand_in_claude() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stand-in-claude/claude")
}

/// The binary with `args` to completion: exit code, stdout, stderr.
async fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("HUB_SIDECAR_CONFIG")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("command timed out")
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dir/probe`: where a task may leave markers for the test. Tasks are confined to their
/// workspace once containment is on; the test configs grant this one directory
/// (`sandbox.write_paths`), never the state directory itself.
fn markers(dir: &Path) -> PathBuf {
    let p = dir.join("probe");
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn record_text(state: &Path, task_id: &str) -> String {
    std::fs::read_to_string(state.join("tasks").join(task_id).join("record.jsonl"))
        .unwrap_or_default()
}

/// Run the demo's claude task (fails once, then fixed) with `tweak`, up to the hub's ack.
async fn run_claude_task(task_id: &str, tweak: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let hub = MockHub::start(MockHubOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _ws) = cfg_with_workspace(&hub, dir.path());
    c.executor.claude_path = Some(stand_in_claude());
    c.secrets = vec![SECRET.to_string()];
    let d = spawn(c);
    hub.wait_for_type("identify", T).await.unwrap();
    let mut task = hub_sidecar::commands::demo::sample_task();
    task["task_id"] = task_id.into();
    // The secret reaches the prompt (and so the record) through the description.
    task["description"] = Value::String(format!(
        "{} The deploy key {SECRET} must not be used.",
        task["description"].as_str().unwrap()
    ));
    tweak(&mut task);
    hub.assign(task);
    hub.wait_for_type("task_complete", T).await.unwrap();
    let state = dir.path().to_path_buf();
    assert!(
        wait_until(
            || record_text(&state, task_id).contains("\"kind\":\"acked\""),
            T
        )
        .await,
        "the ack never reached the record:\n{}",
        record_text(&state, task_id)
    );
    d.stop().await;
    assert_no_violations(&hub);
    dir
}

async fn show_json(state: &Path, task_id: &str) -> Value {
    let (code, out, err) = cli(&[
        "show",
        task_id,
        "--json",
        "--state-dir",
        state.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0), "show failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("show --json: {e}:\n{out}"))
}

fn check_statuses(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_failing_then_fixed_task_reads_back_attempt_by_attempt_through_show() {
    let dir = run_claude_task("story-fixed", |_| {}).await;
    let state = dir.path();
    let raw = record_text(state, "story-fixed");
    assert!(!raw.contains(SECRET), "the secret reached the disk:\n{raw}");

    let s = show_json(state, "story-fixed").await;
    assert_eq!(s["task_id"], "story-fixed");
    assert_eq!(s["executor"], "claude");
    assert_eq!(s["status"], "verified");
    assert!(s["task"]["description"]
        .as_str()
        .unwrap()
        .contains("[REDACTED]"));
    let attempts = s["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{s:#}");

    let a1 = &attempts[0];
    let p1 = a1["prompt"].as_str().unwrap();
    assert!(
        p1.contains("greeting.txt") && !p1.contains("VERIFICATION RETRY"),
        "{p1}"
    );
    assert!(
        p1.contains("The deploy key [REDACTED] must not be used"),
        "{p1}"
    );
    assert_eq!(a1["execution"]["status"], "succeeded");
    assert_eq!(a1["execution"]["model"], "claude-sonnet-4-5");
    assert_eq!(a1["execution"]["tokens_in"], 850);
    assert!((a1["execution"]["cost_usd"].as_f64().unwrap() - 0.0031).abs() < 1e-9);
    assert!(
        a1["output"]
            .as_str()
            .unwrap()
            .contains("Wrote greeting.txt"),
        "{a1:#}"
    );
    assert!(
        a1["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event_type"] == "tool_call"),
        "{a1:#}"
    );
    assert_eq!(a1["report"]["status"], "fail");
    assert_eq!(
        check_statuses(&a1["report"]),
        [
            ("file_exists".into(), "pass".into()),
            ("command_succeeds".into(), "fail".into())
        ]
    );
    assert!(
        a1["observations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o.as_str().unwrap().contains("greeting.txt")),
        "what changed: {a1:#}"
    );
    assert_eq!(a1["decision"]["decision"], "retry");

    let a2 = &attempts[1];
    assert!(a2["prompt"]
        .as_str()
        .unwrap()
        .contains("VERIFICATION RETRY 1/2"));
    assert!(a2["prompt"].as_str().unwrap().contains("[REDACTED]"));
    assert_eq!(a2["report"]["status"], "pass");
    assert_eq!(a2["decision"]["decision"], "verified");
    assert_eq!(s["stop"]["decision"], "verified");
    assert_eq!(s["stop"]["after_attempt"], 2);
    assert!((s["cost_usd"].as_f64().unwrap() - 0.0062).abs() < 1e-9);
    assert_eq!(s["tokens"], 2 * (850 + 40));
    assert_eq!(s["terminal"]["frame_type"], "task_complete");
    assert_eq!(
        s["terminal"]["frame"]["result"]["verification_status"],
        "verified"
    );
    assert_eq!(s["acked"]["status"], "complete");
    assert_eq!(s["unreadable_lines"], 0);

    // The same story for people.
    let (code, text, err) = cli(&[
        "show",
        "story-fixed",
        "--state-dir",
        state.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "attempt 1",
        "✗ command_succeeds grep -qx 'Hello, hub!' greeting.txt: fail",
        "→ retry",
        "attempt 2",
        "stopped after attempt 2: verified",
        "acknowledged by the hub",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    assert!(!text.contains(SECRET));

    let (code, out, err) = cli(&["tasks", "--json", "--state-dir", state.to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["task_id"], "story-fixed");
    assert_eq!(list[0]["attempts"], 2);
    assert_eq!(list[0]["status"], "verified");
    assert_eq!(list[0]["executor"], "claude");
    assert_eq!(list[0]["acked"], true);
    let (_, table, _) = cli(&["tasks", "--state-dir", state.to_str().unwrap()]).await;
    assert!(
        table.contains("story-fixed") && table.contains("$0.0062"),
        "{table}"
    );
}

#[tokio::test]
async fn a_budget_stop_is_recorded_as_the_reason_the_loop_ended() {
    // The first attempt costs $0.0031: over the task's cap, so no corrective retry.
    let dir = run_claude_task("story-budget", |t| {
        t["metadata"] = serde_json::json!({"max_cost_usd": 0.003});
    })
    .await;
    let state = dir.path();
    assert!(!record_text(state, "story-budget").contains(SECRET));
    let s = show_json(state, "story-budget").await;
    assert_eq!(s["status"], "partial");
    let attempts = s["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{s:#}");
    assert_eq!(attempts[0]["report"]["status"], "fail");
    assert_eq!(attempts[0]["decision"]["decision"], "budget_exhausted");
    assert_eq!(s["stop"]["decision"], "budget_exhausted");
    assert!(s["stop"]["reason"].as_str().unwrap().contains("cost cap"));
    assert!(
        attempts[0]["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["text"]
                .as_str()
                .unwrap()
                .contains("stopping before spending: the per-task cost cap")),
        "{s:#}"
    );
    assert_eq!(
        s["terminal"]["frame"]["result"]["termination_reason"],
        "budget_exhausted"
    );
    assert_eq!(s["acked"]["status"], "complete");
}

#[tokio::test]
async fn show_names_the_way_out_for_an_unknown_task() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = cli(&["show", "nope", "--state-dir", dir.path().to_str().unwrap()]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("no readable record for task nope") && err.contains("hub-sidecar tasks"),
        "{err}"
    );
}

#[tokio::test]
async fn status_reports_the_link_the_running_attempt_and_the_spend_against_the_budget() {
    let hub = MockHub::start(MockHubOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        "metrics_addr = \"127.0.0.1:0\"\n[verification]\nmax_cost_usd_per_day = 2.5",
    );
    let mut bin = Bin::start(dir.path(), &config, &[]);
    assert!(
        wait_until(|| bin.logs().contains("serving /healthz"), T).await,
        "{}",
        bin.logs()
    );
    let logs = bin.logs();
    let addr = logs
        .lines()
        .find(|l| l.contains("serving /healthz"))
        .and_then(|l| l.split("addr=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .unwrap()
        .to_string();
    hub.wait_for_type("identify", T).await.unwrap();
    let started = markers(dir.path()).join("started");
    let go = markers(dir.path()).join("go");
    let cmd = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo finished",
        started.display(),
        go.display()
    );
    hub.assign(sample_shell_task("status-task", &cmd));
    assert!(wait_until(|| started.exists(), T).await);

    // Poll: the link may still be coming up when the task starts.
    let deadline = tokio::time::Instant::now() + T;
    let snap = loop {
        let (code, out, err) = cli(&["status", "--json", "--metrics-addr", &addr]).await;
        let snap: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        if code == Some(0) && snap["identified"] == true && snap["attempt"] == 1 {
            break snap;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "status never showed the attempt: {out} {err}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(snap["active_task"], "status-task");
    assert_eq!(snap["attempt"], 1);
    assert!(snap["attempt_elapsed_ms"].is_u64() && snap["task_elapsed_ms"].is_u64());
    assert_eq!(snap["daily_budget_usd"], 2.5);
    assert_eq!(snap["spent_today_usd"], 0.0);
    // The same answer on the state directory's socket (0600), without metrics_addr.
    let (code, out, err) = cli(&[
        "status",
        "--json",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    let by_socket: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(by_socket["active_task"], "status-task");
    assert_eq!(by_socket["attempt"], 1);
    let (code, text, err) = cli(&["status", "--metrics-addr", &addr]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("hub:    connected"), "{text}");
    assert!(
        text.contains("task:   status-task, running for") && text.contains("attempt 1 for"),
        "{text}"
    );
    assert!(text.contains("of $2.50 daily budget"), "{text}");

    // While it runs, the record is already readable.
    let (code, out, _) = cli(&[
        "show",
        "status-task",
        "--json",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0));
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["status"], "unfinished");
    assert_eq!(s["executor"], "shell");

    std::fs::write(&go, "").unwrap();
    hub.wait_for_type("task_complete", T).await.unwrap();
    assert!(
        wait_until_async(T, || async {
            let (_, out, _) = cli(&["status", "--json", "--metrics-addr", &addr]).await;
            serde_json::from_str::<Value>(&out).is_ok_and(|v| v["active_task"].is_null())
        })
        .await
    );
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    // After the stop, `status` says it cannot reach the daemon, and `show` still works.
    let (code, _, err) = cli(&["status", "--metrics-addr", &addr]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot reach the daemon"), "{err}");
    assert!(
        !dir.path().join("status.sock").exists(),
        "the socket goes with the daemon"
    );
    let (code, out, _) = cli(&[
        "show",
        "status-task",
        "--json",
        "--state-dir",
        dir.path().to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0));
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["status"], "verified");
    assert!(
        s["attempts"][0]["execution"]["output"]
            .as_str()
            .unwrap()
            .contains("finished"),
        "{s:#}"
    );
}

/// [`wait_until`] for a condition that needs to await (a command).
async fn wait_until_async<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_daemon_killed_mid_task_leaves_a_readable_redacted_record() {
    let s = Harness::setup().await;
    let mut h = s
        .start_bin("test-token", &format!("secrets = [\"{SECRET}\"]"), &[])
        .await;
    let started = markers(h.dir()).join("started");
    let go = markers(h.dir()).join("go");
    let cmd = format!(
        "echo using {SECRET}; touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        go.display()
    );
    h.assign(sample_shell_task("crashed-task", &cmd));
    assert!(wait_until(|| started.exists(), T).await);
    let state = h.dir().to_path_buf();
    assert!(
        wait_until(
            || record_text(&state, "crashed-task").contains("\"kind\":\"attempt_start\""),
            T
        )
        .await
    );
    h.bin_mut().kill9().await;

    let raw = record_text(h.dir(), "crashed-task");
    assert!(!raw.contains(SECRET), "{raw}");
    let s = show_json(h.dir(), "crashed-task").await;
    assert_eq!(s["status"], "unfinished");
    assert!(s["terminal"].is_null() && s["acked"].is_null());
    let prompt = s["attempts"][0]["prompt"].as_str().unwrap();
    assert!(prompt.contains("echo using [REDACTED];"), "{prompt}");
    let (code, text, _) = cli(&[
        "show",
        "crashed-task",
        "--state-dir",
        h.dir().to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, Some(0));
    assert!(
        text.contains("no result recorded: the task is still running, or the daemon stopped"),
        "{text}"
    );
    // The orphaned task shell ends by itself.
    std::fs::write(&go, "").unwrap();
}

#[tokio::test]
async fn retention_through_the_daemon_keeps_the_newest_records() {
    let s = Harness::setup().await;
    let mut c = s.cfg();
    c.recorder.max_tasks = 2;
    let mut h = s.start(c).await;
    for id in ["keep-0", "keep-1", "keep-2"] {
        h.assign(sample_shell_task(id, &format!("echo {id}")));
        assert!(wait_until(|| h.acked_terminal(id) == 1, T).await, "{id}");
    }
    h.stop_daemon().await;
    let (code, out, err) =
        cli(&["tasks", "--json", "--state-dir", h.dir().to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["keep-2", "keep-1"], "the oldest record went");
    assert!(!h.dir().join("tasks").join("keep-0").exists());
}
