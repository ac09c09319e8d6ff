//! The daemon writes the pull request's body into the task's TMPDIR, a tree the task could
//! write: a link the task left under that name is replaced, never written through (issue 35,
//! item 1's rule for every tree a task can write). On main the daemon, unconfined, wrote the
//! body (text the task chose) into whatever file the link named.

use std::os::unix::fs::PermissionsExt;

use super::*;

#[tokio::test]
async fn a_link_left_where_the_pull_request_body_goes_is_replaced_not_written_through() {
    if !crate::containment::supported() {
        return;
    }
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    // A file of the daemon's, in the state directory the task cannot reach.
    let target = s.dir().join("daemon-own.txt");
    std::fs::write(&target, "the daemon's own\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let h = s.start(c).await;
    let cmd = format!(
        "echo hello > hello.txt; ln -s '{}' \"$TMPDIR/pr-body-link-1.md\"",
        target.display()
    );
    h.assign(shell_task("link-1", &cmd, &remote.url(), "Add a greeting"));
    let done = terminal(h.hub(), "link-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert_eq!(
        done["result"]["pr_url"], "https://github.com/acme/widgets/pull/42",
        "{done}"
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "the daemon's own\n"
    );
    let m = std::fs::symlink_metadata(&target).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    // gh still got the body, from a file of the daemon's own.
    assert!(
        gh.body().contains("Task-Id") || !gh.body().is_empty(),
        "{}",
        gh.body()
    );
    h.finish().await;
}
