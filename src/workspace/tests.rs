//! Unit tests of the workspace module: the start-up sweep, the names of a task's
//! directories, what a clean keeps.

use super::{dirs_name, keep_patterns, remove_orphans, remove_task_tmp_dir, workspace_for, Swept};
use crate::config::Config;
use crate::sandbox::teardown;
use crate::task::Task;

#[tokio::test]
async fn what_earlier_tasks_left_goes_except_the_unfinished_tasks_own() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::for_hub("ws://127.0.0.1:1/ws", dir.path());
    let task = |id: &str| Task::from_value(crate::mock_hub::sample_shell_task(id, "true")).unwrap();
    let task_tmp_dir = |cfg: &Config, t: &Task| super::task_tmp_dir(cfg, &dirs_name(t, None));
    let (old, unfinished) = (task("old"), task("unfinished/1"));
    // Made ahead by this run (kept) and by an earlier one (removed).
    let (ours, theirs) = (
        dir.path().join("tmp/ahead.run1.0"),
        dir.path().join("work/ahead.run0.3"),
    );
    for d in [&ours, &theirs] {
        std::fs::create_dir_all(d.join("home")).unwrap();
    }
    for t in [&old, &unfinished] {
        for d in [task_tmp_dir(&cfg, t), workspace_for(&cfg, t)] {
            std::fs::create_dir_all(d.join("home/.cache")).unwrap();
            std::fs::write(d.join("home/.cache/f"), "x").unwrap();
        }
    }
    // Read-only, as Go leaves its module cache.
    let ro = task_tmp_dir(&cfg, &old).join("home/.cache");
    std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    std::fs::write(dir.path().join("tmp/stray-file"), "x").unwrap();

    let keep = Some(dirs_name(&unfinished, None));
    assert_eq!(remove_orphans(&cfg, keep, "ahead.run1.").await.removed, 4);
    assert!(ours.join("home").exists() && !theirs.exists());
    assert!(!task_tmp_dir(&cfg, &old).exists());
    assert!(!workspace_for(&cfg, &old).exists());
    assert!(!dir.path().join("tmp/stray-file").exists());
    assert!(task_tmp_dir(&cfg, &unfinished)
        .join("home/.cache/f")
        .exists());
    assert!(workspace_for(&cfg, &unfinished)
        .join("home/.cache/f")
        .exists());
    // Nothing to keep: everything goes; nothing there: nothing to do.
    assert_eq!(remove_orphans(&cfg, None, "").await.removed, 3);
    assert_eq!(remove_orphans(&cfg, None, "").await, Swept::default());
}

/// A name read back from the state file is a path component of the daemon's own making,
/// or the task's id: never a way out of `tmp/` or `work/`.
#[test]
fn a_recorded_name_is_one_plain_component_or_the_tasks_own() {
    let t = Task::from_value(crate::mock_hub::sample_shell_task("t/1", "true")).unwrap();
    assert_eq!(dirs_name(&t, Some("ahead.18ec3a.7")), "ahead.18ec3a.7");
    for bad in [
        "",
        "..",
        "../../etc",
        "a/b",
        ".hidden",
        "a\0b",
        &"x".repeat(121),
    ] {
        assert_eq!(dirs_name(&t, Some(bad)), "t_1", "{bad:?}");
    }
    assert_eq!(dirs_name(&t, None), "t_1");
}

/// Trees an earlier removal set aside are counted for the operator (metrics, health) at
/// every start, never walked again; a tree over a removal's budget is set aside and
/// returned for the caller to report.
#[tokio::test]
async fn set_aside_trees_are_counted_at_start_and_a_tree_over_budget_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::for_hub("ws://127.0.0.1:1/ws", dir.path());
    let aside = dir.path().join("tmp").join(teardown::SET_ASIDE);
    for name in ["a.1.0", "b.2.0"] {
        std::fs::create_dir_all(aside.join(name).join("deep")).unwrap();
    }
    let swept = remove_orphans(&cfg, None, "").await;
    assert_eq!(
        swept,
        Swept {
            removed: 0,
            set_aside: 2
        }
    );
    assert!(aside.join("a.1.0/deep").exists(), "never walked again");

    let tree = dir.path().join("tmp/task-x");
    std::fs::create_dir_all(&tree).unwrap();
    for i in 0..20 {
        std::fs::write(tree.join(format!("f{i}")), "x").unwrap();
    }
    let tiny = teardown::Budget::new(5, std::time::Duration::from_secs(60));
    let set = remove_task_tmp_dir(&tree, tiny).expect("set aside");
    assert_eq!((set.what, set.path.as_path()), ("TMPDIR", tree.as_path()));
    assert!(set.to.starts_with(&aside) && set.to.exists(), "{set:?}");
    assert!(!tree.exists());
    assert_eq!(remove_orphans(&cfg, None, "").await.set_aside, 3);
}

#[test]
fn warm_cache_paths_become_root_anchored_clean_excludes() {
    let paths = ["target/".to_string(), "./node_modules".to_string()];
    assert_eq!(
        keep_patterns(&paths).unwrap(),
        ["-e", "/target/", "-e", "/node_modules"]
    );
    assert!(keep_patterns(&[]).unwrap().is_empty());
}

#[test]
fn warm_cache_paths_that_could_leave_the_clone_are_refused() {
    for bad in [
        "",
        "/etc/",
        "../x",
        "a/../../b",
        ".git",
        "a/.git/hooks",
        "*",
        "!keep",
    ] {
        let e = keep_patterns(&[bad.to_string()]).unwrap_err().to_string();
        assert!(e.contains("git.warm_cache"), "{bad}: {e}");
    }
}
