//! The one way the daemon runs git and gh: argv only, bounded, cancellable, non-interactive,
//! and never running what the repository says to run (see [`super::harden`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::process::{self, ChildEnv, CommandSpec, Limits};
use crate::redact::scrub_url_userinfo;

use super::harden::{self, CleanConfigs};
use super::locate;

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
    /// The daemon refused to run git here (the repository's config could make git run a
    /// program): not a git failure, and never to be read as "not a repository".
    pub refused: bool,
}

/// Runs git and gh for one task: argv only, bounded, cancellable, non-interactive.
#[derive(Debug, Clone)]
pub struct GitRunner {
    env: ChildEnv,
    cancel: CancellationToken,
    net_timeout: Duration,
    local_timeout: Duration,
    grace: Duration,
    /// A work tree whose git directory the daemon owns (a managed clone): calls in it name
    /// that directory explicitly and skip the config check.
    trusted: Option<(PathBuf, PathBuf)>,
    /// Config checks already passed, shared by the clones of this runner (one task): a
    /// repo_dir task makes a dozen git calls, and without it each one ran a `git config`.
    checks: Arc<CleanConfigs>,
}

impl GitRunner {
    /// A runner with the task's child environment made non-interactive, and HOME (with
    /// XDG_CONFIG_HOME) an empty directory of the daemon's ([`home_dir`]): the service
    /// user's HOME is no input to the daemon's git.
    pub fn new(cfg: &Config, env: &ChildEnv, cancel: CancellationToken) -> GitRunner {
        let mut env = env.clone();
        // Never wait for a human: no terminal prompt, no askpass GUI (an empty GIT_ASKPASS
        // and SSH_ASKPASS switch askpass off), ssh in batch mode, Git Credential Manager
        // non-interactive. No system or global config, nothing inherited that moves the
        // git directory (see `harden::scrub_env`).
        harden::scrub_env(&mut env);
        let home = home_dir(cfg);
        env.set("HOME", &home.to_string_lossy());
        env.set("XDG_CONFIG_HOME", &home.join(".config").to_string_lossy());
        // Set even when the operator did not: it outranks a repository's core.sshCommand.
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
            trusted: None,
            checks: Arc::default(),
        }
    }

    /// The same runner, treating `git_dir` (outside the workspace, written only by the
    /// daemon) as the git directory of `work_tree`.
    pub fn trusting(mut self, work_tree: &Path, git_dir: &Path) -> GitRunner {
        self.trusted = Some((work_tree.to_path_buf(), git_dir.to_path_buf()));
        self
    }

    /// The same runner, sending `userinfo` (`user:password` of an http(s) URL) as a Basic
    /// authorization header through the environment: never in argv, never stored in the
    /// clone's config.
    pub fn with_credentials(mut self, userinfo: &str) -> GitRunner {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(userinfo);
        self.env.set("GIT_CONFIG_COUNT", "1");
        self.env.set("GIT_CONFIG_KEY_0", "http.extraHeader");
        self.env
            .set("GIT_CONFIG_VALUE_0", &format!("Authorization: Basic {b64}"));
        self
    }

    /// The same runner with the credentials of the task's repository URL (`user:password`
    /// of an http(s) `repo`, see [`GitRunner::with_credentials`]); unchanged without one.
    pub fn with_url_credentials(self, repo: Option<&str>) -> GitRunner {
        match repo.map(str::trim) {
            Some(url) if url.starts_with("http") => match super::url::userinfo(url) {
                Some(info) => self.with_credentials(&info),
                None => self,
            },
            _ => self,
        }
    }

    /// The same runner for the publishing step: `[env] publish` (the pull request's
    /// `GH_TOKEN`) added, for the push and `gh` only.
    pub fn publishing(mut self) -> GitRunner {
        self.env = self.env.for_publish();
        self
    }

    /// The environment git and gh run with.
    pub fn env(&self) -> &ChildEnv {
        &self.env
    }

    /// `git ARGS` in `cwd`, hardened; stdout on success. `network` picks the clone timeout.
    ///
    /// git never discovers its directory by itself: it is named with `--git-dir` and
    /// `--work-tree`, the managed clone's own or the one [`locate::locate`] resolved and
    /// checked (a `clone`, which reads no repository, gets neither).
    pub async fn git(&self, cwd: &Path, args: &[&str], network: bool) -> Result<String, GitError> {
        let step = format!("git {}", args.first().copied().unwrap_or(""));
        let full = self.argv(cwd, args, &step).await?;
        self.run_program("git".as_ref(), &step, cwd, &full, network)
            .await
    }

    /// `git ARGS` in `cwd` as [`GitRunner::git`] runs it, `input` on its stdin, every byte
    /// of its stdout handed to `on_chunk` as it arrives and none kept: output too large to
    /// hold (the push scan reads every object pushed this way). `network` picks the clone
    /// timeout.
    pub async fn git_stream(
        &self,
        cwd: &Path,
        args: &[&str],
        input: Option<Vec<u8>>,
        network: bool,
        on_chunk: process::ChunkCallback<'_>,
    ) -> Result<(), GitError> {
        let step = format!("git {}", args.first().copied().unwrap_or(""));
        let full = self.argv(cwd, args, &step).await?;
        let mut spec = CommandSpec::new("git", cwd, self.env.clone()).args(full);
        spec.stdin = input;
        let limits = Limits {
            timeout: Some(if network {
                self.net_timeout
            } else {
                self.local_timeout
            }),
            grace: self.grace,
            output_cap: 4 * 1024,
        };
        let out = process::run_chunks(&spec, &limits, &self.cancel, on_chunk)
            .await
            .map_err(|e| GitError {
                step: step.clone(),
                refused: false,
                detail: format!("cannot run git: {e}; install it or fix PATH"),
            })?;
        if out.exit.success() {
            return Ok(());
        }
        Err(GitError {
            step,
            refused: false,
            detail: scrub_url_userinfo(&format!(
                "{} ({})",
                tail(&out.stderr, ERROR_TAIL_CHARS),
                out.exit.describe()
            )),
        })
    }

    /// The full argv of `git ARGS` in `cwd`: the hardening overrides, the git directory
    /// named explicitly (the managed clone's own, or the one [`locate::locate`] resolved
    /// and checked), then `args`.
    async fn argv(&self, cwd: &Path, args: &[&str], step: &str) -> Result<Vec<OsString>, GitError> {
        let step = step.to_string();
        let mut full = harden::overrides(cwd);
        match &self.trusted {
            Some((tree, dir)) if tree == cwd => {
                let found = locate::Located {
                    work_tree: tree.clone(),
                    git_dir: dir.clone(),
                };
                // The clone's own config is the daemon's; a submodule the task populated
                // in it is not.
                harden::submodule_refusal(&found, &self.env, &self.cancel)
                    .await
                    .map_err(|why| GitError {
                        step: step.clone(),
                        refused: true,
                        detail: why.to_string(),
                    })?;
                full.extend(found.args());
            }
            _ => {
                self.check_repo_config(cwd, &step).await?;
                if args.first() != Some(&"clone") {
                    // Resolved again after the check: the same answer unless `.git`
                    // changed in between, and then the new one is refused or checked
                    // on the next call; git itself never picks another.
                    match locate::locate(cwd) {
                        Ok(Some(found)) => full.extend(found.args()),
                        Ok(None) => {}
                        Err(why) => {
                            return Err(GitError {
                                step,
                                refused: true,
                                detail: why.to_string(),
                            })
                        }
                    }
                }
            }
        }
        full.extend(args.iter().map(OsString::from));
        Ok(full)
    }

    /// Refuse to run git in a work tree whose git directory the task could have written
    /// when its config sets anything outside the allowlist (see [`CleanConfigs::check`]).
    async fn check_repo_config(&self, cwd: &Path, step: &str) -> Result<(), GitError> {
        self.checks
            .check(cwd, &self.env, &self.cancel)
            .await
            .map_err(|why| GitError {
                step: step.to_string(),
                refused: true,
                detail: why.to_string(),
            })
    }

    /// How many times this runner (and its clones) read a repository's config with
    /// `git config`, as opposed to reusing a verdict. For tests and metrics.
    pub fn config_reads(&self) -> u64 {
        self.checks.reads()
    }

    /// Run any program (gh) the same way as git.
    pub async fn run_program<S: AsRef<std::ffi::OsStr>>(
        &self,
        program: &std::ffi::OsStr,
        step: &str,
        cwd: &Path,
        args: &[S],
        network: bool,
    ) -> Result<String, GitError> {
        let spec = CommandSpec::new(program, cwd, self.env.clone())
            .args(args.iter().map(|a| a.as_ref().to_owned()));
        let limits = Limits {
            timeout: Some(if network {
                self.net_timeout
            } else {
                self.local_timeout
            }),
            grace: self.grace,
            output_cap: 256 * 1024,
        };
        let shown = scrub_url_userinfo(
            &args
                .iter()
                .map(|a| a.as_ref().to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
        );
        let out = process::run(&spec, &limits, &self.cancel, None)
            .await
            .map_err(|e| GitError {
                step: step.to_string(),
                refused: false,
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
            refused: false,
            detail: scrub_url_userinfo(&format!(
                "{} ({})",
                tail(said, ERROR_TAIL_CHARS),
                out.exit.describe()
            )),
        })
    }
}

/// The empty HOME the daemon's git runs with: `state_dir/git-home`, created by the daemon
/// and never written by git (it is not among git's write grants), so no task and no
/// repository can place a config, an attributes or an ignore file there.
pub fn home_dir(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("git-home")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sh_git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .current_dir(dir)
            .args(args)
            .status()
            .expect("git runs")
            .success();
        assert!(ok, "git {args:?}");
    }

    fn repo() -> (tempfile::TempDir, GitRunner) {
        let d = tempfile::tempdir().unwrap();
        sh_git(d.path(), &["init", "-q"]);
        let git = GitRunner::new(
            &Config::default(),
            &ChildEnv::inherit(),
            CancellationToken::new(),
        );
        (d, git)
    }

    #[tokio::test]
    async fn an_unchanged_config_is_read_once_per_runner_and_its_clones() {
        let (d, git) = repo();
        for _ in 0..3 {
            git.git(d.path(), &["status", "--porcelain"], false)
                .await
                .unwrap();
        }
        let clone = git.clone();
        clone
            .git(d.path(), &["rev-parse", "--git-dir"], false)
            .await
            .unwrap();
        assert_eq!(git.config_reads(), 1);
        // A plain setting changes the bytes: read again, still clean, then reused.
        sh_git(d.path(), &["config", "user.name", "A"]);
        for _ in 0..2 {
            git.git(d.path(), &["status"], false).await.unwrap();
        }
        assert_eq!(git.config_reads(), 2);
    }

    #[tokio::test]
    async fn a_key_planted_after_a_clean_call_is_refused_on_the_next() {
        let (d, git) = repo();
        git.git(d.path(), &["status"], false).await.unwrap();
        sh_git(d.path(), &["config", "core.fsmonitor", "./evil"]);
        let e = git.git(d.path(), &["status"], false).await.unwrap_err();
        assert!(e.refused, "{e}");
        assert!(e.detail.contains("core.fsmonitor"), "{e}");
        // Refused again, never from a stale clean verdict.
        assert!(
            git.git(d.path(), &["status"], false)
                .await
                .unwrap_err()
                .refused
        );
        assert_eq!(git.config_reads(), 3);
    }

    #[tokio::test]
    async fn a_same_size_rewrite_with_the_old_mtime_is_still_seen() {
        let (d, git) = repo();
        let config = d.path().join(".git/config");
        // Two settings of equal length: one plain, one that runs a program.
        sh_git(d.path(), &["config", "core.abbrev", "12345678"]);
        git.git(d.path(), &["status"], false).await.unwrap();
        let before = std::fs::read_to_string(&config).unwrap();
        let mtime = std::fs::metadata(&config).unwrap().modified().unwrap();
        let after = before.replace("abbrev = 12345678", "pager = ./evil...");
        assert_eq!(before.len(), after.len());
        {
            use std::io::{Seek, Write};
            // In place: same inode, same size, and the old mtime put back.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&config)
                .unwrap();
            f.seek(std::io::SeekFrom::Start(0)).unwrap();
            f.write_all(after.as_bytes()).unwrap();
            f.set_modified(mtime).unwrap();
        }
        let e = git.git(d.path(), &["status"], false).await.unwrap_err();
        assert!(e.detail.contains("core.pager"), "{e}");
    }

    #[test]
    fn credentials_travel_in_the_environment_never_in_argv_or_config() {
        let cfg = Config::default();
        let git = GitRunner::new(&cfg, &ChildEnv::default(), CancellationToken::new())
            .with_credentials("user:s3cret");
        let env = git.env();
        assert_eq!(env.get("GIT_CONFIG_COUNT"), Some("1"));
        assert_eq!(env.get("GIT_CONFIG_KEY_0"), Some("http.extraHeader"));
        // base64("user:s3cret")
        assert_eq!(
            env.get("GIT_CONFIG_VALUE_0"),
            Some("Authorization: Basic dXNlcjpzM2NyZXQ=")
        );
        let args = harden::overrides(Path::new("/w"));
        assert!(args.iter().all(|a| !a.to_string_lossy().contains("s3cret")));
    }
}
