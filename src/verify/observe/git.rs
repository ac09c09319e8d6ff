//! The observer's git: one hardened call (the git directory checked first, no optional
//! locks, quoted paths), its output capped or streamed line by line, and why a call gave
//! nothing.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::process::{self, ChildEnv};

use super::GIT_OUTPUT_CAP;

/// Why one git call of the observer gave nothing; the snapshot falls back to a walk and
/// says why.
#[derive(Debug, thiserror::Error)]
pub(super) enum GitCallError {
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
pub(super) struct GitOut {
    /// Up to the cap: the callers read short outputs (a commit id, the line counts of the
    /// listed paths); a listing goes through [`git_lines`].
    pub(super) stdout: String,
}

pub(super) async fn git(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    args: &[&str],
) -> Result<GitOut, GitCallError> {
    git_os(ws, env, cancel, args.iter().map(OsStr::new)).await
}

/// [`git`] with arguments that need not be UTF-8 (pathspecs).
pub(super) async fn git_os<'a>(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    args: impl IntoIterator<Item = &'a OsStr>,
) -> Result<GitOut, GitCallError> {
    let args: Vec<&OsStr> = args.into_iter().collect();
    run(ws, env, cancel, &args, GIT_OUTPUT_CAP, None).await
}

/// What a listing keeps of git's own output: enough for an error message. The lines go to
/// the caller as they arrive, so a listing of 100,000 paths (1.6 MB) is never held whole.
pub(super) const LISTING_CAPTURE: usize = 64 * 1024;

/// [`git`] for a listing: each stdout line goes to `on_line` as it arrives and is not kept.
/// Lines past `cap` bytes of output are not handed on; `Ok(true)` says so (the listing is
/// incomplete).
pub(super) async fn git_lines(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    args: &[&str],
    cap: usize,
    on_line: &mut (dyn FnMut(&str) + Send),
) -> Result<bool, GitCallError> {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let (mut seen, mut truncated) = (0usize, false);
    let mut capped = |line: &str| {
        seen = seen.saturating_add(line.len() + 1);
        if seen > cap {
            truncated = true;
        } else {
            on_line(line);
        }
    };
    run(ws, env, cancel, &args, LISTING_CAPTURE, Some(&mut capped)).await?;
    Ok(truncated)
}

/// The one hardened call: `output_cap` bytes of each stream kept, stdout lines also handed
/// to `on_line` when given.
async fn run(
    ws: &Path,
    env: &ChildEnv,
    cancel: &CancellationToken,
    args: &[&OsStr],
    output_cap: usize,
    on_line: Option<process::LineCallback<'_>>,
) -> Result<GitOut, GitCallError> {
    // The daemon's git never runs what the repository names (hooks, fsmonitor, filters):
    // a git directory the task could have written is checked first.
    if let Some(why) = crate::git::harden::refusal(ws, env, cancel).await {
        return Err(GitCallError::Refused(why));
    }
    // `--no-optional-locks`: observing never takes the index lock a concurrent git of the
    // agent (or of a check) may need. The hardening overrides name `ws` a safe directory.
    // `core.quotePath`: output is read as text, so every byte that is not printable ASCII
    // must come quoted (and is unquoted back to the exact bytes); spaces are quoted too,
    // which keeps `old -> new` unambiguous.
    let spec = crate::git::harden::command(ws, ws, env)
        .arg("--no-optional-locks")
        .args(["-c", "core.quotePath=true"])
        .arg("-C")
        .arg(ws)
        .args(args.iter().copied());
    let limits = process::Limits {
        timeout: Some(Duration::from_secs(30)),
        grace: Duration::from_millis(500),
        output_cap,
    };
    match process::run_with(&spec, &limits, cancel, None, on_line).await {
        Ok(o) if o.exit.success() => Ok(GitOut { stdout: o.stdout }),
        Ok(o) => Err(GitCallError::Failed {
            command: args
                .first()
                .map(|a| a.to_string_lossy().into_owned())
                .unwrap_or_default(),
            exit: o.exit.describe(),
            stderr: crate::util::truncate_chars(o.stderr.trim(), 300),
        }),
        Err(e) => Err(GitCallError::Spawn(e)),
    }
}

/// `git status`: dirty and untracked paths one by one, ignored directories as one entry.
pub(super) const STATUS: &[&str] = &[
    "status",
    "--porcelain",
    "--untracked-files=all",
    "--ignored=matching",
];
