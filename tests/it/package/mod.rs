//! The Debian package (`cargo deb`, metadata in Cargo.toml, files under `pkg/`): what it is
//! made of, and the package itself installed, run, upgraded and removed in a clean Debian 12.
//!
//! # Layout
//!
//! - `assets.rs`: the man page and completions are the clap definition's, and the built
//!   package holds what it must (lintian included) — or says why it cannot be checked.
//! - `apt.rs`: the package under `apt` and systemd in a fresh Debian 12 root.

mod apt;
mod assets;

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The newest `.deb` `cargo deb` left in target/debian, if any. Tests that need one skip
/// without it: building it is a release build (minutes), done by `.ci/run` before the tests.
fn built_deb() -> Option<PathBuf> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("debian");
    let mut debs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "deb")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("hub-sidecar_"))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    debs.sort();
    debs.pop().map(|(_, p)| p)
}

/// The skip message for a test that needs the package, when there is none.
fn no_deb() -> String {
    "no package in target/debian: build it with `cargo deb` (cargo install cargo-deb --locked)"
        .to_string()
}

/// `cmd args` succeeded: its stdout; else a panic with both outputs.
fn run_ok(cmd: &str, args: &[&str], dir: Option<&Path>) -> String {
    let mut c = std::process::Command::new(cmd);
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd} {}: {}\n{text}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
