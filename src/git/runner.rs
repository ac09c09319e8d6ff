//! The one way the daemon runs git and gh: argv only, bounded, cancellable, non-interactive.

use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::process::{self, ChildEnv, CommandSpec, Limits};
use crate::redact::scrub_url_userinfo;

/// Bytes of git/gh error output kept in a task's failure reason.
const ERROR_TAIL_CHARS: usize = 600;

/// A git (or gh) step that failed: which step, and git's own words (trimmed, credentials
/// scrubbed).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{step} failed: {detail}")]
pub struct GitError {
    /// E.g. `git clone`, `git push`.
    pub step: String,
    /// What git said (tail of stderr) and how it exited.
    pub detail: String,
}

/// Runs git and gh for one task: argv only, bounded, cancellable, non-interactive.
#[derive(Debug, Clone)]
pub struct GitRunner {
    env: ChildEnv,
    cancel: CancellationToken,
    net_timeout: Duration,
    local_timeout: Duration,
    grace: Duration,
}

impl GitRunner {
    /// A runner with the task's child environment made non-interactive.
    pub fn new(cfg: &Config, env: &ChildEnv, cancel: CancellationToken) -> GitRunner {
        let mut env = env.clone();
        // Never wait for a human: no terminal prompt, no askpass GUI (an empty GIT_ASKPASS
        // and SSH_ASKPASS switch askpass off), ssh in batch mode, Git Credential Manager
        // non-interactive. Non-interactive helpers (store, cache) keep working.
        env.set("GIT_TERMINAL_PROMPT", "0");
        env.set("GIT_ASKPASS", "");
        env.set("SSH_ASKPASS", "");
        env.set("GCM_INTERACTIVE", "never");
        if !env.vars().iter().any(|(k, _)| k == "GIT_SSH_COMMAND") {
            env.set("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        }
        // A repo URL comes from the hub: only plain transports, never `ext::` (which runs a
        // command) or other helpers. An operator's own GIT_ALLOW_PROTOCOL wins.
        if !env.vars().iter().any(|(k, _)| k == "GIT_ALLOW_PROTOCOL") {
            env.set("GIT_ALLOW_PROTOCOL", "file:git:ssh:http:https");
        }
        GitRunner {
            env,
            cancel,
            net_timeout: Duration::from_secs(cfg.git.clone_timeout_secs.max(1)),
            local_timeout: Duration::from_secs(cfg.git.command_timeout_secs.max(1)),
            grace: Duration::from_millis(cfg.executor.kill_grace_ms),
        }
    }

    /// The environment git and gh run with.
    pub fn env(&self) -> &ChildEnv {
        &self.env
    }

    /// `git ARGS` in `cwd`; stdout on success. `network` picks the clone timeout.
    pub async fn git(&self, cwd: &Path, args: &[&str], network: bool) -> Result<String, GitError> {
        let step = format!("git {}", args.first().copied().unwrap_or(""));
        self.run_program("git".as_ref(), &step, cwd, args, network)
            .await
    }

    /// Run any program (gh) the same way as git.
    pub async fn run_program(
        &self,
        program: &std::ffi::OsStr,
        step: &str,
        cwd: &Path,
        args: &[&str],
        network: bool,
    ) -> Result<String, GitError> {
        let spec = CommandSpec::new(program, cwd, self.env.clone()).args(args);
        let limits = Limits {
            timeout: Some(if network {
                self.net_timeout
            } else {
                self.local_timeout
            }),
            grace: self.grace,
            output_cap: 256 * 1024,
        };
        let shown = scrub_url_userinfo(&args.join(" "));
        let out = process::run(&spec, &limits, &self.cancel, None)
            .await
            .map_err(|e| GitError {
                step: step.to_string(),
                detail: format!(
                    "cannot run {}: {e}; install it or fix PATH",
                    program.to_string_lossy()
                ),
            })?;
        tracing::debug!(
            program = %program.to_string_lossy(),
            args = %shown,
            cwd = %cwd.display(),
            exit = %out.exit.describe(),
            stdout = %tail(&out.stdout, 2000),
            stderr = %tail(&out.stderr, 2000),
            "git step"
        );
        if out.exit.success() {
            return Ok(out.stdout);
        }
        let said = if out.stderr.trim().is_empty() {
            out.stdout.trim()
        } else {
            out.stderr.trim()
        };
        Err(GitError {
            step: step.to_string(),
            detail: scrub_url_userinfo(&format!(
                "{} ({})",
                tail(said, ERROR_TAIL_CHARS),
                out.exit.describe()
            )),
        })
    }
}

/// The last `max` chars of `s`, trimmed.
fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let t: String = s.chars().skip(n - max).collect();
    format!("…{t}")
}
