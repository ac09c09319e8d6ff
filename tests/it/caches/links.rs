//! Issue 35, item 1, end to end: a task leaves links in its repository's cache tree (where
//! the stamp was, in place of `cargo/`, `go/`, every cache directory, a dangling one, one into
//! the state directory), and the daemon prepares the next task on that repository. What the
//! links named stays as it was, and the next task, under strict containment, can neither read
//! nor write through them: its grants are the tree's own paths, never a link's target.
//!
//! The targets are in the state directory, which tasks cannot reach directly.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{can_run, completed, run};
use crate::harness::Harness;

/// Every entry under `dir` (links not followed): mode and bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        let bytes = if m.is_file() {
            std::fs::read(&d).unwrap()
        } else {
            Vec::new()
        };
        out.insert(d.clone(), (m.permissions().mode(), bytes));
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

/// The cache variables other than `CARGO_HOME`, as the children see them.
const OTHERS: &[&str] = &[
    "npm_config_cache",
    "npm_config_store_dir",
    "npm_config_cache_dir",
    "YARN_CACHE_FOLDER",
    "YARN_GLOBAL_FOLDER",
    "PIP_CACHE_DIR",
    "UV_CACHE_DIR",
    "GOMODCACHE",
    "GOCACHE",
    "GOPATH",
    "GRADLE_USER_HOME",
    "DENO_DIR",
    "BUN_INSTALL_CACHE_DIR",
    "XDG_CACHE_HOME",
];

#[tokio::test]
async fn links_a_task_leaves_in_its_cache_tree_are_never_followed_by_the_daemon_or_a_grant() {
    if !can_run(&[]) {
        return;
    }
    let s = Harness::setup().await;
    let state = s.dir().to_path_buf();
    let out = state.join("outside");
    for d in ["cargo", "go", "dirs"] {
        std::fs::create_dir_all(out.join(d)).unwrap();
    }
    for (f, text) in [
        ("stamp", "stamp\n"),
        ("cargo/config", "theirs\n"),
        ("cargo/secret", "top-secret-7c1e\n"),
    ] {
        std::fs::write(out.join(f), text).unwrap();
        std::fs::set_permissions(out.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let (c, _ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    let o = out.display();
    // Round 1: links in place of the stamp (where it was: the tree's `.last-used`), `cargo/`,
    // `go/`, and a dangling one in place of the XDG cache.
    let plant = format!(
        "set -e; t=\"$(dirname \"$CARGO_HOME\")\"; ln -sfn '{o}/stamp' \"$t/.last-used\"; \
         rm -rf \"$CARGO_HOME\" \"$t/go\" \"$XDG_CACHE_HOME\"; ln -s '{o}/cargo' \"$CARGO_HOME\"; \
         ln -s '{o}/go' \"$t/go\"; ln -s '{o}/nothing' \"$XDG_CACHE_HOME\"; echo planted"
    );
    let done = run(h.hub(), "plant-1", &plant).await;
    assert!(completed(&done), "{done}");
    let before = snapshot(&out);
    // The next task: its caches are prepared (nothing followed), and it reads through
    // what is there now.
    let done = run(
        h.hub(),
        "probe-1",
        "cat \"$CARGO_HOME/secret\" 2>&1; ls -A \"$CARGO_HOME\" \"$GOMODCACHE\" 2>&1; echo probed",
    )
    .await;
    assert!(completed(&done), "{done}");
    let text = done["result"]["output"].as_str().unwrap_or_default();
    assert!(text.contains("probed"), "{text}");
    assert!(!text.contains("top-secret"), "read through a link: {text}");
    assert_eq!(snapshot(&out), before, "what the links named changed");
    assert!(!out.join("nothing").exists());

    // Round 2: CARGO_HOME a link to every task's flight record.
    let plant = format!(
        "set -e; rm -rf \"$CARGO_HOME\"; ln -s '{}' \"$CARGO_HOME\"; echo planted",
        state.join("tasks").display()
    );
    let done = run(h.hub(), "plant-2", &plant).await;
    assert!(completed(&done), "{done}");
    let done = run(
        h.hub(),
        "probe-2",
        "ls -AR \"$CARGO_HOME\" 2>&1; cat \"$CARGO_HOME\"/*/* 2>&1 | head -c 2000; echo probed",
    )
    .await;
    assert!(completed(&done), "{done}");
    let text = done["result"]["output"].as_str().unwrap_or_default();
    assert!(text.contains("probed"), "{text}");
    for id in ["plant-1", "probe-1", "plant-2"] {
        assert!(!text.contains(id), "a flight record was readable: {text}");
    }

    // Round 3: a credentials file in the cache's cargo home (the cache tree was carved around
    // it, each entry granted on its own) and every other cache directory a link.
    let mut plant = String::from("set -e; echo x > \"$CARGO_HOME/credentials.toml\"; ");
    for v in OTHERS {
        plant.push_str(&format!("rm -rf \"${v}\"; ln -s '{o}/dirs' \"${v}\"; "));
    }
    plant.push_str("echo planted");
    let done = run(h.hub(), "plant-3", &plant).await;
    assert!(completed(&done), "{done}");
    let before = snapshot(&out);
    let mut probe = String::new();
    for v in OTHERS {
        probe.push_str(&format!("echo x > \"${v}/written-{v}\" 2>&1; "));
    }
    probe.push_str("echo probed");
    let done = run(h.hub(), "probe-3", &probe).await;
    assert!(completed(&done), "{done}");
    assert_eq!(snapshot(&out), before, "written through a link");
    h.finish().await;
}
