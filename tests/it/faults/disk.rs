//! Disk: an unwritable or vanished state file refuses tasks with `state_not_persistable`, then
//! recovers.

use super::*;

/// Root ignores `chmod`, so "unwritable" is made with paths no user can write: a state file
/// *under a regular file* (ENOTDIR) or a state file that *is a directory* (EISDIR).
#[tokio::test]
async fn an_unwritable_state_file_refuses_tasks_with_state_not_persistable() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"a regular file").unwrap();
    let impossible = blocker.join("queue.json");
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        &format!("state_file = \"{}\"\n", impossible.display()),
    );
    let mut bin = Bin::start(dir.path(), &config, &[]);
    hub.wait_for_type("identify", T)
        .await
        .unwrap_or_else(|| panic!("daemon did not start:\n{}", bin.logs()));
    let marker = probe(dir.path()).join("ran");
    hub.assign(sample_shell_task(
        "blind",
        &format!("touch {}", marker.display()),
    ));
    let failed = hub.wait_for_type("task_failed", T).await.expect("refused");
    assert_eq!(failed["task_id"], "blind");
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .starts_with("state_not_persistable"),
        "{failed}"
    );
    assert!(
        hub.received_of("task_accepted").is_empty(),
        "accepted blind"
    );
    assert!(!marker.exists(), "ran a task it could not persist");
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    // Its runner was started beside the write (the fence closed): ended with the daemon,
    // it ran nothing and sent nothing.
    assert!(!marker.exists(), "ran a task it could not persist");
    assert!(
        hub.received_of("task_progress").is_empty(),
        "progress of a task never accepted: {:?}",
        hub.received_of("task_progress")
    );
    let logs = bin.logs();
    assert!(
        logs.contains("cannot persist") && logs.contains(&impossible.display().to_string()),
        "the log does not say why:\n{logs}"
    );
    assert_no_violations(&hub);
}

#[tokio::test]
async fn a_state_file_lost_while_running_refuses_then_recovers() {
    let s = Harness::setup().await;
    let st_dir = s.dir().join("st");
    let mut c = s.cfg();
    c.state_file = Some(st_dir.join("queue.json"));
    let h = s.start(c).await;
    h.assign(sample_shell_task("ok-1", "echo one"));
    assert!(wait_until(|| h.acked_terminal("ok-1") == 1, T).await);
    // The disk goes bad: the state file's path now needs a directory where a file is.
    std::fs::remove_dir_all(&st_dir).unwrap();
    std::fs::write(&st_dir, b"not a directory").unwrap();
    h.assign(sample_shell_task("while-bad", "echo never"));
    let failed = h
        .wait_for(
            |f| f["type"] == "task_failed" && f["task_id"] == "while-bad",
            T,
        )
        .await
        .expect("refused");
    assert!(failed["reason"]
        .as_str()
        .unwrap()
        .starts_with("state_not_persistable"));
    assert_eq!(count_of(h.hub(), "task_accepted", "while-bad"), 0);
    // The disk is fixed: tasks are accepted again, no restart needed.
    std::fs::remove_file(&st_dir).unwrap();
    h.assign(sample_shell_task("ok-2", "echo two"));
    assert!(wait_until(|| h.acked_terminal("ok-2") == 1, T).await);
    h.finish().await;
}
