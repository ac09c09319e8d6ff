//! Workspaces: managed clones made once and reused (fetched and hard-reset between tasks),
//! a dirty `repo_dir` stashed, locks, and temp workspaces removed afterwards.

use super::*;

#[tokio::test]
async fn first_task_clones_second_reuses_and_resets_the_workspace() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    // Without the branch workflow, task 1's edits stay in the workspace: exactly what the
    // reset before task 2 must undo.
    c.git.enabled = false;
    let mut h = s.start(c).await;
    // A plain path works as a repository URL too.
    let repo = remote.path().display().to_string();

    h.assign(shell_task(
        "ws-1",
        "git rev-parse --abbrev-ref HEAD; echo stray > stray.txt; echo changed > README; mkdir build; echo o > build/cache",
        &repo,
        "Make a mess",
    ));
    let done = terminal(h.hub(), "ws-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert_eq!(
        done["result"]["output"].as_str().unwrap().trim(),
        "trunk",
        "the clone is on origin's default branch"
    );

    h.assign(shell_task(
        "ws-2",
        "git rev-parse --abbrev-ref HEAD; ls -A; cat README; git status --porcelain",
        &repo,
        "Look around",
    ));
    let done = terminal(h.hub(), "ws-2").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let out = done["result"]["output"].as_str().unwrap();
    assert!(out.starts_with("trunk\n"), "{out}");
    assert!(!out.contains("stray.txt"), "untracked file survived: {out}");
    assert!(!out.contains("build"), "ignored build dir survived: {out}");
    assert!(out.contains("original"), "local change survived: {out}");
    assert!(!out.contains("changed"), "{out}");

    // Both tasks used clones in state_dir/workspaces, no lock left behind (a task's lock
    // goes with its leftovers, after its result: looked at once the daemon has stopped).
    h.stop_daemon().await;
    let entries: Vec<String> = std::fs::read_dir(h.dir().join("workspaces"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        entries.iter().all(|e| !e.ends_with(".lock")),
        "lock left: {entries:?}"
    );
    assert_eq!(entries.len(), 1, "one clone, reused: {entries:?}");
    h.finish().await;
}

#[tokio::test]
async fn a_task_reuses_its_clone_when_the_same_url_is_given_again() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.enabled = false;
    let h = s.start(c).await;
    h.assign(shell_task(
        "re-1",
        "echo stray > stray.txt; echo x >> README",
        &remote.url(),
        "a",
    ));
    assert_eq!(terminal(h.hub(), "re-1").await["type"], "task_complete");
    // Someone pushes to trunk in between: the next task sees it (fetch + hard reset).
    let seed = remote.dir.path().join("seed");
    std::fs::write(seed.join("NEW"), "new\n").unwrap();
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-q", "-m", "upstream"]);
    git(&seed, &["push", "-q", "origin", "trunk"]);
    h.assign(shell_task("re-2", "ls -A; cat README", &remote.url(), "b"));
    let done = terminal(h.hub(), "re-2").await;
    let out = done["result"]["output"].as_str().unwrap();
    assert!(
        out.contains("NEW"),
        "fetch missed the upstream commit: {out}"
    );
    assert!(!out.contains("stray.txt"), "{out}");
    assert!(!out.contains("\nx\n") && !out.ends_with("x\n"), "{out}");
    // Clones are directories; the task's lock file beside its clone goes with the task's
    // leftovers, after its result was sent (the test may look before that).
    let clones = std::fs::read_dir(h.dir().join("workspaces"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .count();
    assert_eq!(clones, 1, "one clone per URL");
    h.finish().await;
}

#[tokio::test]
async fn a_dirty_repo_dir_is_stashed_never_mixed_into_the_task_commit() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    // An operator's checkout with uncommitted work, used as repo_dir.
    let work = s.dir().join("checkout");
    git(s.dir(), &["clone", "-q", &remote.url(), "checkout"]);
    std::fs::write(work.join("README"), "operator's edit\n").unwrap();
    std::fs::write(work.join("notes.txt"), "mine\n").unwrap();
    let mut c = base_cfg(&s.hub, s.dir());
    c.repo_dir = Some(work.clone());
    // A push from an operator's directory to a remote on local disk needs that remote in
    // the sandbox's write paths (a managed clone's local remote is granted by itself).
    c.sandbox.write_paths.push(remote.path().to_path_buf());
    let h = s.start(c).await;
    let mut t = sample_shell_task("dirty-1", "echo task > task.txt");
    t["description"] = json!("Task on a dirty tree");
    h.assign(t);
    let done = terminal(h.hub(), "dirty-1").await;
    let r = &done["result"];
    assert_eq!(r["pushed"], true, "{done}");
    let branch = r["branch"].as_str().unwrap();
    let files = remote.git(&["show", "--name-only", "--format=", branch]);
    assert_eq!(
        files.trim(),
        "task.txt",
        "operator's work leaked into the commit"
    );
    let stash = git(&work, &["stash", "list"]);
    assert!(
        stash.contains("uncommitted work found before task dirty-1"),
        "{stash}"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_repo_dir_inside_a_repository_gets_no_git_workflow() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    git(s.dir(), &["clone", "-q", &remote.url(), "checkout"]);
    let sub = s.dir().join("checkout/sub");
    std::fs::create_dir(&sub).unwrap();
    let mut c = base_cfg(&s.hub, s.dir());
    c.repo_dir = Some(sub);
    let h = s.start(c).await;
    h.assign(sample_shell_task("sub-1", "echo s > s.txt"));
    let done = terminal(h.hub(), "sub-1").await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    assert!(done["result"].get("branch").is_none(), "{done}");
    assert_eq!(remote.branches(), vec!["trunk"]);
    h.finish().await;
}

#[tokio::test]
async fn a_live_lock_fails_the_task_and_a_dead_one_is_taken_over() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.enabled = false;
    let h = s.start(c).await;
    let root = h.dir().join("workspaces");
    std::fs::create_dir_all(&root).unwrap();
    let lock = root.join(format!(
        "{}.lock",
        hub_sidecar::git::url::slug_of_url(&remote.url())
    ));
    // Held by a live process (this one): the task must not share the clone.
    std::fs::write(&lock, format!("{}\n", std::process::id())).unwrap();
    h.assign(shell_task("lock-1", "true", &remote.url(), "locked"));
    let done = terminal(h.hub(), "lock-1").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("in use by process"),
        "{done}"
    );
    // Left by a crashed run (a pid beyond pid_max cannot be alive): taken over.
    std::fs::write(&lock, "2147483000\n").unwrap();
    h.assign(shell_task("lock-2", "true", &remote.url(), "stale"));
    let done = terminal(h.hub(), "lock-2").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    // Released with the task's other leftovers, once its result is sent.
    assert!(
        crate::util::wait_until(|| !lock.exists(), T).await,
        "released after the task"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_task_without_repo_or_repo_dir_gets_a_temp_dir_removed_afterwards() {
    let s = Harness::setup().await;
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    h.assign(sample_shell_task("tmp-1", "pwd; echo x > x.txt"));
    let done = terminal(h.hub(), "tmp-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let cwd = done["result"]["output"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(
        cwd.starts_with(&h.dir().canonicalize().unwrap().display().to_string())
            || cwd.starts_with(&h.dir().display().to_string()),
        "{cwd}"
    );
    assert!(done["result"].get("branch").is_none());
    // Removed once the result is sent (see `runner::Leftovers`).
    assert!(
        crate::util::wait_until(|| !Path::new(&cwd).exists(), T).await,
        "temp workspace {cwd} left behind"
    );
    h.finish().await;
}
