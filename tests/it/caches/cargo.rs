//! cargo fetches a dependency once into the repository's `CARGO_HOME` (from a git remote, and
//! from a sparse registry), and the next task builds offline with the source gone.

use std::collections::HashMap;
use std::path::Path;

use serde_json::json;

use super::{can_run, completed, only_cache, open_cfg, run, tar_gz};
use crate::git::git;
use crate::harness::Harness;
use crate::loopback::Loopback;

/// The dependency's code: `two() == 2`.
const TWO: &str = "pub fn two() -> i32 { 2 }\n";

/// A crate `name` 0.1.0 in `dir`: `lib_rs` as its `src/lib.rs`, `deps` its `[dependencies]`.
fn write_crate(dir: &Path, name: &str, deps: &str, lib_rs: &str) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n{deps}"),
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), lib_rs).unwrap();
}

/// `cargo test` twice: the first fetches and builds; then `gone` takes the dependency's
/// source away and the build goes too, and the second, offline, builds from the repository's
/// `CARGO_HOME` alone, whose `has` subdirectory the first filled.
async fn test_then_offline(h: &crate::harness::Harness, ws: &Path, has: &str, gone: impl FnOnce()) {
    let first = run(h.hub(), "cargo-1", "cargo test -q 2>&1").await;
    assert!(completed(&first), "{first}");
    assert!(
        std::fs::read_dir(only_cache(h.dir()).join("cargo").join(has))
            .is_ok_and(|mut d| d.next().is_some()),
        "cargo's {has} is in the repository's cache"
    );
    gone();
    std::fs::remove_dir_all(ws.join("target")).unwrap();
    let second = run(h.hub(), "cargo-2", "cargo test -q --offline 2>&1").await;
    assert!(completed(&second), "{second}");
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
    write_crate(&src, "dep", "", TWO);
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
    write_crate(
        &ws,
        "app",
        &format!("dep = {{ git = \"file://{}\" }}\n", bare.display()),
        "#[test]\nfn four() { assert_eq!(dep::two() * 2, 4); }\n",
    );
    let h = s.start(c).await;
    // The remote goes: only the cache can provide the dependency.
    test_then_offline(&h, &ws, "git/db", || {
        std::fs::rename(&bare, dir.join("dep.git.gone")).unwrap()
    })
    .await;
    h.finish().await;
}

/// A crate registry stand-in: the sparse index protocol (`config.json`, one index file per
/// crate) and its `.crate` tarball, for the crate `tinydep` 0.1.0 (`two() == 2`). Returns the
/// server and where the tarball is served.
async fn sparse_registry(dir: &Path) -> (Loopback, &'static str) {
    const CRATE: &str = "/dl/tinydep-0.1.0.crate";
    write_crate(&dir.join("crate/tinydep-0.1.0"), "tinydep", "", TWO);
    // A `.crate` is a gzip'd tar of `<name>-<version>/`.
    let bytes = tar_gz(&dir.join("crate"), "tinydep-0.1.0");
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
    let (mut c, ws) = open_cfg(&s);
    c.env.deny.push("CARGO_TARGET_DIR".into());
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
    write_crate(
        &ws,
        "app",
        "tinydep = \"0.1\"\n",
        "#[test]\nfn four() { assert_eq!(tinydep::two() * 2, 4); }\n",
    );
    let h = s.start(c).await;
    let fetched = |r: &Loopback| r.hits().iter().any(|p| p == tarball);
    // The registry goes: only the cache can provide the crate.
    test_then_offline(&h, &ws, "registry/cache", || {
        assert!(fetched(&registry), "{:?}", registry.hits());
        drop(registry)
    })
    .await;
    h.finish().await;
}
