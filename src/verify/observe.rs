//! Workspace observations: what an attempt actually changed.
//!
//! Owns the before/after [`Snapshot`] of the workspace and their diff into short lines
//! ("added: src/x.rs (+12 lines)", "HEAD moved to 1a2b3c4", "workspace unchanged"). The
//! list goes into the corrective prompt, the attempt's record, the no-progress rule and the
//! `llm_judge` check (which sees these lines, never the repository).
//!
//! In a git work tree the snapshot is HEAD plus a content hash of every file
//! `git status` reports; elsewhere it is a walk (size, mtime, hash) skipping `.git`,
//! `target` and `node_modules`. Git runs through [`crate::process::run`] with argv; file
//! reading and hashing run on `spawn_blocking`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::process::{self, ChildEnv, CommandSpec, Limits};

/// The one observation meaning "nothing changed".
pub const UNCHANGED: &str = "workspace unchanged";

/// Directories a walk never enters (build output and dependencies are not the work).
const IGNORED_DIRS: &[&str] = &[".git", "target", "node_modules"];

/// Files larger than this are compared by size and mtime only.
const MAX_HASHED_BYTES: u64 = 8 * 1024 * 1024;

/// A walk stops after this many files, so a huge tree cannot stall verification.
const MAX_WALK_FILES: usize = 50_000;

/// One file's state in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub size: u64,
    pub mtime_ns: i128,
    /// Hex SHA-256 of the content; empty for an absent file or one too large to hash.
    pub hash: String,
    /// Newline count (text files), for "+N lines" when the file is new or gone.
    pub lines: u64,
    pub exists: bool,
}

/// The workspace at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snapshot {
    /// A git work tree: HEAD, and the state of every file `git status` lists (by path).
    Git {
        head: Option<String>,
        /// path → (two-letter porcelain status, state)
        dirty: BTreeMap<String, (String, FileState)>,
    },
    /// Not a git work tree: every file under the workspace.
    Walk { files: BTreeMap<String, FileState> },
}

/// Whether `observations` say the attempt changed nothing.
pub fn is_unchanged(observations: &[String]) -> bool {
    observations.iter().all(|o| o == UNCHANGED)
}

async fn git(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    args: &[&str],
) -> Option<String> {
    let spec = CommandSpec::new("git", ws, env.clone())
        .arg("-C")
        .arg(ws)
        .args(args.iter().copied());
    let limits = Limits {
        timeout: Some(Duration::from_secs(30)),
        grace: Duration::from_millis(500),
        output_cap: 4 * 1024 * 1024,
    };
    match process::run(&spec, &limits, cancel, None).await {
        Ok(o) if o.exit.success() => Some(o.stdout),
        _ => None,
    }
}

/// Take a snapshot of `ws`.
pub async fn snapshot(ws: &Path, env: &ChildEnv, cancel: &CancellationToken) -> Snapshot {
    // Found the way git finds it (a `.git` dir or file in the workspace or above), without
    // spawning git: this runs twice per attempt.
    let probe = ws.to_path_buf();
    let in_git = tokio::task::spawn_blocking(move || {
        probe
            .ancestors()
            .any(|dir| dir.join(".git").symlink_metadata().is_ok())
    })
    .await
    .unwrap_or(false);
    if !in_git {
        let root = ws.to_path_buf();
        let files = tokio::task::spawn_blocking(move || walk(&root))
            .await
            .unwrap_or_default();
        return Snapshot::Walk { files };
    }
    let head = git(ws, env, cancel, &["rev-parse", "HEAD"])
        .await
        .map(|s| s.trim().to_string());
    let status = git(
        ws,
        env,
        cancel,
        &["status", "--porcelain", "-z", "--untracked-files=all"],
    )
    .await
    .unwrap_or_default();
    let entries = parse_porcelain_z(&status);
    let root = ws.to_path_buf();
    let dirty = tokio::task::spawn_blocking(move || {
        entries
            .into_iter()
            .map(|(code, path)| {
                let st = file_state(&root.join(&path));
                (path, (code, st))
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    Snapshot::Git { head, dirty }
}

/// `git status --porcelain -z`: `XY path\0`, renames followed by `orig\0`.
fn parse_porcelain_z(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut it = s.split('\0');
    while let Some(entry) = it.next() {
        if entry.len() < 4 {
            continue;
        }
        let code = entry[..2].to_string();
        out.push((code.clone(), entry[3..].to_string()));
        if code.starts_with('R') || code.starts_with('C') {
            it.next(); // the original path of a rename/copy
        }
    }
    out
}

fn file_state(path: &Path) -> FileState {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return FileState {
            size: 0,
            mtime_ns: 0,
            hash: String::new(),
            lines: 0,
            exists: false,
        };
    };
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let (hash, lines) = if meta.is_file() && meta.len() <= MAX_HASHED_BYTES {
        match std::fs::read(path) {
            Ok(bytes) => (
                hex(&Sha256::digest(&bytes)),
                bytes.iter().filter(|b| **b == b'\n').count() as u64
                    + u64::from(!bytes.is_empty() && !bytes.ends_with(b"\n")),
            ),
            Err(_) => (String::new(), 0),
        }
    } else if meta.is_dir() {
        ("dir".into(), 0)
    } else {
        (String::new(), 0)
    };
    FileState {
        size: meta.len(),
        mtime_ns,
        hash,
        lines,
        exists: true,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn walk(root: &Path) -> BTreeMap<String, FileState> {
    let mut files = BTreeMap::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if !IGNORED_DIRS.iter().any(|d| name == *d) {
                    stack.push(e.path());
                }
                continue;
            }
            if files.len() >= MAX_WALK_FILES {
                return files;
            }
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            files.insert(rel, file_state(&p));
        }
    }
    files
}

/// Snapshot `ws` again and describe what changed since `before`.
pub async fn observe(
    before: &Snapshot,
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    let after = snapshot(ws, env, cancel).await;
    let mut obs = Vec::new();
    match (before, &after) {
        (
            Snapshot::Git {
                head: h0,
                dirty: d0,
            },
            Snapshot::Git {
                head: h1,
                dirty: d1,
            },
        ) => {
            if h0 != h1 {
                if let Some(h) = h1 {
                    obs.push(format!("HEAD moved to {}", &h[..h.len().min(7)]));
                    if let Some(old) = h0 {
                        if let Some(ns) = git(ws, env, cancel, &["diff", "--numstat", old, h]).await
                        {
                            for (path, add, del) in parse_numstat(&ns) {
                                obs.push(format!("committed: {path} (+{add} −{del})"));
                            }
                        }
                    }
                }
            }
            let numstat: BTreeMap<String, (String, String)> = match h1 {
                Some(_) => git(ws, env, cancel, &["diff", "--numstat", "HEAD"])
                    .await
                    .map(|s| {
                        parse_numstat(&s)
                            .into_iter()
                            .map(|(p, a, d)| (p, (a, d)))
                            .collect()
                    })
                    .unwrap_or_default(),
                None => BTreeMap::new(),
            };
            let paths: BTreeSet<&String> = d0.keys().chain(d1.keys()).collect();
            for path in paths {
                let line = match (d0.get(path), d1.get(path)) {
                    (Some((_, a)), Some((code, b))) if a != b => {
                        Some(describe_git(path, code, b, a.lines, &numstat))
                    }
                    (None, Some((code, b))) => Some(describe_git(path, code, b, 0, &numstat)),
                    // Dirty before, clean now: reverted or committed.
                    (Some(_), None) if h0 == h1 => Some(format!("reverted: {path}")),
                    _ => None,
                };
                obs.extend(line);
            }
        }
        (Snapshot::Walk { files: f0 }, Snapshot::Walk { files: f1 }) => {
            let paths: BTreeSet<&String> = f0.keys().chain(f1.keys()).collect();
            for path in paths {
                match (f0.get(path), f1.get(path)) {
                    (None, Some(b)) => obs.push(format!("added: {path} (+{} lines)", b.lines)),
                    (Some(a), None) => obs.push(format!("deleted: {path} (−{} lines)", a.lines)),
                    (Some(a), Some(b)) if changed(a, b) => obs.push(format!(
                        "modified: {path} ({} → {} lines)",
                        a.lines, b.lines
                    )),
                    _ => {}
                }
            }
        }
        _ => obs.push("workspace became (or stopped being) a git repository".into()),
    }
    if obs.is_empty() {
        obs.push(UNCHANGED.into());
    }
    obs
}

fn changed(a: &FileState, b: &FileState) -> bool {
    if !a.hash.is_empty() && !b.hash.is_empty() {
        a.hash != b.hash
    } else {
        a.size != b.size || a.mtime_ns != b.mtime_ns
    }
}

fn describe_git(
    path: &str,
    code: &str,
    now: &FileState,
    lines_before: u64,
    numstat: &BTreeMap<String, (String, String)>,
) -> String {
    if !now.exists || code.contains('D') {
        return format!("deleted: {path}");
    }
    if code == "??" || code.contains('A') {
        return format!("added: {path} (+{} lines)", now.lines);
    }
    match numstat.get(path) {
        Some((a, d)) => format!("modified: {path} (+{a} −{d} vs HEAD)"),
        None => format!("modified: {path} ({lines_before} → {} lines)", now.lines),
    }
}

fn parse_numstat(s: &str) -> Vec<(String, String, String)> {
    s.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, '\t');
            Some((
                it.next()?.to_string(),
                it.next()?.to_string(),
                it.next()?.to_string(),
            ))
        })
        .map(|(a, d, p)| (p, a, d))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn walk_reports_added_modified_deleted_and_ignores_build_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::write(ws.join("keep.txt"), "a\nb\n").unwrap();
        std::fs::write(ws.join("gone.txt"), "1\n2\n3\n").unwrap();
        std::fs::write(ws.join("same.txt"), "s\n").unwrap();
        let env = ChildEnv::inherit();
        let c = CancellationToken::new();
        let before = snapshot(ws, &env, &c).await;
        assert!(matches!(before, Snapshot::Walk { .. }));
        assert_eq!(
            observe(&before, ws, &env, &c).await,
            vec![UNCHANGED.to_string()]
        );
        std::fs::write(ws.join("keep.txt"), "a\nb\nc\n").unwrap();
        std::fs::remove_file(ws.join("gone.txt")).unwrap();
        std::fs::create_dir_all(ws.join("src")).unwrap();
        std::fs::write(ws.join("src/new.rs"), "x\ny\n").unwrap();
        std::fs::create_dir_all(ws.join("target/debug")).unwrap();
        std::fs::write(ws.join("target/debug/junk"), "j").unwrap();
        let obs = observe(&before, ws, &env, &c).await;
        assert_eq!(
            obs,
            vec![
                "deleted: gone.txt (−3 lines)".to_string(),
                "modified: keep.txt (2 → 3 lines)".to_string(),
                "added: src/new.rs (+2 lines)".to_string(),
            ]
        );
        assert!(!is_unchanged(&obs));
    }

    #[tokio::test]
    async fn git_reports_changes_and_head_moves() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        crate::verify::test_support::git(ws, &["init", "-q"]);
        std::fs::write(ws.join("a.txt"), "1\n2\n").unwrap();
        crate::verify::test_support::git(ws, &["add", "."]);
        crate::verify::test_support::git(ws, &["commit", "-qm", "init"]);
        let env = ChildEnv::inherit();
        let c = CancellationToken::new();
        let before = snapshot(ws, &env, &c).await;
        assert!(matches!(before, Snapshot::Git { .. }));
        assert_eq!(
            observe(&before, ws, &env, &c).await,
            vec![UNCHANGED.to_string()]
        );
        std::fs::write(ws.join("a.txt"), "1\n2\n3\n").unwrap();
        std::fs::write(ws.join("b.txt"), "new\n").unwrap();
        let obs = observe(&before, ws, &env, &c).await;
        assert_eq!(
            obs,
            vec![
                "modified: a.txt (+1 −0 vs HEAD)".to_string(),
                "added: b.txt (+1 lines)".to_string()
            ]
        );
        let before = snapshot(ws, &env, &c).await;
        crate::verify::test_support::git(ws, &["add", "."]);
        crate::verify::test_support::git(ws, &["commit", "-qm", "more"]);
        let obs = observe(&before, ws, &env, &c).await;
        assert!(obs[0].starts_with("HEAD moved to "), "{obs:?}");
        assert!(
            obs.iter().any(|o| o == "committed: b.txt (+1 −0)"),
            "{obs:?}"
        );
    }
}
