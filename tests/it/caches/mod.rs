//! Real package managers fetch, build and test under strict containment, each into the
//! repository's own cache under the state directory, and a second task on the same
//! repository reuses what the first downloaded: the first task's source (a git remote, a
//! registry stand-in's tarball or wheel) is gone by then, so only the cache can serve it.
//!
//! Offline: every "registry" is a local bare repository or a loopback server. A test whose
//! toolchain is missing (or invisible to this user) says so and returns.
//!
//! # Layout
//!
//! - this file: the shared helpers and `run-task`'s state directory.
//! - `cargo.rs`: a git dependency and a (sparse) registry dependency.
//! - `go.rs`: Go modules from a module proxy.
//! - `js.rs`: npm, pnpm and yarn from an npm registry.
//! - `python.rs`: pip and uv from a package index.
//! - `links.rs`: what a task leaves in its cache tree is never followed (issue 35).

mod cargo;
mod go;
mod js;
mod links;
mod python;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hub_sidecar::config::Config;
use hub_sidecar::mock_hub::{sample_shell_task, MockHub};
use serde_json::Value;

use crate::harness::Setup;

/// Builds and downloads take longer than the usual frame wait on a loaded machine.
const BUILD: Duration = Duration::from_secs(300);

/// The caches tests' gate: containment and each tool (`require`: a listed skip, or a failure
/// where CI requires it).
fn can_run(tools: &[&str]) -> bool {
    crate::containment::supported()
        && tools
            .iter()
            .all(|t| crate::util::require(t, crate::util::missing_tool(t)))
}

/// The test config with its workspace, and the host's network for the tasks: the registry
/// stand-ins are on this host's loopback, which only `open` reaches (under the default
/// allowlist a task's own namespace has a loopback of its own).
fn open_cfg(s: &Setup) -> (Config, PathBuf) {
    let (mut c, ws) = s.cfg_with_workspace();
    c.network.mode = hub_sidecar::config::NetworkMode::Open;
    (c, ws)
}

/// Run `cmd` as a shell task and wait for its terminal frame.
async fn run(hub: &MockHub, id: &str, cmd: &str) -> Value {
    hub.assign(sample_shell_task(id, cmd));
    hub.wait_for(
        |f| (f["type"] == "task_complete" || f["type"] == "task_failed") && f["task_id"] == id,
        BUILD,
    )
    .await
    .unwrap_or_else(|| panic!("no terminal frame for {id}"))
}

fn completed(done: &Value) -> bool {
    done["type"] == "task_complete"
}

/// The tree of the one repository cache the tasks of these tests used (`caches/<key>/tree`).
fn only_cache(state: &Path) -> PathBuf {
    let all: Vec<_> = std::fs::read_dir(state.join("caches"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].join("tree")
}

/// `run-task` with a configured `state_dir` keeps its caches there: a second hand-run task on
/// the same workspace sees what the first left in its cache. (It used a fresh temporary state
/// directory each time, so nothing persisted.)
#[tokio::test]
async fn run_task_uses_the_configured_state_dir_so_hand_run_tasks_share_caches() {
    let dir = tempfile::tempdir().unwrap();
    let (state, ws) = (dir.path().join("state"), dir.path().join("ws"));
    let run_task = |id: &str, cmd: &str| {
        let task = dir.path().join(format!("{id}.json"));
        std::fs::write(&task, sample_shell_task(id, cmd).to_string()).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
            .arg("run-task")
            .arg(&task)
            .arg("--workspace")
            .arg(&ws)
            .env_remove("HUB_SIDECAR_CONFIG")
            .env("HUB_SIDECAR_STATE_DIR", &state)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    run_task(
        "first",
        "echo kept-between-tasks > \"$XDG_CACHE_HOME/marker\"",
    );
    let second = run_task("second", "cat \"$XDG_CACHE_HOME/marker\"");
    assert!(
        second["result"]["output"]
            .as_str()
            .unwrap_or_default()
            .contains("kept-between-tasks"),
        "{second}"
    );
    assert_eq!(
        only_cache(&state).parent().and_then(Path::parent),
        Some(state.join("caches").as_path())
    );
}

/// A task in a directory of its own (no `repo`, no `repo_dir`) gets no repository cache: the
/// directory dies with the task, so a cache keyed by it would never be used again, one more
/// directory for every task, each walked by every later prune (issue 30: 200 such tasks made
/// each task 15 ms slower). Its tools cache under the task's own HOME, gone with the task.
#[tokio::test]
async fn a_task_in_its_own_directory_leaves_no_repository_cache() {
    if !can_run(&[]) {
        return;
    }
    let s = Setup::new().await;
    let state = s.dir().to_path_buf();
    let cfg = s.cfg();
    let h = s.start(cfg).await;
    for id in ["own-1", "own-2"] {
        let done = run(&h, id, "echo cached > \"$XDG_CACHE_HOME/marker\"").await;
        assert!(completed(&done), "{done}");
    }
    let caches: Vec<_> = std::fs::read_dir(state.join("caches"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(caches.is_empty(), "{caches:?}");
    h.finish().await;
}

/// `name` (a directory in `dir`) as a gzip'd tar: an npm tarball, a `.crate`.
fn tar_gz(dir: &Path, name: &str) -> Vec<u8> {
    let out = dir.join(format!("{name}.tar.gz"));
    let ok = std::process::Command::new("tar")
        .arg("czf")
        .arg(&out)
        .arg("-C")
        .arg(dir)
        .arg(name)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::read(out).unwrap()
}
