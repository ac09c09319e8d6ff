//! Real package managers fetch, build and test under strict containment, each into the
//! repository's own cache under the state directory, and a second task on the same
//! repository reuses what the first downloaded: the first task's source (a git remote, a
//! registry stand-in's tarball or wheel) is gone by then, so only the cache can serve it.
//!
//! Offline: every "registry" is a local bare repository or a loopback server. A test whose
//! toolchain is missing (or invisible to this user) says so and returns.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use hub_sidecar::mock_hub::{sample_shell_task, MockHub};
use serde_json::{json, Value};

use crate::git::git;
use crate::harness::Harness;
use crate::loopback::Loopback;

/// Builds and downloads take longer than the usual frame wait on a loaded machine.
const BUILD: Duration = Duration::from_secs(300);

/// `false` (and a message) where containment or a tool is missing here.
fn can_run(tools: &[&str]) -> bool {
    if !crate::containment::supported() {
        return false;
    }
    for tool in tools {
        let works = std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !works {
            eprintln!("skipped: `{tool}` is not installed (or not usable by this user)");
            return false;
        }
    }
    true
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

/// The one repository cache the tasks of these tests used.
fn only_cache(state: &Path) -> std::path::PathBuf {
    let all: Vec<_> = std::fs::read_dir(state.join("caches"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].clone()
}

#[tokio::test]
async fn cargo_fetches_a_git_dependency_once_and_the_next_task_builds_offline() {
    if !can_run(&["cargo", "git"]) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    // The dependency: a crate in a local bare repository (a git remote stand-in).
    let src = dir.join("dep-src");
    std::fs::create_dir_all(src.join("src")).unwrap();
    std::fs::write(
        src.join("Cargo.toml"),
        "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(src.join("src/lib.rs"), "pub fn two() -> i32 { 2 }\n").unwrap();
    git(&src, &["init", "-q"]);
    git(&src, &["add", "."]);
    git(&src, &["commit", "-qm", "dep"]);
    let bare = dir.join("dep.git");
    git(&dir, &["clone", "-q", "--bare", "dep-src", "dep.git"]);
    let (mut c, ws) = s.cfg_with_workspace();
    // A developer's exported CARGO_TARGET_DIR would point the build outside the workspace.
    c.env.deny.push("CARGO_TARGET_DIR".into());
    // The operator lets tasks read the local remote, as they would a mirror.
    c.sandbox.read_paths.push(bare.clone());
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(
        ws.join("Cargo.toml"),
        format!(
            "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ndep = {{ git = \"file://{}\" }}\n",
            bare.display()
        ),
    )
    .unwrap();
    std::fs::write(
        ws.join("src/lib.rs"),
        "#[test]\nfn four() { assert_eq!(dep::two() * 2, 4); }\n",
    )
    .unwrap();
    let h = s.start(c).await;

    let first = run(h.hub(), "cargo-1", "cargo test -q 2>&1").await;
    assert!(completed(&first), "{first}");
    let cache = only_cache(&dir);
    assert!(
        std::fs::read_dir(cache.join("cargo/git/db")).is_ok_and(|mut d| d.next().is_some()),
        "cargo's git database is in the repository's cache"
    );

    // The remote and the build are gone: only the cache can provide the dependency.
    std::fs::rename(&bare, dir.join("dep.git.gone")).unwrap();
    std::fs::remove_dir_all(ws.join("target")).unwrap();
    let second = run(h.hub(), "cargo-2", "cargo test -q --offline 2>&1").await;
    assert!(completed(&second), "{second}");
    h.finish().await;
}

#[tokio::test]
async fn npm_installs_from_a_registry_and_the_next_task_installs_from_the_cache() {
    js_installs_then_reuses_the_cache(
        &["npm", "node", "tar"],
        "npm install --no-audit --no-fund 2>&1 && npm test 2>&1",
        "package-lock.json",
        "npm/_cacache",
    )
    .await;
}

#[tokio::test]
async fn pnpm_installs_from_a_registry_and_the_next_task_installs_from_its_store() {
    js_installs_then_reuses_the_cache(
        &["pnpm", "node", "tar"],
        "pnpm install 2>&1 && pnpm test 2>&1",
        "pnpm-lock.yaml",
        "pnpm-store",
    )
    .await;
}

/// A JavaScript package manager (`tools[0]`) installs a one-dependency project from a
/// loopback registry under containment with its cache in the repository's (`cache`, under
/// the repository's cache directory), and the next task installs it again with the registry
/// no longer serving the tarball: from that cache.
async fn js_installs_then_reuses_the_cache(
    tools: &[&str],
    install: &str,
    lockfile: &str,
    cache: &str,
) {
    if !can_run(tools) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let pkg = dir.join("pkg/package");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("package.json"),
        r#"{"name":"tinydep","version":"1.0.0","main":"index.js"}"#,
    )
    .unwrap();
    std::fs::write(pkg.join("index.js"), "module.exports = 42;\n").unwrap();
    let tgz = dir.join("tinydep-1.0.0.tgz");
    let ok = std::process::Command::new("tar")
        .arg("czf")
        .arg(&tgz)
        .arg("-C")
        .arg(dir.join("pkg"))
        .arg("package")
        .status()
        .unwrap();
    assert!(ok.success());
    let tarball = std::fs::read(&tgz).unwrap();
    let integrity = {
        use base64::Engine as _;
        use sha2::Digest as _;
        format!(
            "sha512-{}",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(&tarball))
        )
    };
    let registry = Loopback::serve(|url| {
        let packument = json!({
            "name": "tinydep",
            "dist-tags": {"latest": "1.0.0"},
            "versions": {"1.0.0": {
                "name": "tinydep", "version": "1.0.0", "main": "index.js",
                "dist": {"tarball": format!("{url}/tinydep/-/tinydep-1.0.0.tgz"), "integrity": integrity}
            }}
        });
        HashMap::from([
            ("/tinydep".to_string(), packument.to_string().into_bytes()),
            ("/tinydep/-/tinydep-1.0.0.tgz".to_string(), tarball),
        ])
    })
    .await;
    let (mut c, ws) = s.cfg_with_workspace();
    // The registry stands in on this host's loopback, which only `open` reaches (under
    // the default allowlist a task's own namespace has its own loopback).
    c.network.mode = hub_sidecar::config::NetworkMode::Open;
    std::fs::write(
        ws.join("package.json"),
        r#"{"name":"app","version":"1.0.0","dependencies":{"tinydep":"1.0.0"},
            "scripts":{"test":"node -e \"process.exit(require('tinydep') === 42 ? 0 : 1)\""}}"#,
    )
    .unwrap();
    std::fs::write(ws.join(".npmrc"), format!("registry={}/\n", registry.url())).unwrap();
    let h = s.start(c).await;

    let first = run(h.hub(), &format!("{}-1", tools[0]), install).await;
    assert!(completed(&first), "{first}");
    assert!(
        only_cache(&dir).join(cache).is_dir(),
        "{} used the repository's cache",
        tools[0]
    );

    // The registry stops serving the tarball: the second install must find it in the cache.
    registry.remove("/tinydep/-/tinydep-1.0.0.tgz");
    std::fs::remove_dir_all(ws.join("node_modules")).unwrap();
    std::fs::remove_file(ws.join(lockfile)).unwrap();
    let tarball_fetches = |r: &Loopback| r.hits().iter().filter(|p| p.ends_with(".tgz")).count();
    let before = tarball_fetches(&registry);
    let second = run(h.hub(), &format!("{}-2", tools[0]), install).await;
    assert!(completed(&second), "{second}");
    assert_eq!(
        tarball_fetches(&registry),
        before,
        "the tarball came from the cache"
    );
    h.finish().await;
}

/// A pure-python wheel (`tinywheel`, `VALUE = 7`), made with python's own zipfile.
fn make_wheel(dir: &Path) -> Vec<u8> {
    let path = dir.join("tinywheel-1.0-py3-none-any.whl");
    let script = r#"
import sys, zipfile
files = {
    "tinywheel/__init__.py": "VALUE = 7\n",
    "tinywheel-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinywheel\nVersion: 1.0\n",
    "tinywheel-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + "tinywheel-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("tinywheel-1.0.dist-info/RECORD", record)
"#;
    let ok = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::read(path).unwrap()
}

/// Where [`wheel_index`] serves the wheel.
const WHEEL: &str = "/files/tinywheel-1.0-py3-none-any.whl";

/// A loopback package index (PEP 503 simple page) serving one wheel, `tinywheel`, at
/// [`WHEEL`], with its sha256 in the link as pip and uv check it.
async fn wheel_index(dir: &Path) -> Loopback {
    let wheel = make_wheel(dir);
    let sha = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&wheel)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    Loopback::serve(|url| {
        let page = format!(
            "<html><body><a href=\"{url}{WHEEL}#sha256={sha}\">tinywheel-1.0-py3-none-any.whl</a></body></html>"
        );
        HashMap::from([
            ("/simple/tinywheel/".to_string(), page.into_bytes()),
            (WHEEL.to_string(), wheel),
        ])
    })
    .await
}

/// pip installs from a (loopback) index under containment, with its cache pointed into the
/// repository's. (pip 23 on the test machine stores no HTTP responses even unconfined, so
/// reuse across tasks is shown with cargo and npm; here, that pip is handed the cache.)
#[tokio::test]
async fn pip_installs_from_an_index_with_its_cache_in_the_repositorys() {
    if !can_run(&["python3"]) {
        return;
    }
    let venv_works = std::process::Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .status()
        .is_ok_and(|s| s.success());
    if !venv_works {
        eprintln!("skipped: python3 has no venv/ensurepip");
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let index = wheel_index(&dir).await;
    let (mut c, _ws) = s.cfg_with_workspace();
    // The index stands in on this host's loopback, which only `open` reaches.
    c.network.mode = hub_sidecar::config::NetworkMode::Open;
    let h = s.start(c).await;
    let cmd = format!(
        "python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check --index-url {}/simple/ tinywheel 2>&1 && .venv/bin/python -c 'import tinywheel; assert tinywheel.VALUE == 7' && .venv/bin/pip cache dir",
        index.url()
    );
    let done = run(h.hub(), "pip-1", &cmd).await;
    assert!(completed(&done), "{done}");
    assert!(
        index.hits().iter().any(|p| p == WHEEL),
        "the wheel came from the index"
    );
    let pip_cache = only_cache(&dir).join("pip");
    let out = done["result"]["output"].as_str().unwrap_or_default();
    assert!(
        out.lines().any(|l| Path::new(l.trim()) == pip_cache),
        "pip's cache is the repository's ({}): {out}",
        pip_cache.display()
    );
    h.finish().await;
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
        only_cache(&state).parent(),
        Some(state.join("caches").as_path())
    );
}

/// uv installs from a (loopback) index under containment into the repository's cache, and
/// the next task on the repository installs the same wheel with the index no longer serving
/// it: from the cache.
#[tokio::test]
async fn uv_installs_from_an_index_and_the_next_task_installs_from_the_cache() {
    if !can_run(&["uv", "python3"]) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let index = wheel_index(&dir).await;
    let (mut c, _ws) = s.cfg_with_workspace();
    // The index stands in on this host's loopback, which only `open` reaches.
    c.network.mode = hub_sidecar::config::NetworkMode::Open;
    let h = s.start(c).await;
    let install = |venv: &str| {
        format!(
            "rm -rf {venv} && uv venv -q --python python3 {venv} 2>&1 && uv pip install -q --python {venv}/bin/python --index-url {}/simple/ tinywheel 2>&1 && {venv}/bin/python -c 'import tinywheel; assert tinywheel.VALUE == 7' && echo \"cache=$UV_CACHE_DIR\"",
            index.url()
        )
    };
    let first = run(h.hub(), "uv-1", &install(".venv-a")).await;
    assert!(completed(&first), "{first}");
    assert!(
        index.hits().iter().any(|p| p == WHEEL),
        "the wheel came from the index"
    );
    let uv_cache = only_cache(&dir).join("uv");
    let out = first["result"]["output"].as_str().unwrap_or_default();
    assert!(
        out.contains(&format!("cache={}", uv_cache.display())),
        "uv's cache is the repository's ({}): {out}",
        uv_cache.display()
    );
    index.remove(WHEEL);
    let fetched = index.hits().iter().filter(|p| *p == WHEEL).count();
    let second = run(h.hub(), "uv-2", &install(".venv-b")).await;
    assert!(completed(&second), "installed from the cache: {second}");
    assert_eq!(
        index.hits().iter().filter(|p| *p == WHEEL).count(),
        fetched,
        "the second task fetched the wheel again"
    );
    h.finish().await;
}
