//! The start-up link order (`scripts/link-order.txt`, handed to the linker by
//! `scripts/build.rs`) still covers the daemon's start path: of the functions of the release
//! binary that run from `exec` to `identify` (and the stop after it), at least 95 % must be
//! named in the file. Names change with the code (a module moved, a function renamed, a new
//! step on the path), and a name the file lacks is a function the linker scatters over the
//! binary's 7 MB of code, so an idle daemon keeps more of it resident (BENCHMARKS.md, figure
//! 2) and starts slower (figure 1). When this fails, run `bash scripts/link-order.sh`.
//!
//! Needs the release binary the package is built from (`.ci/run` builds it with `cargo deb`
//! before the tests; names of a debug build differ) and valgrind (callgrind lists every
//! function run).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::SystemTime;

use hub_sidecar::mock_hub::MockHub;

use crate::util::*;

const TOKEN: &str = "tok-link-order-5d1e";
/// Share of the start path the file must name.
const MIN_COVERAGE: f64 = 0.95;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The newest modification time under `dir` (files only).
fn newest(dir: &Path) -> SystemTime {
    let mut t = SystemTime::UNIX_EPOCH;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let m = if p.is_dir() {
                newest(&p)
            } else {
                e.metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH)
            };
            t = t.max(m);
        }
    }
    t
}

/// The release binary built from these sources, or why the test cannot run.
fn release_binary() -> Result<PathBuf, String> {
    let bin = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("release/hub-sidecar");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .map_err(|_| {
            format!(
                "no release binary at {} (`cargo deb` or `cargo build --release --bins` builds it)",
                bin.display()
            )
        })?;
    let sources = newest(&repo().join("src")).max(
        std::fs::metadata(repo().join("scripts/link-order.txt"))
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH),
    );
    // Function names come from the symbol table; a stripped copy has none.
    let image = std::fs::read(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    if !image.windows(8).any(|w| w == b".symtab\0") {
        return Err(format!(
            "{} is stripped: no function names to check",
            bin.display()
        ));
    }
    if built < sources {
        return Err(format!(
            "{} is older than the sources: rebuild it (`cargo build --release --bins`)",
            bin.display()
        ));
    }
    Ok(bin)
}

/// The functions of `object` that a callgrind profile ran (names as the linker knows them:
/// `--demangle=no`). Callgrind compresses names: `fn=(12) name` defines id 12, a later
/// `fn=(12)` reuses it; recursion levels come as `name'2`.
fn functions_run(profile: &str, object: &str) -> HashSet<String> {
    let mut obs = std::collections::HashMap::new();
    let mut fns = std::collections::HashMap::new();
    let mut current_ob = String::new();
    let mut run = HashSet::new();
    for line in profile.lines() {
        let Some((key, rest)) = line.split_once('=') else {
            continue;
        };
        if !matches!(key, "ob" | "cob" | "fn" | "cfn") || !rest.starts_with('(') {
            continue;
        }
        let Some((id, name)) = rest[1..].split_once(')') else {
            continue;
        };
        let name = name.trim_start();
        let table = if key.ends_with("ob") {
            &mut obs
        } else {
            &mut fns
        };
        if !name.is_empty() {
            table.insert(id.to_string(), name.to_string());
        }
        let named = table.get(id).cloned().unwrap_or_default();
        match key {
            "ob" => current_ob = named,
            "fn" if current_ob == object => {
                let base = named.split('\'').next().unwrap_or("");
                // What a symbol ordering file can name (as `scripts/link-order.sh` keeps):
                // Rust's symbols and the entry points, not callgrind's `(below main)` or the
                // bare addresses of code without a symbol.
                if base.starts_with("_Z") || base.starts_with("_R") || base == "main" {
                    run.insert(base.to_string());
                }
            }
            _ => {}
        }
    }
    run
}

#[tokio::test]
async fn the_link_order_covers_the_start_path() {
    if !crate::util::require("valgrind", crate::util::missing_tool("valgrind")) {
        return;
    }
    // The release binary `cargo deb` builds (the `deb` requirement).
    let bin = release_binary();
    if !crate::util::require("deb", bin.as_ref().err().cloned()) {
        return;
    }
    let Ok(bin) = bin else { return };
    let bin = std::fs::canonicalize(&bin).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let hub = MockHub::start(hub_sidecar::mock_hub::MockHubOptions {
        agents: vec![("sidecar-test".into(), TOKEN.into())],
        ..Default::default()
    })
    .await
    .unwrap();
    let config = write_config(&hub, dir, TOKEN, "");
    let profile = dir.join("callgrind.out");
    let mut daemon = tokio::process::Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--demangle=no")
        .arg("--dump-instr=no")
        .arg(format!("--callgrind-out-file={}", profile.display()))
        .arg(&bin)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    hub.wait_for_type("identify", std::time::Duration::from_secs(120))
        .await
        .expect("the daemon under valgrind never identified");
    // A clean stop, so callgrind writes its profile.
    let pid = daemon.id().unwrap().to_string();
    let _ = std::process::Command::new("kill").arg(&pid).status();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(120), daemon.wait()).await;
    let text = std::fs::read_to_string(&profile).expect("callgrind wrote no profile");
    let run = functions_run(&text, &bin.to_string_lossy());
    assert!(
        run.len() > 100,
        "too few functions in the profile: {}",
        run.len()
    );
    let listed: HashSet<String> = std::fs::read_to_string(repo().join("scripts/link-order.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut missing: Vec<&String> = run.iter().filter(|f| !listed.contains(*f)).collect();
    missing.sort();
    let coverage = 1.0 - missing.len() as f64 / run.len() as f64;
    eprintln!(
        "link order: {:.1} % of the {} functions on the start path are named",
        coverage * 100.0,
        run.len()
    );
    assert!(
        coverage >= MIN_COVERAGE,
        "scripts/link-order.txt names {:.1} % of the {} functions on the start path (at least {:.0} % wanted): run `bash scripts/link-order.sh`. Missing, first 40:\n{}",
        coverage * 100.0,
        run.len(),
        MIN_COVERAGE * 100.0,
        missing
            .iter()
            .take(40)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
