//! Hostile input to the git workflow: credentials in URLs, shell metacharacters, transports
//! that run commands, option-like URLs, and an executor reaching for the git directory.

use super::*;

#[tokio::test]
async fn credentials_in_the_repo_url_never_reach_logs_or_the_hub() {
    let s = Harness::setup().await;
    let mut h = s
        .start_bin("test-token", "", &[("RUST_LOG", "debug")])
        .await;
    let mut t = shell_task(
        "cred-1",
        "true",
        "http://user:s3cretpass@127.0.0.1:1/x.git",
        "Touch the secret repo",
    );
    t["verification_steps"] = json!([]);
    h.assign(t);
    let done = h
        .wait_for(
            |f| f["type"] == "task_failed" && f["task_id"] == "cred-1",
            T,
        )
        .await
        .unwrap_or_else(|| panic!("no task_failed; daemon log:\n{}", h.bin().logs()));
    let reason = done["reason"].as_str().unwrap();
    assert!(reason.contains("git clone failed"), "{reason}");
    assert!(
        reason.contains("http://127.0.0.1:1/x.git"),
        "names the repo: {reason}"
    );
    assert!(!reason.contains("s3cretpass"), "{reason}");
    for f in h.received() {
        assert!(
            !f.to_string().contains("s3cretpass"),
            "leaked to the hub: {f}"
        );
    }
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let logs = h.bin().logs();
    assert!(logs.contains("git step"), "debug git logs expected: {logs}");
    assert!(!logs.contains("s3cretpass"), "leaked to the log:\n{logs}");
    h.finish().await;
}

#[tokio::test]
async fn shell_metacharacters_in_the_description_stay_inert() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let pwned = s.dir().join("pwned");
    let desc = format!("$(touch {}) `id` ; rm -rf ~ | & > <", pwned.display());
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    let h = s.start(c).await;
    h.assign(shell_task("meta-1", "echo m > m.txt", &remote.url(), &desc));
    let done = terminal(h.hub(), "meta-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let branch = done["result"]["branch"].as_str().unwrap().to_string();
    assert!(
        branch.starts_with("sidecar-test/touch-")
            && branch.ends_with("-meta1")
            && branch[13..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{branch}"
    );
    assert!(remote.branches().contains(&branch));
    let argv = gh.argv().unwrap();
    assert!(argv.contains(&format!("--title={desc}")), "{argv:?}");
    let subject = remote.git(&["log", "-1", "--format=%s", &branch]);
    assert_eq!(subject.trim(), desc);
    assert!(!pwned.exists(), "the description was executed");
    h.finish().await;
}

/// A managed clone's git directory is outside the workspace and read-only to the task: the
/// executor can read history but not commit (or plant hooks and config); the daemon commits
/// its work.
#[tokio::test]
async fn the_executor_cannot_write_the_git_directory_its_work_is_committed_by_the_daemon() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    h.assign(shell_task(
        "self-1",
        "echo s > s.txt; git log --oneline | head -1; if git add s.txt 2>/dev/null; then echo WROTE-GIT-DIR; fi; if echo x >> \"$(git rev-parse --git-dir)/config\"; then echo WROTE-CONFIG; fi; true",
        &remote.url(),
        "Commit by yourself",
    ));
    let done = terminal(h.hub(), "self-1").await;
    let r = &done["result"];
    let out = r["output"].as_str().unwrap();
    assert!(out.contains("seed"), "history is readable: {done}");
    assert!(
        !out.contains("WROTE-GIT-DIR") && !out.contains("WROTE-CONFIG"),
        "{done}"
    );
    assert_eq!(r["pushed"], true, "{done}");
    let branch = r["branch"].as_str().unwrap();
    let log = remote.git(&["log", "--format=%s", &format!("trunk..{branch}")]);
    assert_eq!(log.trim(), "Commit by yourself");
    assert_eq!(r["diff_stats"]["files_changed"], 1);
    h.finish().await;
}

#[tokio::test]
async fn command_running_transports_and_option_like_urls_are_refused() {
    let s = Harness::setup().await;
    let pwned = s.dir().join("pwned");
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    let ext = format!("ext::sh -c touch% {}", pwned.display());
    h.assign(shell_task("ext-1", "true", &ext, "ext transport"));
    let done = terminal(h.hub(), "ext-1").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("git clone failed"),
        "{done}"
    );
    assert!(!pwned.exists(), "the ext:: transport ran a command");
    h.assign(shell_task(
        "opt-1",
        "true",
        "--upload-pack=touch /tmp/x",
        "option",
    ));
    let done = terminal(h.hub(), "opt-1").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("not a repository URL"),
        "{done}"
    );
    h.finish().await;
}
