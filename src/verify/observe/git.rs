//! The observer's git: one hardened call (the git directory checked first, no optional
//! locks, quoted paths), its output capped, and why a call gave nothing.

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
    pub(super) stdout: String,
    /// Output past the cap was dropped.
    pub(super) truncated: bool,
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
        output_cap: GIT_OUTPUT_CAP,
    };
    match process::run(&spec, &limits, cancel, None).await {
        Ok(o) if o.exit.success() => Ok(GitOut {
            truncated: o.dropped_bytes > 0,
            stdout: o.stdout,
        }),
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
