//! cargo fetches a dependency once into the repository's `CARGO_HOME` (from a git remote, and
//! from a sparse registry), and the next task builds offline with the source gone.

use std::collections::HashMap;
use std::path::Path;

use serde_json::json;

use super::{can_run, completed, only_cache, run};
use crate::git::git;
use crate::harness::Harness;
use crate::loopback::Loopback;

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

/// A crate registry stand-in: the sparse index protocol (`config.json`, one index file per
/// crate) and its `.crate` tarball, for the crate `tinydep` 0.1.0 (`two() == 2`). Returns the
/// server and where the tarball is served.
async fn sparse_registry(dir: &Path) -> (Loopback, &'static str) {
    const CRATE: &str = "/dl/tinydep-0.1.0.crate";
    let pkg = dir.join("crate/tinydep-0.1.0");
    std::fs::create_dir_all(pkg.join("src")).unwrap();
    std::fs::write(
        pkg.join("Cargo.toml"),
        "[package]\nname = \"tinydep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(pkg.join("src/lib.rs"), "pub fn two() -> i32 { 2 }\n").unwrap();
    // A `.crate` is a gzip'd tar of `<name>-<version>/`.
    let tarball = dir.join("tinydep-0.1.0.crate");
    let ok = std::process::Command::new("tar")
        .arg("czf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir.join("crate"))
        .arg("tinydep-0.1.0")
        .status()
        .unwrap();
    assert!(ok.success());
    let bytes = std::fs::read(&tarball).unwrap();
    let cksum: String = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let server = Loopback::serve(|url| {
        let config = json!({ "dl": format!("{url}/dl/{{crate}}-{{version}}.crate") });
        let entry = json!({
            "name": "tinydep", "vers": "0.1.0", "deps": [], "cksum": cksum,
            "features": {}, "yanked": false
        });
        HashMap::from([
            (
                "/index/config.json".to_string(),
                config.to_string().into_bytes(),
            ),
            // Names of four or more characters: `<first two>/<next two>/<name>`.
            (
                "/index/ti/ny/tinydep".to_string(),
                format!("{entry}\n").into_bytes(),
            ),
            (CRATE.to_string(), bytes),
        ])
    })
    .await;
    (server, CRATE)
}

#[tokio::test]
async fn cargo_fetches_a_registry_crate_once_and_the_next_task_builds_offline() {
    if !can_run(&["cargo", "tar"]) {
        return;
    }
    let s = Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let (registry, tarball) = sparse_registry(&dir).await;
    let (mut c, ws) = s.cfg_with_workspace();
    c.env.deny.push("CARGO_TARGET_DIR".into());
    // The registry stands in on this host's loopback, which only `open` reaches.
    c.network.mode = hub_sidecar::config::NetworkMode::Open;
    // The repository's own cargo config replaces crates.io with the stand-in, as a project
    // behind a mirror does.
    std::fs::create_dir_all(ws.join(".cargo")).unwrap();
    std::fs::write(
        ws.join(".cargo/config.toml"),
        format!(
            "[source.crates-io]\nreplace-with = \"stand-in\"\n\n[source.stand-in]\nregistry = \"sparse+{}/index/\"\n",
            registry.url()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(
        ws.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\ntinydep = \"0.1\"\n",
    )
    .unwrap();
    std::fs::write(
        ws.join("src/lib.rs"),
        "#[test]\nfn four() { assert_eq!(tinydep::two() * 2, 4); }\n",
    )
    .unwrap();
    let h = s.start(c).await;

    let first = run(h.hub(), "crate-1", "cargo test -q 2>&1").await;
    assert!(completed(&first), "{first}");
    assert!(
        registry.hits().iter().any(|p| p == tarball),
        "{:?}",
        registry.hits()
    );
    assert!(
        std::fs::read_dir(only_cache(&dir).join("cargo/registry/cache"))
            .is_ok_and(|mut d| d.next().is_some()),
        "the crate is in the repository's CARGO_HOME"
    );

    // The registry is gone and so is the build: only the cache can provide the crate.
    drop(registry);
    std::fs::remove_dir_all(ws.join("target")).unwrap();
    let second = run(h.hub(), "crate-2", "cargo test -q --offline 2>&1").await;
    assert!(completed(&second), "{second}");
    h.finish().await;
}
