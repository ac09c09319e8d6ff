//! Smaller leaks (issue 27, class 5): the daemon's status socket and the credentials in its
//! environment must not reach a task.

use serde_json::json;

use hub_sidecar::mock_hub::sample_shell_task;

use crate::containment::supported;
use crate::git::terminal;
use crate::harness::Harness;

/// The status socket's mode admits the service user, which a task's processes are too;
/// Landlock does not govern `connect()` to a path socket. The daemon refuses a peer in
/// another user namespace, so the task learns nothing, while `status` still works.
#[tokio::test]
async fn a_task_cannot_read_the_status_socket() {
    if !supported() || !crate::util::require("curl", crate::util::missing_tool("curl")) {
        return;
    }
    let s = Harness::setup().await;
    let sock = s.dir().join("status.sock");
    // The real binary: the socket is part of `run`, not of the daemon's library entry.
    let mut h = s.start_bin("test-token", "", &[]).await;
    let mut t = sample_shell_task(
        "peek",
        &format!(
            "curl -s --max-time 5 --unix-socket '{}' http://sidecar/status; echo \" curl=$?\"",
            sock.display()
        ),
    );
    t["verification_steps"] = json!([]);
    h.assign(t);
    let done = terminal(h.hub(), "peek").await;
    let out = done["result"]["output"].as_str().unwrap_or_default();
    assert!(out.contains("curl="), "{done}");
    assert!(
        !out.contains("active_task") && !out.contains("\"link\""),
        "the task read the daemon's status: {out}"
    );
    // The operator (same user, same namespace) still gets it.
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "5", "--unix-socket"])
        .arg(&sock)
        .arg("http://sidecar/status")
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("active_task"), "{body}");
    h.bin().signal("TERM");
    h.bin_mut().wait(crate::util::T).await;
    h.finish().await;
}

/// With the default configuration, none of the credentials a developer's or a CI machine's
/// environment commonly holds reaches a task (the list was a deny list of two names before;
/// `gh` reads `GH_TOKEN` first); the toolchain variables still do.
#[tokio::test]
async fn no_common_credential_in_the_daemons_environment_reaches_a_task() {
    const CREDS: &[&str] = &[
        "GH_TOKEN",
        "GITHUB_TOKEN",
        "GITLAB_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "NPM_TOKEN",
        "CARGO_REGISTRY_TOKEN",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "SSH_AUTH_SOCK",
        "GIT_CONFIG_PARAMETERS",
    ];
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let dump = crate::util::probe(&dir).join("env.txt");
    let mut envs: Vec<(&str, &str)> = CREDS.iter().map(|k| (*k, "cred-value-91c2")).collect();
    // A toolchain's home passes (CARGO_HOME itself is the repository's cache under
    // `[caches]`, set by the sandbox).
    envs.push(("RUSTUP_HOME", "/opt/rustup-home"));
    let mut h = s.start_bin("test-token", "", &envs).await;
    let mut t = sample_shell_task("env", &format!("env > '{}'", dump.display()));
    t["verification_steps"] = json!([]);
    h.assign(t);
    let done = terminal(h.hub(), "env").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let env = std::fs::read_to_string(&dump).unwrap();
    assert!(
        !env.contains("cred-value-91c2"),
        "a credential reached the task:\n{env}"
    );
    assert!(env.contains("RUSTUP_HOME=/opt/rustup-home"), "{env}");
    assert!(env.contains("PATH="), "{env}");
    h.bin().signal("TERM");
    h.bin_mut().wait(crate::util::T).await;
    h.finish().await;
}

/// The pull request's credential (`GH_TOKEN`, `[env] publish`) reaches `gh` and nothing a
/// task runs: before, it reached every child, and `gh` reads it first.
#[tokio::test]
async fn the_pull_request_token_reaches_gh_and_no_task() {
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let remote = crate::git::Remote::new();
    let probe = crate::util::probe(&dir);
    let bin_dir = tempfile::tempdir().unwrap();
    let gh = bin_dir.path().join("gh");
    crate::git::write_exe(
        &gh,
        &format!(
            "#!/bin/sh\n# Test double for the GitHub CLI: records the token it was given.\necho \"gh:${{GH_TOKEN:-none}}\" > '{}/gh-saw'\necho https://github.com/acme/widgets/pull/7\n",
            probe.display()
        ),
    );
    let extra = format!(
        "[git]\ngh_path = \"{}\"\nhub_api_url = \"http://127.0.0.1:1\"\n",
        gh.display()
    );
    let mut h = s
        .start_bin(
            "test-token",
            &extra,
            &[("GH_TOKEN", "ghp-publish-only-5e1")],
        )
        .await;
    let dump = probe.join("task-env");
    h.assign(crate::git::shell_task(
        "pr",
        &format!("env > '{}'; echo w > w.txt", dump.display()),
        &remote.url(),
        "Open a pull request",
    ));
    let done = terminal(h.hub(), "pr").await;
    assert_eq!(
        done["result"]["pr_url"], "https://github.com/acme/widgets/pull/7",
        "{done}"
    );
    let task_env = std::fs::read_to_string(&dump).unwrap();
    assert!(!task_env.contains("ghp-publish-only-5e1"), "{task_env}");
    let saw = std::fs::read_to_string(probe.join("gh-saw")).unwrap();
    assert_eq!(saw.trim(), "gh:ghp-publish-only-5e1");
    h.bin().signal("TERM");
    h.bin_mut().wait(crate::util::T).await;
    h.finish().await;
}

/// A shell task without checks, for tests about what it leaves behind.
fn unchecked(id: &str, cmd: &str) -> serde_json::Value {
    let mut t = sample_shell_task(id, cmd);
    t["verification_steps"] = json!([]);
    t
}

/// The line `tmp=<TMPDIR>` a task printed.
fn printed_tmp(done: &serde_json::Value) -> String {
    let out = done["result"]["output"].as_str().unwrap_or_default();
    out.lines()
        .find_map(|l| l.strip_prefix("tmp="))
        .unwrap_or_else(|| panic!("the task printed its TMPDIR: {done}"))
        .to_string()
}

/// What a task leaves in its TMPDIR and HOME is removed once its result is sent (after, so
/// the hub does not wait for it: BENCHMARKS.md, figure 3), yet before the next task
/// starts, even when the hub gives that task the same id and so the same paths; and the
/// last task's before the daemon exits.
#[tokio::test]
async fn a_tasks_tmpdir_and_home_are_gone_before_the_next_task_and_at_exit() {
    let mut h = Harness::start().await;
    // Enough entries that their removal outlasts the next assignment's round trip.
    let leave = |n: u32| {
        format!(
            "mkdir -p \"$TMPDIR/left\" \"$HOME/.cache/left\" && \
             (cd \"$TMPDIR/left\" && seq {n} | xargs touch) && : >\"$HOME/.cache/left/1\" && \
             echo \"tmp=$TMPDIR\""
        )
    };
    let look = "ls -A \"$TMPDIR\" \"$HOME/.cache\" 2>&1; echo looked";
    h.assign(unchecked("same-id", &leave(20_000)));
    let tmp = printed_tmp(&h.completed("same-id").await);
    h.assign(unchecked("same-id", look));
    let done = h
        .hub()
        .wait_for_nth("task_complete", 2, crate::util::T)
        .await
        .expect("the second task_complete");
    let out = done["result"]["output"].as_str().unwrap_or_default();
    assert!(out.contains("looked"), "{done}");
    assert!(
        !out.contains("left"),
        "the second task saw what the first left: {out}"
    );
    h.assign(unchecked("last", &leave(300)));
    let last_tmp = printed_tmp(&h.completed("last").await);
    h.stop_daemon().await;
    for dir in [&tmp, &last_tmp] {
        assert!(
            !std::path::Path::new(dir).exists(),
            "{dir} is still there after the daemon stopped"
        );
    }
    h.finish().await;
}

/// What tasks of an earlier run left in the state directory (a daemon killed mid-task, or
/// between a result and its removal) is removed when the daemon starts again, before its
/// first task.
#[tokio::test]
async fn what_a_killed_daemons_tasks_left_is_removed_at_the_next_start() {
    let s = Harness::setup().await;
    let cfg = s.cfg();
    let left = [
        cfg.state_dir.join("tmp/killed-task/home/.cache"),
        cfg.state_dir.join("work/killed-task/src"),
    ];
    for d in &left {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("f"), "left").unwrap();
    }
    let h = s.start(cfg).await;
    h.assign(unchecked("next", "true"));
    h.completed("next").await;
    for top in ["tmp/killed-task", "work/killed-task"] {
        let top = h.dir().join(top);
        assert!(!top.exists(), "{} is still there", top.display());
    }
    h.finish().await;
}
