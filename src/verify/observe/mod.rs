//! Workspace observations: what an attempt actually changed.
//!
//! Owns the before-[`Snapshot`] of the workspace and the diff of the workspace against it
//! into short lines ("added: src/x.rs (+12 lines)", "HEAD moved to 1a2b3c4", "workspace
//! unchanged"). The list goes into the corrective prompt, the attempt's record, the
//! no-progress rule and the `llm_judge` check (which sees these lines, never the repository).
//!
//! # What is tracked, and what it costs
//!
//! The *fine view* is one row per path: in a git work tree, the paths `git status` lists
//! (dirty and untracked; clean tracked files are git's to compare); elsewhere, every file of
//! a walk that skips `.git`, `target` and `node_modules`. A row is compact: the path's bytes
//! in one shared buffer, a 64-bit fingerprint of its metadata (size, mtime, ctime, inode,
//! device, mode — what git's index compares), the size, and a content hash only for a file
//! that was *racily clean*: modified so close to the snapshot (within 2 s, `RACY_MARGIN_NS`:
//! the file system's timestamp granularity at worst) that a later write could leave the same
//! metadata. That is git's rule, with the snapshot's clock standing in for the index's mtime.
//! 16 bytes plus the path and its NUL end per row: ~3.1 MB for 100,000 paths of 14 bytes.
//!
//! Only the before-snapshot is kept. The observation after the attempt is a stream: each path
//! found now is looked up in the before rows (binary search) and compared by fingerprint, a
//! bit set (in git, one byte per row with the status code's flags) records which rows were
//! seen (the rest were deleted or reverted), and a bounded collector keeps the first
//! [`Limits::max_lines`] changes by path and counts the others. `git status` is read as git
//! prints it, line by line, at both ends: its output (1.6 MB for 100,000 paths) is never held
//! whole; before the attempt the listed paths go straight into the table's name buffer, after
//! it only the first `max_lines` paths with no row are kept.
//! With N paths tracked and C of them changed, one attempt costs:
//!
//! - one `git status` (or one walk) and N `lstat`s at each end, O(N log N) comparisons;
//! - file reads only for the R racily clean rows (hashed before, and again after), for the
//!   rows whose metadata changed, and for the ≤ `max_lines` listed changes (line counts):
//!   O(C + R), never O(N). R is what was modified within 2 s before the snapshot, usually
//!   the previous attempt's own edits;
//! - memory O(N) for the rows of the before-snapshot (plus 16 bytes per racy row), one byte
//!   per row while the listing after the attempt is matched, and O(`max_lines`) for the
//!   changes: nothing in proportion to the listing's text, nor to the paths an attempt adds.
//!
//! The walk's cap ([`Limits::walk_cap`]) only bounds the time of a walk of a huge tree; memory
//! stays per row.
//!
//! The *coarse view* covers what the fine view leaves out: ignored paths (`git status
//! --ignored=matching`: an ignored directory is one entry, not its contents) and the
//! directories the walk skips. Each gets one fingerprint of its entries' names and metadata,
//! from a walk bounded to 20,000 entries per snapshot (`COARSE_BUDGET`); at most 64
//! (`COARSE_ROOTS`) are named, the rest share one fingerprint. When the fine view is empty,
//! a difference there still says "changed" (a task whose only output is an ignored `dist/`
//! did work); otherwise it is not listed, so a build's churn in `target/` does not bury the
//! changes that matter.
//!
//! Paths are bytes end to end (git's output is read with `core.quotePath` and unquoted), and
//! are shown escaped: invalid UTF-8 as `\xNN`, control characters and backslashes escaped, so
//! a name that is not UTF-8 is reported exactly, and one line stays one line.
//!
//! Git runs through [`crate::process::run`] with argv and `-c safe.directory=<workspace>` (a
//! workspace owned by another user is the usual case under a service user); file reading and
//! hashing run on `spawn_blocking`.
//!
//! # Layout
//!
//! - this file: [`Snapshot`], [`snapshot`], [`observe`];
//! - `diff.rs`: the two diffs (git, walk) against the before rows;
//! - `table.rs`: the compact state (rows, probes and fingerprints, the coarse view, the
//!   bounded collector);
//! - `git.rs`: the observer's one hardened git call;
//! - `git_text.rs`: git's quoted output read back to bytes, and [`display_path`];
//! - `render.rs`: the changes as lines;
//! - `tests.rs`: real repositories and files in temp dirs (`tests/memory.rs`: what an
//!   observation holds).
//!
//! "Could not observe" is never "unchanged": when git cannot read the work tree the snapshot
//! falls back to the walk and says so; when the two ends cannot be compared the list is one
//! [`UNAVAILABLE_PREFIX`] line (the no-progress rule is off for that attempt and `llm_judge`
//! reports `error`). A walk past its cap or a `git status` past its output cap is reported as
//! such, never as deletions.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::process::ChildEnv;

mod table;
use table::*;

mod git_text;
pub use git_text::display_path;
use git_text::{parse_numstat_line, parse_status_line, StatusEntry};

mod git;
use git::{git, git_lines, STATUS};

mod render;
use render::{group_digits, render};

mod diff;
use diff::{diff_git, diff_walk};

/// The one observation meaning "nothing changed".
pub const UNCHANGED: &str = "workspace unchanged";

/// The start of the one observation meaning "what changed is not known".
pub const UNAVAILABLE_PREFIX: &str = "observation unavailable: ";

/// Directories a walk never enters (build output and dependencies are not the work); all but
/// `.git` are watched by the coarse view.
const IGNORED_DIRS: &[&str] = &[".git", "target", "node_modules"];

/// Output kept from one git call, or read from a listing; past it the listing is reported as
/// incomplete.
const GIT_OUTPUT_CAP: usize = 16 * 1024 * 1024;

/// Bounds of one observation.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A walk stops after this many files, so a huge tree cannot stall verification. Memory is
    /// 16 bytes plus the path per file whatever the cap.
    pub walk_cap: usize,
    /// Lines listed; the rest are counted ("… and 4,312 more changes not listed").
    pub max_lines: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            walk_cap: 500_000,
            max_lines: 200,
        }
    }
}

/// The workspace before an attempt: the fine rows, the coarse fingerprints, and where they
/// came from. Cheap to clone (the tables are shared).
#[derive(Clone)]
pub struct Snapshot {
    source: Source,
    table: Arc<Table>,
    coarse: Arc<Coarse>,
    /// When the snapshot began (ns since the epoch): the racy rule's reference, and after a
    /// capped walk the age a file must beat to count as new.
    taken_ns: i128,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("source", &self.source)
            .field("paths", &self.table.rows.len())
            .field("hashed", &self.table.hashes.len())
            .field("coarse_roots", &self.coarse.roots.len())
            .finish()
    }
}

impl Snapshot {
    /// Whether git listed the paths (rather than a walk).
    pub fn is_git(&self) -> bool {
        matches!(self.source, Source::Git { .. })
    }

    /// Why git could not be used in a git work tree, when the walk stood in for it.
    pub fn git_error(&self) -> Option<&str> {
        match &self.source {
            Source::Walk { git_error, .. } => git_error.as_deref(),
            Source::Git { .. } => None,
        }
    }

    /// Paths in the fine view.
    pub fn paths(&self) -> usize {
        self.table.rows.len()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A git work tree whose top level is `root`.
    Git {
        root: PathBuf,
        /// The commit HEAD names; `None` when unborn.
        head: Option<String>,
        /// `git status` output passed its cap: the rows miss some paths.
        incomplete: bool,
    },
    /// Every file under the workspace, up to the cap.
    Walk {
        /// The walk stopped at its cap: files past it have no row.
        capped: bool,
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

// ---------------------------------------------------------------------------------------------
// Looking at the workspace.

/// What the workspace is right now, before any file is looked at (the entries of `git status`
/// went to the caller as git printed them).
enum Look {
    Git {
        root: PathBuf,
        /// `git status` printed more than [`GIT_OUTPUT_CAP`]: entries past it were not seen.
        incomplete: bool,
        head: Option<String>,
    },
    Walk {
        git_error: Option<String>,
    },
}

/// Where `ws` is, and in a git work tree each entry of `git status`, handed to `on_entry` as
/// git prints it (the listing is never held whole: 1.6 MB for 100,000 paths). When git fails
/// part way, entries already handed on are to be dropped (the walk stands in).
async fn look(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    on_entry: &mut (dyn FnMut(StatusEntry) + Send),
) -> Look {
    // Found the way git finds it (a `.git` dir or file in the workspace or above), without
    // spawning git: this runs twice per attempt. The directory holding it is the top level,
    // which `git status` paths are relative to.
    let probe = ws.to_path_buf();
    let root = tokio::task::spawn_blocking(move || {
        probe
            .ancestors()
            .find(|dir| dir.join(".git").symlink_metadata().is_ok())
            .map(Path::to_path_buf)
    })
    .await
    .ok()
    .flatten();
    let Some(root) = root else {
        return Look::Walk { git_error: None };
    };
    let mut on_line = |line: &str| {
        if let Some(e) = parse_status_line(line) {
            on_entry(e);
        }
    };
    let incomplete = match git_lines(ws, env, cancel, STATUS, GIT_OUTPUT_CAP, &mut on_line).await {
        Ok(truncated) => truncated,
        Err(e) => {
            return Look::Walk {
                git_error: Some(e.to_string()),
            }
        }
    };
    // An unborn HEAD (no commit yet) is a normal state, not a failure.
    let head = git(ws, env, cancel, &["rev-parse", "--verify", "-q", "HEAD"])
        .await
        .ok()
        .map(|s| s.stdout.trim().to_string());
    Look::Git {
        root,
        incomplete,
        head,
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
    let taken_ns = now_ns();
    // The listed paths are gathered as git prints them and probed afterwards, off the runtime.
    let mut listed = Names::default();
    let mut ignored = Vec::new();
    let now = look(ws, env, cancel, &mut |e| {
        if e.code == *b"!!" {
            ignored.push(e.path);
        } else {
            listed.push(&e.path);
        }
    })
    .await;
    match now {
        Look::Git {
            root,
            incomplete,
            head,
        } => {
            let base = root.clone();
            let (table, coarse) = tokio::task::spawn_blocking(move || {
                let table = Table::probe(&base, listed, taken_ns);
                (table, Coarse::of(&base, ignored))
            })
            .await
            .unwrap_or_default();
            Snapshot {
                source: Source::Git {
                    root,
                    head,
                    incomplete,
                },
                table: Arc::new(table),
                coarse: Arc::new(coarse),
                taken_ns,
            }
        }
        Look::Walk { git_error } => {
            drop((listed, ignored));
            let root = ws.to_path_buf();
            let (table, coarse, capped) = tokio::task::spawn_blocking(move || {
                let mut table = Table::default();
                let (capped, coarse) = walk(&root, limits.walk_cap, |rel, path, meta| {
                    let p = Probe::of(meta, taken_ns);
                    table.push(rel, &p, racy_hash(path, &p));
                });
                table.finish();
                (table, coarse, capped)
            })
            .await
            .unwrap_or_default();
            Snapshot {
                source: Source::Walk { capped, git_error },
                table: Arc::new(table),
                coarse: Arc::new(coarse),
                taken_ns,
            }
        }
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// Deepest directory the walk enters below the root; deeper ones join the coarse view (a
/// task can nest directories far past anything a real tree has).
const MAX_DEPTH: usize = 64;

/// Every file under `root` up to `cap` files, handed to `visit` as (relative path bytes, path,
/// metadata); skipped directories become the coarse view. `true` when the cap stopped it
/// (`cap` bounds the directories listed too).
fn walk(
    root: &Path,
    cap: usize,
    mut visit: impl FnMut(&[u8], &Path, &std::fs::Metadata),
) -> (bool, Coarse) {
    let mut skipped: Vec<Vec<u8>> = Vec::new();
    let mut files = 0usize;
    let mut dirs = 0usize;
    let mut capped = false;
    let mut stack: Vec<(PathBuf, usize)> = vec![(root.to_path_buf(), 0)];
    'walk: while let Some((dir, depth)) = stack.pop() {
        if dirs >= cap {
            capped = true;
            break;
        }
        dirs += 1;
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p).as_os_str().as_bytes();
            if ft.is_dir() {
                let name = e.file_name();
                // Pending and skipped directories are bounded by the cap as well: one
                // directory can hold a million others.
                if stack.len() + skipped.len() >= cap {
                    capped = true;
                    break 'walk;
                }
                if IGNORED_DIRS.iter().any(|d| name == *d) {
                    if name != ".git" {
                        skipped.push(rel.to_vec());
                    }
                } else if depth + 1 > MAX_DEPTH {
                    skipped.push(rel.to_vec());
                } else {
                    stack.push((p, depth + 1));
                }
                continue;
            }
            if files >= cap {
                capped = true;
                break 'walk;
            }
            files += 1;
            let Ok(meta) = e.metadata() else { continue };
            visit(rel, &p, &meta);
        }
    }
    skipped.sort();
    (capped, Coarse::of(root, skipped))
}

// ---------------------------------------------------------------------------------------------
// Observing: the workspace now against the snapshot.

/// Snapshot `ws` again and describe what changed since `before` (default limits).
pub async fn observe(
    before: &Snapshot,
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    observe_with(before, ws, env, cancel, Limits::default()).await
}

/// What a diff found, before rendering.
struct Found {
    head_lines: Vec<String>,
    /// Counted in the bound with the changes.
    head_total: usize,
    changes: Changes,
    notes: Vec<String>,
    coarse_after: Coarse,
}

/// Look at `ws` again and describe what changed since `before`, within `limits`.
pub async fn observe_with(
    before: &Snapshot,
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    limits: Limits,
) -> Vec<String> {
    // The listing is matched against the before rows as git prints it: what is kept is one
    // byte per row and the first `max_lines` new paths, never the listing.
    let table = Arc::clone(&before.table);
    let mut listed = Listed::new(table.rows.len(), limits.max_lines);
    let now = look(ws, env, cancel, &mut |e| listed.add(&table, e)).await;
    let found = match (&before.source, now) {
        (
            Source::Git {
                head: h0,
                incomplete: i0,
                ..
            },
            Look::Git {
                root,
                incomplete: i1,
                head,
            },
        ) => {
            let mut head_lines = Vec::new();
            let mut committed = Bounded::new(limits.max_lines);
            if *h0 != head {
                if let Some(h) = &head {
                    head_lines.push(format!("HEAD moved to {}", &h[..h.len().min(7)]));
                    if let Some(old) = h0 {
                        let args = ["diff", "--no-renames", "--numstat", old.as_str(), h];
                        // Streamed: a commit of 100,000 files is counted, not held.
                        let mut on_line = |l: &str| {
                            if let Some((path, a, d)) = parse_numstat_line(l) {
                                committed.add(path, (a, d));
                            }
                        };
                        let _ =
                            git_lines(ws, env, cancel, &args, GIT_OUTPUT_CAP, &mut on_line).await;
                    }
                }
            }
            let head_total = head_lines.len() + committed.total;
            head_lines.extend(
                committed
                    .kept
                    .iter()
                    .map(|(p, (a, d))| format!("committed: {} (+{a} −{d})", display_path(p))),
            );
            let incomplete = *i0 || i1;
            let same_head = *h0 == head;
            let (changes, coarse_after) = tokio::task::spawn_blocking(move || {
                diff_git(&root, &table, listed, same_head && !incomplete)
            })
            .await
            .unwrap_or_else(|_| (Changes::new(0), Coarse::default()));
            let mut notes = Vec::new();
            if incomplete {
                notes.push(format!(
                    "git status printed more than {} MiB: the list of changes is incomplete",
                    GIT_OUTPUT_CAP / (1024 * 1024)
                ));
            }
            Found {
                head_lines,
                head_total,
                changes,
                notes,
                coarse_after,
            }
        }
        (
            Source::Walk {
                capped: c0,
                git_error: e0,
            },
            Look::Walk { git_error: e1 },
        ) => {
            drop(listed);
            let (taken, c0) = (before.taken_ns, *c0);
            let root = ws.to_path_buf();
            let (changes, c1, coarse_after) =
                tokio::task::spawn_blocking(move || diff_walk(&root, &table, c0, taken, limits))
                    .await
                    .unwrap_or_else(|_| (Changes::new(0), false, Coarse::default()));
            let mut notes = Vec::new();
            if c0 || c1 {
                notes.push(format!(
                    "the file walk stopped at its cap of {} files: changes past it are not listed",
                    group_digits(limits.walk_cap)
                ));
            }
            if let Some(e) = e1.as_ref().or(e0.as_ref()) {
                notes.push(format!(
                    "git could not read this work tree ({e}); changes were found by a file walk"
                ));
            }
            Found {
                head_lines: Vec::new(),
                head_total: 0,
                changes,
                notes,
                coarse_after,
            }
        }
        (
            Source::Walk {
                git_error: Some(e), ..
            },
            _,
        ) => return one_end_only(e),
        (_, Look::Walk { git_error: Some(e) }) => return one_end_only(&e),
        _ => {
            return vec!["workspace became (or stopped being) a git repository".into()];
        }
    };
    render(before, ws, env, cancel, found, limits).await
}

/// Git read the work tree at one end of the attempt only: the two ends cannot be compared.
fn one_end_only(e: &str) -> Vec<String> {
    vec![format!(
        "{UNAVAILABLE_PREFIX}git could read the work tree at only one end of the attempt: {e}"
    )]
}

/// What the workspace holds against its baseline, for a verification run with no attempt
/// before it (`hub-sidecar verify`): in git, the uncommitted changes against HEAD; elsewhere,
/// every file (as added). Ignored paths have no baseline, so they are not reported.
pub async fn against_baseline(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    against(ws, None, env, cancel).await
}

/// [`against_baseline`] with `base` (a commit) as the baseline in a git work tree: committed
/// and uncommitted work since `base` (`hub-sidecar verify --base`).
pub async fn against_commit(
    ws: &Path,
    base: &str,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    against(ws, Some(base.to_string()), env, cancel).await
}

/// The workspace now against an empty table whose HEAD is `base` (else the HEAD found).
async fn against(
    ws: &Path,
    base: Option<String>,
    env: &ChildEnv,
    cancel: &CancellationToken,
) -> Vec<String> {
    let now = snapshot(ws, env, cancel).await;
    let source = match now.source {
        Source::Git { root, head, .. } => Source::Git {
            root,
            head: base.or(head),
            incomplete: false,
        },
        Source::Walk { git_error, .. } => Source::Walk {
            capped: false,
            git_error,
        },
    };
    let baseline = Snapshot {
        source,
        table: Arc::new(Table::default()),
        coarse: now.coarse,
        taken_ns: 0,
    };
    observe(&baseline, ws, env, cancel).await
}

#[cfg(test)]
mod tests;
