//! Workspace observations: what an attempt actually changed.
//!
//! Owns the before/after [`Snapshot`] of the workspace and their diff into short lines
//! ("added: src/x.rs (+12 lines)", "HEAD moved to 1a2b3c4", "workspace unchanged"). The
//! list goes into the corrective prompt, the attempt's record, the no-progress rule and the
//! `llm_judge` check (which sees these lines, never the repository).
//!
//! In a git work tree the snapshot is HEAD plus a content hash of every file
//! `git status` reports — O(changed files); elsewhere it is a walk (size, mtime, hash)
//! skipping `.git`, `target` and `node_modules`, stopped at a cap. Git runs through
//! [`crate::process::run`] with argv and `-c safe.directory=<workspace>` (a workspace owned
//! by another user is the usual case under a service user); file reading and hashing run on
//! `spawn_blocking`.
//!
//! "Could not observe" is never "unchanged": when git cannot read the work tree the
//! snapshot falls back to the walk and says so; when the two snapshots cannot be compared the
//! list is one [`UNAVAILABLE_PREFIX`] line (the no-progress rule is off for that attempt and
//! `llm_judge` reports `error`). A walk past its cap or a `git status` past its output cap is
//! reported as such, never as deletions. The list is bounded ([`Limits::max_lines`]) with a
//! count of what was left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::process::{self, ChildEnv};

/// The one observation meaning "nothing changed".
pub const UNCHANGED: &str = "workspace unchanged";

/// The start of the one observation meaning "what changed is not known".
pub const UNAVAILABLE_PREFIX: &str = "observation unavailable: ";

/// Directories a walk never enters (build output and dependencies are not the work).
const IGNORED_DIRS: &[&str] = &[".git", "target", "node_modules"];

/// Files larger than this are compared by size and mtime only.
const MAX_HASHED_BYTES: u64 = 8 * 1024 * 1024;

/// Output kept from one git call; past it the listing is reported as incomplete.
const GIT_OUTPUT_CAP: usize = 16 * 1024 * 1024;

/// Bounds of one observation.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A walk stops after this many files, so a huge tree cannot stall verification.
    pub walk_cap: usize,
    /// Lines listed; the rest are counted ("… and 4,312 more changes not listed").
    pub max_lines: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            walk_cap: 50_000,
            max_lines: 200,
        }
    }
}

/// One file's state in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    /// Bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
    /// Hex SHA-256 of the content; empty for an absent file or one too large to hash.
    pub hash: String,
    /// Newline count (text files), for "+N lines" when the file is new or gone.
    pub lines: u64,
    /// Whether the file exists at all.
    pub exists: bool,
}

/// The workspace at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snapshot {
    /// A git work tree: HEAD, and the state of every file `git status` lists (by path).
    Git {
        /// The commit HEAD names; `None` when unborn.
        head: Option<String>,
        /// path → (two-letter porcelain status, state)
        dirty: BTreeMap<String, (String, FileState)>,
        /// `git status` output passed its cap: `dirty` misses some paths.
        incomplete: bool,
    },
    /// Every file under the workspace, up to the cap.
    Walk {
        /// path → state, relative to the workspace.
        files: BTreeMap<String, FileState>,
        /// The walk stopped at its cap: files past it are not in `files`.
        capped: bool,
        /// When the walk started (ns since the epoch): after a capped walk, a file not seen
        /// before counts as changed only when it is newer than this.
        taken_ns: i128,
        /// Why git could not be used in a git work tree (the walk stands in for it).
        git_error: Option<String>,
    },
}

/// Whether `observations` say the attempt changed nothing.
pub fn is_unchanged(observations: &[String]) -> bool {
    observations.iter().all(|o| o == UNCHANGED)
}

/// Why the workspace could not be observed, when it could not.
pub fn unavailable(observations: &[String]) -> Option<&str> {
    observations
        .iter()
        .find_map(|o| o.strip_prefix(UNAVAILABLE_PREFIX))
}

/// Why one git call of the observer gave nothing; the snapshot falls back to a walk and
/// says why.
#[derive(Debug, thiserror::Error)]
enum GitCallError {
    #[error(transparent)]
    Refused(crate::git::harden::Refusal),
    #[error("git {command} failed ({exit}): {stderr}")]
    Failed {
        command: String,
        exit: String,
        stderr: String,
    },
    #[error("could not start git: {0}")]
    Spawn(std::io::Error),
}

/// What one git call gave.
struct GitOut {
    stdout: String,
    /// Output past the cap was dropped.
    truncated: bool,
}

async fn git(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    args: &[&str],
) -> Result<GitOut, GitCallError> {
    // The daemon's git never runs what the repository names (hooks, fsmonitor, filters):
    // a git directory the task could have written is checked first.
    if let Some(why) = crate::git::harden::refusal(ws, env, cancel).await {
        return Err(GitCallError::Refused(why));
    }
    // `--no-optional-locks`: observing never takes the index lock a concurrent git of the
    // agent (or of a check) may need. The hardening overrides name `ws` a safe directory.
    let spec = crate::git::harden::command(ws, ws, env)
        .arg("--no-optional-locks")
        .arg("-C")
        .arg(ws)
        .args(args.iter().copied());
    let limits = process::Limits {
        timeout: Some(Duration::from_secs(30)),
        grace: Duration::from_millis(500),
        output_cap: GIT_OUTPUT_CAP,
    };
    match process::run(&spec, &limits, cancel, None).await {
        Ok(o) if o.exit.success() => Ok(GitOut {
            truncated: o.dropped_bytes > 0,
            stdout: o.stdout,
        }),
        Ok(o) => Err(GitCallError::Failed {
            command: args.first().copied().unwrap_or("").to_string(),
            exit: o.exit.describe(),
            stderr: crate::util::truncate_chars(o.stderr.trim(), 300),
        }),
        Err(e) => Err(GitCallError::Spawn(e)),
    }
}

/// Take a snapshot of `ws` with the default limits.
pub async fn snapshot(ws: &Path, env: &ChildEnv, cancel: &CancellationToken) -> Snapshot {
    snapshot_with(ws, env, cancel, Limits::default()).await
}

/// Take a snapshot of `ws`.
pub async fn snapshot_with(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    limits: Limits,
) -> Snapshot {
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
        return walk_snapshot(ws, limits, None).await;
    }
    let status = match git(
        ws,
        env,
        cancel,
        &["status", "--porcelain", "-z", "--untracked-files=all"],
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return walk_snapshot(ws, limits, Some(e.to_string())).await,
    };
    // An unborn HEAD (no commit yet) is a normal state, not a failure.
    let head = git(ws, env, cancel, &["rev-parse", "--verify", "-q", "HEAD"])
        .await
        .ok()
        .map(|s| s.stdout.trim().to_string());
    let entries = parse_porcelain_z(&status.stdout);
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
    Snapshot::Git {
        head,
        dirty,
        incomplete: status.truncated,
    }
}

async fn walk_snapshot(ws: &Path, limits: Limits, git_error: Option<String>) -> Snapshot {
    let taken_ns = now_ns();
    let root = ws.to_path_buf();
    let (files, capped) = tokio::task::spawn_blocking(move || walk(&root, limits.walk_cap))
        .await
        .unwrap_or_default();
    Snapshot::Walk {
        files,
        capped,
        taken_ns,
        git_error,
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// `git status --porcelain -z`: `XY path\0`, renames followed by `orig\0`.
fn parse_porcelain_z(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut it = s.split('\0');
    while let Some(entry) = it.next() {
        if entry.len() < 4 || !entry.is_char_boundary(2) || !entry.is_char_boundary(3) {
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

/// Every file under `root` up to `cap`; `true` when the cap stopped the walk.
fn walk(root: &Path, cap: usize) -> (BTreeMap<String, FileState>, bool) {
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
            if files.len() >= cap {
                return (files, true);
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
    (files, false)
}

/// Snapshot `ws` again and describe what changed since `before` (default limits).
pub async fn observe(
    before: &Snapshot,
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    observe_with(before, ws, env, cancel, Limits::default()).await
}

/// Snapshot `ws` again and describe what changed since `before`, within `limits`.
pub async fn observe_with(
    before: &Snapshot,
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    limits: Limits,
) -> Vec<String> {
    let after = snapshot_with(ws, env, cancel, limits).await;
    let mut obs = Vec::new();
    match (before, &after) {
        (
            Snapshot::Git {
                head: h0,
                dirty: d0,
                incomplete: i0,
            },
            Snapshot::Git {
                head: h1,
                dirty: d1,
                incomplete: i1,
            },
        ) => {
            let incomplete = *i0 || *i1;
            if h0 != h1 {
                if let Some(h) = h1 {
                    obs.push(format!("HEAD moved to {}", &h[..h.len().min(7)]));
                    if let Some(old) = h0 {
                        if let Ok(ns) = git(ws, env, cancel, &["diff", "--numstat", old, h]).await {
                            for (path, add, del) in parse_numstat(&ns.stdout) {
                                obs.push(format!("committed: {path} (+{add} −{del})"));
                            }
                        }
                    }
                }
            }
            // Line counts only for the tracked paths that changed during the attempt, so the
            // diff costs O(changed files), not O(dirty files) or O(repository).
            let touched: Vec<&str> = d1
                .iter()
                .filter(|(p, (code, st))| {
                    code != "??" && d0.get(*p).is_none_or(|(_, before)| before != st)
                })
                .map(|(p, _)| p.as_str())
                .collect();
            let numstat: BTreeMap<String, (String, String)> = match h1 {
                Some(_) if !touched.is_empty() => {
                    // Paths as literal pathspecs; past a few thousand, one diff of everything
                    // keeps the argv bounded.
                    let mut args = vec!["--literal-pathspecs", "diff", "--numstat", "HEAD"];
                    if touched.len() <= 2_000 {
                        args.push("--");
                        args.extend(touched.iter().copied());
                    }
                    git(ws, env, cancel, &args)
                        .await
                        .map(|s| {
                            parse_numstat(&s.stdout)
                                .into_iter()
                                .map(|(p, a, d)| (p, (a, d)))
                                .collect()
                        })
                        .unwrap_or_default()
                }
                _ => BTreeMap::new(),
            };
            let paths: BTreeSet<&String> = d0.keys().chain(d1.keys()).collect();
            for path in paths {
                let line = match (d0.get(path), d1.get(path)) {
                    (Some((_, a)), Some((code, b))) if a != b => {
                        Some(describe_git(path, code, b, a.lines, &numstat))
                    }
                    (None, Some((code, b))) => Some(describe_git(path, code, b, 0, &numstat)),
                    // Dirty before, clean now: reverted or committed. Not claimed when a
                    // listing was cut: the path may only be missing from it.
                    (Some(_), None) if h0 == h1 && !incomplete => Some(format!("reverted: {path}")),
                    _ => None,
                };
                obs.extend(line);
            }
            if incomplete {
                obs.push(format!(
                    "git status printed more than {} MiB: the list of changes is incomplete",
                    GIT_OUTPUT_CAP / (1024 * 1024)
                ));
            }
        }
        (
            Snapshot::Walk {
                files: f0,
                capped: c0,
                taken_ns,
                git_error: e0,
            },
            Snapshot::Walk {
                files: f1,
                capped: c1,
                git_error: e1,
                ..
            },
        ) => {
            let root = ws.to_path_buf();
            let (c0, c1, t0) = (*c0, *c1, *taken_ns);
            // Paths on one side only need a stat when a cap may hide them: off the runtime.
            let lines = {
                let (f0, f1) = (f0.clone(), f1.clone());
                tokio::task::spawn_blocking(move || diff_walks(&root, &f0, &f1, c0, c1, t0))
                    .await
                    .unwrap_or_default()
            };
            obs.extend(lines);
            if c0 || c1 {
                obs.push(format!(
                    "the file walk stopped at its cap of {} files: changes past it are not listed",
                    group_digits(limits.walk_cap)
                ));
            }
            if let Some(e) = e1.as_ref().or(e0.as_ref()) {
                obs.push(format!(
                    "git could not read this work tree ({e}); changes were found by a file walk"
                ));
            }
        }
        (
            Snapshot::Walk {
                git_error: Some(e), ..
            },
            _,
        )
        | (
            _,
            Snapshot::Walk {
                git_error: Some(e), ..
            },
        ) => {
            return vec![format!(
                "{UNAVAILABLE_PREFIX}git could read the work tree at only one end of the attempt: {e}"
            )];
        }
        _ => obs.push("workspace became (or stopped being) a git repository".into()),
    }
    if obs.is_empty() {
        obs.push(UNCHANGED.into());
    }
    bound_lines(obs, limits.max_lines)
}

/// The diff of two walks. A cap on the later walk hides files, so a path seen only before
/// is checked on disk before it is called deleted; a cap on the earlier walk means a path
/// seen only after may have existed unseen, so it is listed only when newer than that walk.
fn diff_walks(
    root: &Path,
    f0: &BTreeMap<String, FileState>,
    f1: &BTreeMap<String, FileState>,
    capped_before: bool,
    capped_after: bool,
    taken_ns: i128,
) -> Vec<String> {
    let mut obs = Vec::new();
    let paths: BTreeSet<&String> = f0.keys().chain(f1.keys()).collect();
    for path in paths {
        match (f0.get(path), f1.get(path)) {
            (None, Some(b)) if !capped_before => {
                obs.push(format!("added: {path} (+{} lines)", b.lines))
            }
            (None, Some(b)) if b.mtime_ns >= taken_ns => obs.push(format!(
                "added or changed: {path} ({} lines; not seen by the capped walk before)",
                b.lines
            )),
            (None, Some(_)) => {}
            (Some(a), None) if capped_after => {
                let now = file_state(&root.join(path));
                if !now.exists {
                    obs.push(format!("deleted: {path} (−{} lines)", a.lines));
                } else if changed(a, &now) {
                    obs.push(format!(
                        "modified: {path} ({} → {} lines)",
                        a.lines, now.lines
                    ));
                }
            }
            (Some(a), None) => obs.push(format!("deleted: {path} (−{} lines)", a.lines)),
            (Some(a), Some(b)) if changed(a, b) => obs.push(format!(
                "modified: {path} ({} → {} lines)",
                a.lines, b.lines
            )),
            _ => {}
        }
    }
    obs
}

/// What the workspace holds against its baseline, for a verification run with no attempt
/// before it (`hub-sidecar verify`): in git, the uncommitted changes against HEAD; elsewhere,
/// every file (as added).
pub async fn against_baseline(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    let baseline = match snapshot(ws, env, cancel).await {
        Snapshot::Git { head, .. } => Snapshot::Git {
            head,
            dirty: BTreeMap::new(),
            incomplete: false,
        },
        Snapshot::Walk { git_error, .. } => Snapshot::Walk {
            files: BTreeMap::new(),
            capped: false,
            taken_ns: 0,
            git_error,
        },
    };
    observe(&baseline, ws, env, cancel).await
}

/// At most `max` lines, then one saying how many more there were.
fn bound_lines(mut obs: Vec<String>, max: usize) -> Vec<String> {
    if obs.len() > max {
        let left_out = obs.len() - max;
        obs.truncate(max);
        obs.push(format!(
            "… and {} more changes not listed",
            group_digits(left_out)
        ));
    }
    obs
}

/// 4312 → "4,312".
fn group_digits(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
#[path = "observe_tests.rs"]
mod tests;
