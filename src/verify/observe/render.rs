//! The observation lines: one per kept change (line counts read for these only), HEAD and
//! commits first, a count of the rest, the coarse view when nothing else changed, the notes.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::process::ChildEnv;

use super::git::git_os;
use super::git_text::{display_path, parse_numstat};
use super::table::*;
use super::{Found, Limits, Snapshot, Source, UNCHANGED};

/// The lines: HEAD and commits, the kept changes (line counts read for these only, tracked
/// ones against HEAD with one `git diff` limited to them), a count of the rest, the coarse
/// view when nothing else changed, and the notes.
pub(super) async fn render(
    before: &Snapshot,
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    found: Found,
    limits: Limits,
) -> Vec<String> {
    let Found {
        head_lines,
        head_total,
        changes,
        notes,
        coarse_after,
    } = found;
    let git_root = match &before.source {
        Source::Git { root, head, .. } => Some((root.clone(), head.is_some())),
        Source::Walk { .. } => None,
    };
    // Line counts of tracked files against HEAD: one diff for the listed paths only, run at
    // the top level, which the paths are relative to.
    let mut numstat: BTreeMap<Vec<u8>, (String, String)> = BTreeMap::new();
    if let Some((root, true)) = &git_root {
        let touched: Vec<&OsStr> = changes
            .kept
            .iter()
            .filter(|(_, c)| c.tracked && c.kind == Kind::Modified)
            .map(|(p, _)| OsStr::from_bytes(p))
            .collect();
        if !touched.is_empty() {
            let fixed = [
                "--literal-pathspecs",
                "diff",
                "--no-renames",
                "--numstat",
                "HEAD",
                "--",
            ];
            let args = fixed.into_iter().map(OsStr::new).chain(touched);
            if let Ok(s) = git_os(root, env, cancel, args).await {
                numstat.extend(parse_numstat(&s.stdout).map(|(p, a, d)| (p, (a, d))));
            }
        }
    }
    let base = git_root.map_or_else(|| ws.to_path_buf(), |(r, _)| r);
    let total = head_total + changes.total;
    let kept = changes.kept;
    let mut lines = tokio::task::spawn_blocking(move || {
        let mut out = head_lines;
        for (path, c) in &kept {
            out.push(describe(&base, path, c, numstat.get(path)));
        }
        out
    })
    .await
    .unwrap_or_default();
    if lines.len() > limits.max_lines {
        lines.truncate(limits.max_lines);
    }
    if total > lines.len() {
        lines.push(format!(
            "… and {} more changes not listed",
            group_digits(total - lines.len())
        ));
    }
    if lines.is_empty() {
        // Nothing git or the walk can list: what the ignored paths say decides.
        let mut coarse = before.coarse.diff(&coarse_after);
        if coarse.len() > limits.max_lines {
            let more = coarse.len() - limits.max_lines;
            coarse.truncate(limits.max_lines);
            coarse.push(format!(
                "… and {} more ignored paths changed",
                group_digits(more)
            ));
        }
        lines = coarse;
    }
    lines.extend(notes);
    if lines.is_empty() {
        lines.push(UNCHANGED.into());
    }
    lines
}

/// One change as a line.
fn describe(base: &Path, path: &[u8], c: &Change, numstat: Option<&(String, String)>) -> String {
    let shown = display_path(path);
    let lines = || line_count(&base.join(OsStr::from_bytes(path)));
    let size = |n: u64| {
        if n >= u64::from(SIZE_SATURATED) {
            "4 GiB or more".to_string()
        } else {
            format!("{} bytes", group_digits(n as usize))
        }
    };
    match c.kind {
        Kind::Added => match lines() {
            Some(n) => format!("added: {shown} (+{n} lines)"),
            None => format!("added: {shown} ({})", size(c.size_after)),
        },
        Kind::AddedOrChanged => format!(
            "added or changed: {shown} ({}; not seen by the capped walk before)",
            lines().map_or_else(|| size(c.size_after), |n| format!("{n} lines"))
        ),
        Kind::Deleted if c.tracked => format!("deleted: {shown}"),
        Kind::Deleted => format!("deleted: {shown} (−{})", size(c.size_before)),
        Kind::Reverted => format!("reverted: {shown}"),
        Kind::Modified => match numstat {
            Some((a, d)) => format!("modified: {shown} (+{a} −{d} vs HEAD)"),
            None => {
                let now = lines().map_or_else(String::new, |n| format!(", {n} lines"));
                format!(
                    "modified: {shown} ({} → {}{now})",
                    size(c.size_before),
                    size(c.size_after)
                )
            }
        },
    }
}

/// 4312 → "4,312".
pub(super) fn group_digits(n: usize) -> String {
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
