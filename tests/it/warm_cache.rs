//! Warm caches (`git.warm_cache`, issue 15 item 4): ignored paths the operator lists survive
//! the clean between tasks of one managed clone; every other ignored or untracked path still
//! goes. Real git against a bare remote, the real daemon against the mock hub.

use hub_sidecar::mock_hub::{MockHub, MockHubOptions};

use crate::git::{base_cfg, shell_task, terminal, Remote};
use crate::util::*;

/// Task 1 fills the listed cache (`build/`, ignored by the remote's `.gitignore`), an
/// unlisted ignored path (`sub/build/`: the same ignore rule, not the listed root path) and an
/// untracked file; task 2 on the same clone sees only the listed cache.
#[tokio::test]
async fn a_listed_cache_survives_the_clean_and_nothing_else_does() {
    let hub = MockHub::start(MockHubOptions::default()).await.unwrap();
    let remote = Remote::new();
    let dir = tempfile::tempdir().unwrap();
    let mut c = base_cfg(&hub, dir.path());
    c.git.enabled = false;
    c.git.warm_cache = vec!["build/".into()];
    let d = spawn(c);
    hub.wait_for_type("identify", T).await.unwrap();
    let repo = remote.path().display().to_string();

    hub.assign(shell_task(
        "warm-1",
        "mkdir -p build sub/build && echo kept > build/cache && echo gone > sub/build/cache && echo gone > stray.txt",
        &repo,
        "Fill the caches",
    ));
    let done = terminal(&hub, "warm-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");

    hub.assign(shell_task(
        "warm-2",
        "cat build/cache; ls -A",
        &repo,
        "Look at the caches",
    ));
    let done = terminal(&hub, "warm-2").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let out = done["result"]["output"].as_str().unwrap();
    assert!(
        out.starts_with("kept\n"),
        "the listed cache was cleaned: {out}"
    );
    assert!(!out.contains("stray.txt"), "untracked file survived: {out}");
    assert!(
        !out.lines().any(|l| l == "sub"),
        "an unlisted ignored path survived: {out}"
    );
    d.stop().await;
    assert_no_violations(&hub);
}

/// A listed path that could reach outside the clone is refused with the config key named.
#[tokio::test]
async fn a_warm_cache_path_outside_the_clone_fails_the_task_and_names_the_key() {
    let hub = MockHub::start(MockHubOptions::default()).await.unwrap();
    let remote = Remote::new();
    let dir = tempfile::tempdir().unwrap();
    let mut c = base_cfg(&hub, dir.path());
    c.git.enabled = false;
    c.git.warm_cache = vec!["../elsewhere/".into()];
    let d = spawn(c);
    hub.wait_for_type("identify", T).await.unwrap();
    let repo = remote.path().display().to_string();
    hub.assign(shell_task("warm-bad", "true", &repo, "Anything"));
    let done = terminal(&hub, "warm-bad").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(done.to_string().contains("git.warm_cache"), "{done}");
    d.stop().await;
}
