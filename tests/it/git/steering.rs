//! The repository steering the daemon's own git without running anything: `.git` in every
//! form that points elsewhere, keys that move the work tree, replace refs that change what
//! the statistics of a push say. Issue 27, classes 1 and 2.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::*;
use crate::containment::{plant_and_run, refused, supported};

/// `.git` moved to `store` (inside the work tree) and replaced by `link`, which points
/// there; the real git directory names a clean filter for every file.
fn moved_git_dir(work: &Path, evil: &Path, store: &[u8], link: impl FnOnce(&Path, &Path)) {
    git(
        work,
        &["config", "filter.evil.clean", &evil.display().to_string()],
    );
    std::fs::write(work.join(".gitattributes"), "* filter=evil\n").unwrap();
    let stored = work.join(OsStr::from_bytes(store));
    std::fs::create_dir_all(stored.parent().unwrap()).unwrap();
    std::fs::rename(work.join(".git"), &stored).unwrap();
    link(&work.join(".git"), &stored);
}

fn gitfile(at: &Path, target: &[u8]) {
    let mut bytes = b"gitdir: ".to_vec();
    bytes.extend_from_slice(target);
    bytes.push(b'\n');
    std::fs::write(at, bytes).unwrap();
}

/// Every way `.git` can send git to another directory: the daemon resolves it as git does
/// and checks what it finds (here: refuses the planted filter), whatever bytes the path
/// holds. Before, a symlink or a gitfile that was not UTF-8 read as "no git directory" and
/// the filter ran inside the daemon's own `git add -A`.
#[tokio::test]
async fn every_form_of_dot_git_is_resolved_and_checked_before_the_daemon_git_runs() {
    if !supported() {
        return;
    }
    type Link = fn(&Path, &Path);
    let forms: [(&str, &[u8], Link); 4] = [
        (
            "symlink to the directory",
            b".store/real.git",
            |dot, stored| std::os::unix::fs::symlink(stored, dot).unwrap(),
        ),
        (
            "absolute gitfile, not UTF-8",
            b".store/r\xe9al\xff.git",
            |dot, stored| gitfile(dot, stored.as_os_str().as_bytes()),
        ),
        (
            "relative gitfile, not UTF-8",
            b".store/\xff\x1b[2J.git",
            |dot, stored| {
                let rel = stored.strip_prefix(dot.parent().unwrap()).unwrap();
                gitfile(dot, rel.as_os_str().as_bytes())
            },
        ),
        ("symlink to a gitfile", b".store/g.git", |dot, stored| {
            let file = dot.with_file_name(".store/gitfile");
            gitfile(&file, stored.as_os_str().as_bytes());
            std::os::unix::fs::symlink(&file, dot).unwrap()
        }),
    ];
    for (what, store, link) in forms {
        let done = plant_and_run(move |work, evil| moved_git_dir(work, evil, store, link)).await;
        let text = done.to_string();
        assert!(
            text.contains("refused") && text.contains("filter.evil.clean"),
            "{what}: the planted filter is named in a refusal: {done}"
        );
        assert_eq!(done["type"], "task_failed", "{what}: {done}");
    }
}

/// `core.worktree` (which would make the daemon stage and push files outside the
/// workspace) is outside the allowlist, and has no effect anyway: the daemon names the
/// work tree itself.
#[tokio::test]
async fn git_core_worktree_is_never_followed() {
    refused("core.worktree", true, None).await;
}

/// A replace ref makes the task's base commit look like one that already holds part of
/// the work: with it in force, `diff_stats` (what the hub's risk classifier reads) would
/// count less than the push carries. The statistics are those of the commit pushed.
#[tokio::test]
async fn replace_refs_do_not_change_what_is_pushed_or_its_diff_stats() {
    if !supported() {
        return;
    }
    let done = plant_and_run(|work, _evil| {
        // A root commit whose tree is the base plus the task's `work.txt`, replacing the
        // base itself.
        std::fs::write(work.join("work.txt"), "work\n").unwrap();
        git(work, &["add", "work.txt"]);
        let tree = git(work, &["write-tree"]);
        git(work, &["rm", "-q", "--cached", "work.txt"]);
        std::fs::remove_file(work.join("work.txt")).unwrap();
        let fake = git(work, &["commit-tree", tree.trim(), "-m", "replacement"]);
        git(work, &["replace", "HEAD", fake.trim()]);
    })
    .await;
    let r = &done["result"];
    assert_eq!(r["pushed"], true, "{done}");
    assert_eq!(
        r["diff_stats"]["files_changed"], 2,
        "work.txt and data.txt: {done}"
    );
    assert_eq!(r["diff_stats"]["lines_added"], 2, "{done}");
}

/// In a managed clone the task swaps the workspace's gitfile for a symlink to a git
/// directory of its own whose config names a clean filter, and leaves a tracked file that
/// git must re-read: the observer's `git status` after the attempt resolves the symlink,
/// refuses that config and falls back to a walk instead of running the filter.
#[tokio::test]
async fn a_gitfile_swapped_for_a_symlink_in_a_managed_clone_is_checked_by_the_observer() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let remote = Remote::new();
    let marker = probe(s.dir()).join("pwned");
    let evil = probe(s.dir()).join("evil.sh");
    write_exe(
        &evil,
        &format!("#!/bin/sh\ntouch '{}'\ncat\n", marker.display()),
    );
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    // Same size, newer mtime: git must hash `d.txt` again, through the filter.
    let cmd = format!(
        "git init -q .own && mv .own/.git .own.git && rm -f .git && ln -s .own.git .git && \
         echo aaaa > d.txt && touch -d 2020-01-01 d.txt && git add d.txt && \
         git config filter.x.clean '{e}' && echo '* filter=x' > .gitattributes && echo bbbb > d.txt",
        e = evil.display()
    );
    let mut t = shell_task("swapper", &cmd, &remote.url(), "Swap the gitfile");
    t["verification_steps"] = json!([{"type": "file_exists", "target": "d.txt"}]);
    h.assign(t);
    let done = terminal(h.hub(), "swapper").await;
    assert!(
        !marker.exists(),
        "the observer's git ran the task's filter: {done}"
    );
    assert!(
        done.to_string().contains("filter.x.clean"),
        "the refusal is reported: {done}"
    );
    h.finish().await;
}

/// A nested repository the superproject tracks (a gitlink) has a git directory and config of
/// its own, which no check looked at: the daemon's `git add -A` runs `git status` inside it,
/// which ran its clean filter on a file git had to read again (no `-c` reaches a
/// submodule's own config). A populated submodule's config is checked like the
/// superproject's, and refused here.
#[tokio::test]
async fn a_submodules_own_config_is_checked_before_the_daemons_git_enters_it() {
    if !supported() {
        return;
    }
    let done = plant_and_run(|work, evil| {
        let sub = work.join("s");
        git(work, &["init", "-q", "s"]);
        std::fs::write(sub.join(".gitattributes"), "* filter=evil\n").unwrap();
        std::fs::write(sub.join("f"), "aaaa\n").unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        std::fs::File::options()
            .write(true)
            .open(sub.join("f"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        git(&sub, &["add", "f", ".gitattributes"]);
        git(&sub, &["commit", "-q", "-m", "sub"]);
        git(
            &sub,
            &["config", "filter.evil.clean", &evil.display().to_string()],
        );
        git(work, &["add", "s"]);
        git(work, &["commit", "-q", "--no-status", "-m", "track s"]);
        git(work, &["push", "-q", "origin", "HEAD:trunk"]);
        // Same size, newer mtime: a status that enters `s` must hash `f` through the filter.
        std::fs::write(sub.join("f"), "bbbb\n").unwrap();
        assert!(!evil.with_file_name("pwned").exists(), "planting ran it");
    })
    .await;
    let text = done.to_string();
    assert!(
        text.contains("refused")
            && text.contains("submodule")
            && text.contains("filter.evil.clean"),
        "the submodule's filter is named in a refusal: {done}"
    );
}
