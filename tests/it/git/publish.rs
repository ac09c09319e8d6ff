//! Publishing a task's work: the branch, the commit, the push (with lease on a re-assign),
//! the pull request (draft for a partial pass) and the risk classification.

use super::*;

#[tokio::test]
async fn verified_task_pushes_exactly_its_commit_opens_a_pr_and_is_classified() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let classify = Classify::start(200, r#"{"tier":1,"reason":"small change"}"#).await;
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.git.reviewer = Some("octo".into());
    c.git.hub_api_url = Some(classify.url.clone());
    c.git.author_name = "Sidecar Bot".into();
    c.git.author_email = "bot@example.test".into();
    let h = s.start(c).await;

    let mut t = shell_task(
        "task-push-0001",
        "echo hello > hello.txt; mkdir -p tests; echo t > tests/hello_test.sh",
        &remote.url(),
        "Add a greeting file\n\nIt should say hello.",
    );
    t["success_criteria"] = json!(["hello.txt exists"]);
    t["verification_steps"] = json!([{"type": "file_exists", "target": "hello.txt"}]);
    t["metadata"]["priority"] = json!("high");
    h.assign(t);
    let done = terminal(h.hub(), "task-push-0001").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified");
    let branch = r["branch"].as_str().unwrap();
    assert_eq!(branch, "sidecar-test/add-a-greeting-file-push0001");
    assert_eq!(r["pushed"], true, "{r}");
    assert!(r.get("git_error").is_none(), "{r}");

    // The remote branch holds exactly one commit on top of trunk: the task's.
    let log = remote.git(&[
        "log",
        "--format=%H%x1f%an <%ae>%x1f%B%x1e",
        &format!("trunk..{branch}"),
    ]);
    let commits: Vec<&str> = log
        .split('\x1e')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(commits.len(), 1, "{log}");
    let parts: Vec<&str> = commits[0].split('\x1f').collect();
    assert_eq!(parts[0], r["commit"].as_str().unwrap());
    assert_eq!(parts[1], "Sidecar Bot <bot@example.test>");
    assert_eq!(parts[2], "Add a greeting file\n\nTask-Id: task-push-0001");
    let files = remote.git(&["show", "--name-only", "--format=", branch]);
    assert_eq!(files.trim(), "hello.txt\ntests/hello_test.sh");

    // The pull request call, argv only, body from a file.
    let argv = gh.argv().expect("gh was called");
    for want in [
        "pr",
        "create",
        "--title=Add a greeting file",
        &format!("--head={branch}"),
        "--base=trunk",
        "--label=agent:sidecar-test",
        "--label=priority:high",
        "--reviewer=octo",
    ] {
        assert!(argv.iter().any(|a| a == want), "missing {want} in {argv:?}");
    }
    assert!(!argv.iter().any(|a| a == "--draft"));
    let body = gh.body();
    assert!(body.contains("It should say hello."), "{body}");
    assert!(body.contains("- hello.txt exists"), "{body}");
    assert!(body.contains("| 1 | pass | 1 | 0 |"), "{body}");
    assert!(body.contains("Attempts: 1"), "{body}");
    assert_eq!(r["pr_url"], "https://github.com/acme/widgets/pull/42");

    // Classification: the hub's answer, asked with the token and the diff's numbers.
    assert_eq!(
        r["risk_classification"],
        json!({"tier": 1, "reason": "small change"})
    );
    let reqs = classify.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let req = &reqs[0];
    assert!(
        req.starts_with("POST /api/tasks/task-push-0001/classify "),
        "{req}"
    );
    assert!(
        req.to_ascii_lowercase()
            .contains("authorization: bearer test-token"),
        "{req}"
    );
    let body: Value = serde_json::from_str(req.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"lines_added": 2, "lines_deleted": 0, "files_changed": 2, "tests_touched": 1})
    );
    h.finish().await;
}

#[tokio::test]
async fn pr_and_classification_failures_are_reported_not_fatal() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(true);
    let classify = Classify::start(500, r#"{"error":"boom"}"#).await;
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.git.hub_api_url = Some(classify.url.clone());
    let h = s.start(c).await;
    h.assign(shell_task("pf-1", "echo a > a.txt", &remote.url(), "Add a"));
    let done = terminal(h.hub(), "pf-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified");
    assert_eq!(r["pushed"], true);
    let err = r["git_error"].as_str().unwrap();
    assert!(
        err.contains("gh pr create failed") && err.contains("label"),
        "{err}"
    );
    assert!(r.get("pr_url").is_none());
    assert_eq!(
        r["risk_classification"],
        json!({"tier": 2, "reason": "classification unavailable"})
    );
    assert_eq!(classify.requests().len(), 1);
    assert!(remote
        .branches()
        .iter()
        .any(|b| b == r["branch"].as_str().unwrap()));
    h.finish().await;
}

#[tokio::test]
async fn nothing_to_commit_pushes_nothing_and_says_so() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    let h = s.start(c).await;
    h.assign(shell_task("noop-1", "true", &remote.url(), "Do nothing"));
    let done = terminal(h.hub(), "noop-1").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(r["pushed"], false);
    assert!(
        r["git_note"]
            .as_str()
            .unwrap()
            .contains("nothing to commit"),
        "{r}"
    );
    assert!(r.get("commit").is_none());
    assert_eq!(remote.branches(), vec!["trunk"]);
    assert!(gh.argv().is_none(), "no PR without a commit");
    h.finish().await;
}

#[tokio::test]
async fn partial_pass_with_push_drafts_opens_a_draft_pr() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let (_bin, claude) = stand_in_claude();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.git.push_drafts = true;
    c.executor.claude_path = Some(claude);
    let h = s.start(c).await;
    h.assign(claude_task("draft-1", &remote.url()));
    let done = terminal(h.hub(), "draft-1").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "partial_pass", "{done}");
    assert_eq!(r["pushed"], true, "{r}");
    let branch = r["branch"].as_str().unwrap();
    assert!(remote.branches().iter().any(|b| b == branch));
    let argv = gh.argv().expect("gh called");
    assert!(argv.iter().any(|a| a == "--draft"), "{argv:?}");
    assert!(gh.body().contains("| 1 | fail | 0 | 1 |"), "{}", gh.body());
    h.finish().await;
}

#[tokio::test]
async fn partial_pass_pushes_nothing() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let (_bin, claude) = stand_in_claude();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.executor.claude_path = Some(claude);
    let h = s.start(c).await;
    h.assign(claude_task("pp-1", &remote.url()));
    let done = terminal(h.hub(), "pp-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "partial_pass", "{r}");
    assert_eq!(r["pushed"], false);
    assert!(
        r["git_note"].as_str().unwrap().contains("push_drafts"),
        "{r}"
    );
    assert_eq!(
        remote.branches(),
        vec!["trunk"],
        "partial_pass pushed a branch"
    );
    assert!(gh.argv().is_none());
    h.finish().await;
}

#[tokio::test]
async fn a_reassigned_task_recreates_its_branch_and_force_pushes_with_lease() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    h.assign(shell_task(
        "again-1",
        "echo one > one.txt",
        &remote.url(),
        "Redo me",
    ));
    let first = terminal(h.hub(), "again-1").await;
    assert_eq!(first["result"]["pushed"], true, "{first}");
    assert!(wait_until(|| h.acked_terminal("again-1") == 1, T).await);
    // The hub re-queues the task: same id, next generation, different work.
    let mut t = shell_task("again-1", "echo two > two.txt", &remote.url(), "Redo me");
    t["generation"] = json!(2);
    h.assign(t);
    let second = h
        .wait_for(
            |f| f["type"] == "task_complete" && f["task_id"] == "again-1" && f["generation"] == 2,
            T,
        )
        .await
        .expect("second run's result");
    let r = &second["result"];
    assert_eq!(r["pushed"], true, "{r}");
    assert_eq!(r["branch"], first["result"]["branch"]);
    let branch = r["branch"].as_str().unwrap();
    let log = remote.git(&["log", "--format=%H", &format!("trunk..{branch}")]);
    assert_eq!(
        log.trim(),
        r["commit"].as_str().unwrap(),
        "only the new commit"
    );
    let files = remote.git(&["show", "--name-only", "--format=", branch]);
    assert_eq!(files.trim(), "two.txt");
    h.finish().await;
}

#[tokio::test]
async fn a_task_branch_is_the_base_of_workspace_and_pull_request() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let seed = remote.dir.path().join("seed");
    git(&seed, &["checkout", "-q", "-b", "release"]);
    std::fs::write(seed.join("RELEASE"), "1.0\n").unwrap();
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-q", "-m", "release"]);
    git(&seed, &["push", "-q", "origin", "release"]);
    let gh = Gh::new(false);
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    let h = s.start(c).await;
    let mut t = shell_task(
        "rel-1",
        "cat RELEASE; echo fix > fix.txt",
        &remote.url(),
        "Fix release",
    );
    t["branch"] = json!("release");
    h.assign(t);
    let done = terminal(h.hub(), "rel-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        done["result"]["output"].as_str().unwrap().contains("1.0"),
        "{done}"
    );
    let argv = gh.argv().unwrap();
    assert!(argv.iter().any(|a| a == "--base=release"), "{argv:?}");
    let branch = done["result"]["branch"].as_str().unwrap();
    let log = remote.git(&["log", "--format=%s", &format!("release..{branch}")]);
    assert_eq!(log.trim(), "Fix release");
    // A branch the remote does not have fails clearly.
    let mut t = shell_task("rel-2", "true", &remote.url(), "No such branch");
    t["branch"] = json!("nope");
    h.assign(t);
    let done = terminal(h.hub(), "rel-2").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("branch `nope` does not exist on origin"),
        "{done}"
    );
    h.finish().await;
}
