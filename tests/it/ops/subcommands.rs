//! The `check`, `run-task` and `verify` subcommands of the real binary.

use super::*;

/// Run the binary with `args` to completion: exit code, stdout, stderr.
pub(super) async fn run_bin(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("HUB_SIDECAR_CONFIG")
        // `run-task` records into the configured state directory; a test that looks at the
        // record turns this back on with its own state directory.
        .env("HUB_SIDECAR_RECORDER__ENABLED", "false")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("command timed out")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn check_passes_with_a_good_config_and_never_prints_the_token() {
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("sidecar-test".into(), "tok-CHECK-5d1f0a".into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&hub, dir.path(), "tok-CHECK-5d1f0a", "");
    let (code, out, err) = run_bin(&["check", "--config", config.to_str().unwrap()], &[]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    for item in [
        "✓ config",
        "✓ hub",
        "✓ state dir",
        "✓ workspace",
        "claude",
        "git",
    ] {
        assert!(out.contains(item), "missing {item:?}:\n{out}");
    }
    // No daemon on this state directory: check identifies itself, then closes.
    assert!(
        out.contains("token accepted") && out.contains("no daemon runs on this state directory"),
        "{out}"
    );
    assert!(
        out.contains("- ollama"),
        "ollama skipped without ollama_url:\n{out}"
    );
    assert!(!out.contains("tok-CHECK-5d1f0a") && !err.contains("tok-CHECK-5d1f0a"));
    assert!(!hub.received_of("identify").is_empty());
    assert_no_violations(&hub);
}

#[tokio::test]
async fn check_fails_naming_a_missing_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "agent_id = \"a\"\nhub_url = \"ws://127.0.0.1:9/ws\"\n",
    )
    .unwrap();
    let (code, out, err) = run_bin(&["check", "--config", config.to_str().unwrap()], &[]).await;
    assert_ne!(code, Some(0));
    assert!(out.contains("✗ config"), "{out}");
    assert!(
        out.contains("token"),
        "the missing key is named:\n{out}{err}"
    );
}

#[tokio::test]
async fn check_fails_on_a_wrong_token() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&hub, dir.path(), "tok-WRONG-77ab31", "");
    let (code, out, err) = run_bin(&["check", "--config", config.to_str().unwrap()], &[]).await;
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("✗ hub"), "{out}");
    assert!(out.contains("FAILED: hub"), "{out}");
    assert!(!out.contains("tok-WRONG-77ab31") && !err.contains("tok-WRONG-77ab31"));
}

#[tokio::test]
async fn run_task_runs_the_shell_example_offline_and_verify_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let out_file = dir.path().join("result.json");
    let task = repo().join("examples/tasks/shell-with-checks.json");
    let (code, out, err) = run_bin(
        &[
            "run-task",
            task.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--out",
            out_file.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let result: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!(result["type"], "task_complete");
    assert_eq!(result["task_id"], "example-shell-with-checks");
    assert_eq!(result["result"]["verification_status"], "verified");
    assert!(
        err.contains("check file_exists → pass"),
        "plain progress lines off a TTY:\n{err}"
    );
    assert!(ws.join("out/report.txt").exists());

    // verify: the same checks pass on that workspace and fail on an empty one.
    let (code, out, _) = run_bin(
        &[
            "verify",
            task.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["status"], "pass");
    assert_eq!(report["summary"]["passed"], 3);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, out, _) = run_bin(
        &[
            "verify",
            task.to_str().unwrap(),
            "--workspace",
            empty.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["status"], "fail");
}

#[tokio::test]
async fn verify_can_pass_an_llm_judge_check() {
    let fake = crate::fakes::FakeOllama::answering(
        r#"{"match": true, "confidence": 0.95, "reason": "the file is there"}"#,
        2,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("hello.txt"), "hello\n").unwrap();
    let task = dir.path().join("t.json");
    std::fs::write(
        &task,
        json!({"task_id": "judged", "description": "Write hello.txt",
            "routing_decision": {"selected_endpoint": fake.addr.to_string(), "selected_model": "m"},
            "verification_steps": [{"type": "llm_judge", "target": "hello.txt exists"}]})
        .to_string(),
    )
    .unwrap();
    let (code, out, err) = run_bin(
        &[
            "verify",
            task.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["checks"][0]["status"], "pass", "{out}");
    let asked = fake.requests();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].to_string().contains("added: hello.txt (+1 lines)"));
}

#[tokio::test]
async fn verify_exits_non_zero_on_malformed_verification_steps() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("present.txt"), "x").unwrap();
    let task = dir.path().join("t.json");
    for steps in [
        json!([{"type": "file_exists", "target": "present.txt"}, "file_exists present.txt"]),
        json!({"type": "file_exists", "target": "present.txt"}),
    ] {
        std::fs::write(
            &task,
            json!({"task_id": "bad-steps", "verification_steps": steps}).to_string(),
        )
        .unwrap();
        let (code, out, err) = run_bin(
            &[
                "verify",
                task.to_str().unwrap(),
                "--workspace",
                dir.path().to_str().unwrap(),
            ],
            &[],
        )
        .await;
        assert_eq!(
            code,
            Some(1),
            "a malformed step must never verify:\n{out}\n{err}"
        );
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["status"], "error", "{out}");
        assert!(
            out.contains("verification_steps"),
            "the bad element is named: {out}"
        );
    }
}

#[tokio::test]
async fn run_task_with_a_relative_workspace_observes_the_git_repository() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    crate::git::git(&ws, &["init", "-q"]);
    crate::git::git(&ws, &["commit", "-q", "--allow-empty", "-m", "i"]);
    let task = dir.path().join("t.json");
    let mut t = sample_shell_task("relative-ws", "echo hi > made.txt");
    t["verification_steps"] = json!([{"type": "file_exists", "target": "made.txt"}]);
    std::fs::write(&task, t.to_string()).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
        .args(["run-task", "t.json", "--workspace", "ws"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .env_remove("HUB_SIDECAR_CONFIG")
        .env("HUB_SIDECAR_RECORDER__ENABLED", "false")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|_| panic!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let obs = &v["verification_history"][0]["observations"];
    assert_eq!(obs, &json!(["added: made.txt (+1 lines)"]), "{v:#}");
}

#[tokio::test]
async fn run_task_with_a_failing_task_exits_non_zero_and_prints_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("t.json");
    let mut t = sample_shell_task("fails", "echo out; exit 3");
    t["verification_steps"] = json!([{"type": "file_exists", "target": "nope"}]);
    std::fs::write(&task, t.to_string()).unwrap();
    // No --workspace: a temporary one is made (under TMPDIR, here the test's directory).
    let tmp = dir.path().to_str().unwrap();
    let (code, out, err) = run_bin(&["run-task", task.to_str().unwrap()], &[("TMPDIR", tmp)]).await;
    assert_eq!(code, Some(1), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["type"], "task_failed", "{out}");
    assert!(
        err.contains("workspace"),
        "the temporary workspace is shown: {err}"
    );
}

#[tokio::test]
async fn run_task_fixes_the_failing_test_with_the_stand_in_claude() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    for f in ["calc.sh", "test.sh"] {
        std::fs::copy(
            repo().join("examples/workspaces/failing-test").join(f),
            ws.join(f),
        )
        .unwrap();
    }
    let stand_in = repo().join("examples/stand-in-claude/fix-failing-test");
    let task = repo().join("examples/tasks/claude-fix-failing-test.json");
    let (code, out, err) = run_bin(
        &[
            "run-task",
            task.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
        ],
        &[(
            "HUB_SIDECAR_EXECUTOR__CLAUDE_PATH",
            stand_in.to_str().unwrap(),
        )],
    )
    .await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["result"]["verification_status"], "verified");
    assert_eq!(
        v["result"]["verification_attempts"], 2,
        "fixed on the corrective attempt"
    );
    assert_eq!(v["verification_history"][0]["status"], "fail");
}

#[tokio::test]
async fn run_task_leaves_a_flight_record_that_tasks_and_show_read_from_a_config_without_agent_id() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    // What an operator writes to try a task by hand: no hub keys at all.
    let config = dir.path().join("offline.toml");
    std::fs::write(&config, format!("state_dir = \"{}\"\n", state.display())).unwrap();
    let task = repo().join("examples/tasks/shell-with-checks.json");
    let on = [("HUB_SIDECAR_RECORDER__ENABLED", "true")];
    let cfg = config.to_str().unwrap();
    let (code, out, err) = run_bin(
        &[
            "run-task",
            task.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--config",
            cfg,
        ],
        &on,
    )
    .await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("flight record under"), "{err}");

    let (code, out, err) = run_bin(&["tasks", "--config", cfg, "--json"], &on).await;
    assert_eq!(code, Some(0), "tasks refused the config:\n{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["task_id"], "example-shell-with-checks", "{list}");

    let (code, out, err) = run_bin(
        &[
            "show",
            "example-shell-with-checks",
            "--config",
            cfg,
            "--json",
        ],
        &on,
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["attempts"].as_array().unwrap().len(), 1, "{story}");
    assert_eq!(story["terminal"]["frame_type"], "task_complete", "{story}");
    assert_eq!(story["stop"]["decision"], "verified", "{story}");
}

/// A task branch's work is committed (the shape of every branch the daemon publishes):
/// `verify` judges it against the merge base with the default branch, and says so; `--base`
/// names another base.
#[tokio::test]
async fn verify_judges_committed_work_against_the_merge_base_and_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let git = |args: &[&str]| crate::git::git(&ws, args);
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("README"), "base\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "base"]);
    let base = git(&["rev-parse", "HEAD"]).trim().to_string();
    git(&["checkout", "-q", "-b", "task-branch"]);
    std::fs::write(ws.join("hello.txt"), "hello\n").unwrap();
    git(&["add", "hello.txt"]);
    git(&["commit", "-q", "-m", "the work"]);
    let task = dir.path().join("t.json");
    let fake = crate::fakes::FakeOllama::answering(
        r#"{"match": true, "confidence": 0.95, "reason": "committed"}"#,
        4,
    )
    .await;
    std::fs::write(
        &task,
        json!({"task_id": "judged", "description": "Write hello.txt",
            "routing_decision": {"selected_endpoint": fake.addr.to_string(), "selected_model": "m"},
            "verification_steps": [{"type": "llm_judge", "target": "hello.txt exists"}]})
        .to_string(),
    )
    .unwrap();
    let verify = |extra: &'static [&'static str]| {
        let mut args = vec![
            "verify".to_string(),
            task.display().to_string(),
            "--workspace".into(),
            ws.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        async move {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            run_bin(&a, &[]).await
        }
    };
    let (code, out, err) = verify(&[]).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        err.contains(&format!(
            "llm_judge sees the work since {} (the merge base of HEAD with main)",
            &base[..12]
        )),
        "{err}"
    );
    let asked = fake.requests();
    assert_eq!(asked.len(), 1);
    assert!(
        asked[0]
            .to_string()
            .contains("committed: hello.txt (+1 −0)"),
        "{}",
        asked[0]
    );
    // --base HEAD: nothing since, so the judge is not asked and the check fails.
    let (code, out, err) = verify(&["--base", "HEAD"]).await;
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("(--base HEAD)"), "{err}");
    assert_eq!(fake.requests().len(), 1);
}
