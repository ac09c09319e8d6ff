//! The manifest tells the truth: `rust-version` is at least what every locked dependency
//! declares, so an older toolchain fails with cargo's clear message, not a compile error.

use serde_json::Value;

fn version(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

#[test]
fn rust_version_covers_every_locked_dependency() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // The unprivileged run of the suite (scripts/test-unprivileged.sh) has no toolchain.
    let info = std::process::Command::new(&rustc).arg("-vV").output();
    let why = info
        .as_ref()
        .err()
        .map(|e| format!("cannot run {rustc}: {e}"));
    if !crate::util::require("rustc", why) {
        return;
    }
    let info = info.unwrap();
    let info = String::from_utf8_lossy(&info.stdout).to_string();
    let host = info
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc names its host");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // This platform only: the other platforms' crates need not be downloaded.
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours = packages
        .iter()
        .find(|p| p["name"] == "hub-sidecar")
        .and_then(|p| p["rust_version"].as_str())
        .expect("hub-sidecar declares rust-version");
    let needed = packages
        .iter()
        .filter_map(|p| Some((p["rust_version"].as_str()?, p["name"].as_str()?)))
        .max_by_key(|(v, _)| version(v))
        .unwrap();
    assert!(
        version(ours) >= version(needed.0),
        "rust-version {ours} is below {} needed by {}",
        needed.0,
        needed.1
    );
}
