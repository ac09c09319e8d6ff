//! Workspaces and the git workflow around a task.
//!
//! # Layout
//!
//! - [`prepare`]: where a task runs. A task with a `repo` gets a managed clone in
//!   `state_dir/workspaces/<slug-of-url>`, cloned on first use, otherwise fetched and
//!   hard-reset to the remote's default branch (or the task's `branch`) and fully cleaned.
//!   Without a `repo`: the configured `repo_dir`, else a per-task temp directory that
//!   [`Workspace::release`] removes.
//! - [`WorkspaceLock`]: one task at a time per managed workspace (a lock file with the pid;
//!   a lock whose pid is dead is taken over).
//! - [`start_branch`]: the task branch `<agent>/<slug-of-description>-<id>` from the base.
//! - [`finish`]: after verification, commit, push (`--force-with-lease`), open a pull
//!   request with `gh`, and ask the hub to classify the change's risk.
//!
//! Every git and gh call goes through [`GitRunner`]: argv only, a timeout, its own process
//! group, `GIT_TERMINAL_PROMPT=0` and no askpass program, so a missing credential fails fast
//! instead of waiting for a human.
//!
//! Clean policy: a managed workspace is cleaned with `git clean -ffdx`, ignored files
//! included. Build caches such as `target/` go too; a rebuild costs time, but a task must see
//! exactly the remote's tree, and an ignored `.env` or stale artefact from an earlier task
//! must never decide whether this one verifies. `repo_dir` is the operator's directory: it is
//! never reset or cleaned; a dirty tree there is stashed (recoverable) before branching.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::process::{self, ChildEnv, CommandSpec, Limits};
use crate::redact::scrub_url_userinfo;
use crate::task::Task;
use crate::verify::retry_loop::LoopOutcome;
use crate::verify::VerificationStatus;

/// Bytes of git/gh error output kept in a task's failure reason.
const ERROR_TAIL_CHARS: usize = 600;
/// Bound on the classification request: the hub answers from memory, so a slow answer means
/// trouble, and the task's result must not wait for it.
const CLASSIFY_TIMEOUT: Duration = Duration::from_secs(5);

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

/// What kind of directory a task runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceKind {
    /// A managed clone of the task's `repo`; `base` is the branch it was reset to.
    Managed { base: String },
    /// The configured `repo_dir`: used as is.
    RepoDir,
    /// A per-task directory, removed after the result.
    Temp,
}

/// A prepared workspace. Holds the workspace lock until dropped.
#[derive(Debug)]
pub struct Workspace {
    /// The executor's cwd and tool sandbox root.
    pub path: PathBuf,
    pub kind: WorkspaceKind,
    _lock: Option<WorkspaceLock>,
}

impl Workspace {
    /// Give the workspace up: a temp directory is removed, a lock released.
    pub async fn release(self) {
        if self.kind == WorkspaceKind::Temp {
            if let Err(e) = tokio::fs::remove_dir_all(&self.path).await {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the task's temp workspace; delete it by hand");
                }
            }
        }
    }
}

/// `host/path` of a repository URL as a directory name: safe characters only, credentials
/// stripped, plus a short hash of the clean URL so `a/b` and `a_b` never share a clone.
pub fn slug_of_url(url: &str) -> String {
    let clean = strip_userinfo(url);
    let rest = clean.split_once("://").map_or(clean.as_str(), |(_, r)| r);
    let mut slug = String::new();
    for c in rest.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
            c
        } else {
            '_'
        };
        // No runs of `_`, and never `..` (a name that looks like a parent reference).
        if !((c == '_' || c == '.') && (slug.ends_with('_') || slug.ends_with('.'))) {
            slug.push(c);
        }
    }
    let slug: String = slug
        .trim_matches(|c| c == '_' || c == '.')
        .chars()
        .take(80)
        .collect();
    use sha2::Digest;
    let hash = sha2::Sha256::digest(clean.as_bytes());
    let mut short = String::new();
    for b in &hash[..4] {
        let _ = write!(short, "{b:02x}");
    }
    format!("{}-{short}", if slug.is_empty() { "repo" } else { &slug })
}

/// `url` without `user:pass@`.
pub fn strip_userinfo(url: &str) -> String {
    match userinfo(url) {
        Some(u) => url.replacen(&format!("{u}@"), "", 1),
        None => url.to_string(),
    }
}

/// The `user:pass` part of `scheme://user:pass@host/…`, if any.
pub fn userinfo(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let (info, _) = authority.rsplit_once('@')?;
    (!info.is_empty()).then(|| info.to_string())
}

/// Secrets in a repository URL (the whole userinfo, and the password alone), to add to the
/// task's redactor.
pub fn url_secrets(url: &str) -> Vec<String> {
    let Some(info) = userinfo(url) else {
        return Vec::new();
    };
    let mut v = vec![info.clone()];
    if let Some((_, pass)) = info.split_once(':') {
        v.push(pass.to_string());
    }
    v
}

/// The workspace for `task`: see the module docs. Failures are the task's failure reason.
pub async fn prepare(cfg: &Config, task: &Task, git: &GitRunner) -> Result<Workspace, String> {
    if let Some(url) = task.repo.as_deref().filter(|u| !u.trim().is_empty()) {
        return prepare_managed(cfg, task, url.trim(), git).await;
    }
    if let Some(dir) = &cfg.repo_dir {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| format!("cannot create repo_dir {}: {e}", dir.display()))?;
        return Ok(Workspace {
            path: dir.clone(),
            kind: WorkspaceKind::RepoDir,
            _lock: None,
        });
    }
    let path = crate::runner::workspace_for(cfg, task);
    tokio::fs::create_dir_all(&path)
        .await
        .map_err(|e| format!("cannot create workspace {}: {e}", path.display()))?;
    Ok(Workspace {
        path,
        kind: WorkspaceKind::Temp,
        _lock: None,
    })
}

async fn prepare_managed(
    cfg: &Config,
    task: &Task,
    url: &str,
    git: &GitRunner,
) -> Result<Workspace, String> {
    // Task data never becomes an option: git would read `-…` as one.
    if url.starts_with('-') {
        return Err(format!(
            "task repo `{}` is not a repository URL",
            strip_userinfo(url)
        ));
    }
    if task
        .branch
        .as_deref()
        .is_some_and(|b| b.trim().starts_with('-'))
    {
        return Err("task branch must not start with `-`".into());
    }
    let root = cfg.state_dir.join("workspaces");
    tokio::fs::create_dir_all(&root)
        .await
        .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let slug = slug_of_url(url);
    let path = root.join(&slug);
    let lock = WorkspaceLock::acquire(&root.join(format!("{slug}.lock"))).await?;
    let shown = strip_userinfo(url);
    let fail = |e: GitError| {
        format!(
            "preparing workspace for {shown}: {e} (workspace {}; delete it to force a fresh clone)",
            path.display()
        )
    };

    let cloned = if tokio::fs::metadata(path.join(".git")).await.is_ok() {
        false
    } else {
        // Clone beside the final place and rename when complete: a daemon killed mid-clone
        // leaves only a `.partial` directory, never a half-clone that looks usable.
        let partial = root.join(format!("{slug}.partial"));
        for stale in [&path, &partial] {
            if tokio::fs::metadata(stale).await.is_ok() {
                tokio::fs::remove_dir_all(stale).await.map_err(|e| {
                    format!("cannot remove stale workspace {}: {e}", stale.display())
                })?;
            }
        }
        let dest = partial.to_string_lossy().into_owned();
        if let Err(e) = git
            .git(&root, &["clone", "--quiet", "--", url, &dest], true)
            .await
        {
            let _ = tokio::fs::remove_dir_all(&partial).await;
            return Err(format!("preparing workspace for {shown}: {e}"));
        }
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(|e| format!("cannot move the new clone into {}: {e}", path.display()))?;
        true
    };
    if !cloned {
        // The URL may carry fresh credentials or have moved: always fetch from the task's.
        git.git(&path, &["remote", "set-url", "origin", url], false)
            .await
            .map_err(fail)?;
        git.git(&path, &["fetch", "--prune", "--quiet", "origin"], true)
            .await
            .map_err(fail)?;
    }
    let base = match task.branch.as_deref().filter(|b| !b.trim().is_empty()) {
        Some(b) => b.trim().to_string(),
        None => default_branch(&path, git, true).await.map_err(fail)?,
    };
    let remote_ref = format!("refs/remotes/origin/{base}");
    if git
        .git(
            &path,
            &["rev-parse", "--verify", "--quiet", &remote_ref],
            false,
        )
        .await
        .is_err()
    {
        return Err(format!(
            "preparing workspace for {shown}: branch `{base}` does not exist on origin; check the task's branch"
        ));
    }
    for args in [
        vec!["checkout", "--quiet", "-f", "-B", &base, &remote_ref],
        vec!["reset", "--quiet", "--hard", &remote_ref],
        vec!["clean", "-ffdxq"],
    ] {
        git.git(&path, &args, false).await.map_err(fail)?;
    }
    tracing::info!(task_id = %task.task_id, workspace = %path.display(), base = %base, cloned, "workspace ready");
    Ok(Workspace {
        path,
        kind: WorkspaceKind::Managed { base },
        _lock: Some(lock),
    })
}

/// origin's default branch, as origin says (never assumed to be `main`). With `ask_remote`
/// the remote is asked first (`set-head --auto`); the local `origin/HEAD` is the fallback.
async fn default_branch(
    path: &Path,
    git: &GitRunner,
    ask_remote: bool,
) -> Result<String, GitError> {
    if ask_remote {
        if let Err(e) = git
            .git(path, &["remote", "set-head", "origin", "--auto"], true)
            .await
        {
            tracing::debug!(error = %e, "set-head --auto failed; using the local origin/HEAD");
        }
    }
    let head = git
        .git(
            path,
            &["symbolic-ref", "--quiet", "refs/remotes/origin/HEAD"],
            false,
        )
        .await
        .map_err(|e| GitError {
            step: "detecting origin's default branch".into(),
            detail: format!("{}; set the task's branch", e.detail),
        })?;
    Ok(head
        .trim()
        .trim_start_matches("refs/remotes/origin/")
        .to_string())
}

/// One task at a time per managed workspace: a lock file holding the owner's pid.
#[derive(Debug)]
pub struct WorkspaceLock {
    path: PathBuf,
}

impl WorkspaceLock {
    /// Take the lock, or take over one whose pid is no longer alive (a crashed run).
    pub async fn acquire(path: &Path) -> Result<WorkspaceLock, String> {
        // Written in full to a private file, then hard-linked into place: the link either
        // fails (held) or appears with the pid inside, so nobody ever reads a half-made lock.
        let me = std::process::id();
        let tmp = path.with_extension(format!("lock.{me}.tmp"));
        tokio::fs::write(&tmp, format!("{me}\n"))
            .await
            .map_err(|e| format!("cannot write lock {}: {e}", tmp.display()))?;
        let res = Self::link(&tmp, path).await;
        let _ = tokio::fs::remove_file(&tmp).await;
        res
    }

    async fn link(tmp: &Path, path: &Path) -> Result<WorkspaceLock, String> {
        for _ in 0..3 {
            match tokio::fs::hard_link(tmp, path).await {
                Ok(()) => {
                    return Ok(WorkspaceLock {
                        path: path.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = tokio::fs::read_to_string(path).await.unwrap_or_default();
                    match text.trim().parse::<u32>() {
                        Ok(pid) if pid_alive(pid) => {
                            return Err(format!(
                                "workspace is in use by process {pid} (lock {}); each hub-sidecar needs its own state_dir",
                                path.display()
                            ));
                        }
                        // Dead pid, or garbage: nobody holds it.
                        _ => {
                            tracing::warn!(lock = %path.display(), owner = %text.trim(), "taking over a stale workspace lock");
                            let _ = tokio::fs::remove_file(path).await;
                        }
                    }
                }
                Err(e) => return Err(format!("cannot create lock {}: {e}", path.display())),
            }
        }
        Err(format!(
            "cannot take workspace lock {}: it keeps reappearing",
            path.display()
        ))
    }
}

impl Drop for WorkspaceLock {
    fn drop(&mut self) {
        // One unlink; Drop cannot await, and releasing on every path (cancel, panic) matters
        // more than avoiding a single fast syscall on the runtime.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `pid` names a live process (EPERM counts: it exists, owned by someone else).
#[allow(unsafe_code)]
fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The task branch being worked on.
#[derive(Debug, Clone)]
pub struct TaskBranch {
    /// `<agent>/<slug>-<id>`, see [`branch_name`].
    pub name: String,
    /// Branch the PR targets.
    pub base: String,
    /// Commit the task branch started from: the diff base.
    pub base_sha: String,
}

/// Lowercase ascii, `-` between words, at most `max` chars.
pub fn slugify(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let cut: String = out.chars().take(max).collect();
    cut.trim_matches('-').to_string()
}

/// `<agent>/<slug-of-description's-first-line>-<short task id>`: readable, unique per task, and a valid
/// ref whatever the description holds.
pub fn branch_name(agent_id: &str, task: &Task) -> String {
    let agent = match slugify(agent_id, 40) {
        a if a.is_empty() => "agent".to_string(),
        a => a,
    };
    let id: String = task
        .task_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_lowercase();
    let suffix: String = id
        .chars()
        .skip(id.chars().count().saturating_sub(8))
        .collect();
    let suffix = if suffix.is_empty() {
        "task".to_string()
    } else {
        suffix
    };
    let first = task.description.lines().find(|l| !l.trim().is_empty());
    match slugify(first.unwrap_or(""), 50) {
        d if d.is_empty() => format!("{agent}/{suffix}"),
        d => format!("{agent}/{d}-{suffix}"),
    }
}

/// Commit and PR title: the description's first line, at most 72 chars.
pub fn commit_title(task: &Task) -> String {
    let first = task
        .description
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty());
    match first {
        Some(l) if l.chars().count() > 72 => {
            let mut t: String = l.chars().take(71).collect();
            t.push('…');
            t
        }
        Some(l) => l.to_string(),
        None => format!("Task {}", task.task_id),
    }
}

/// Whether the work tree has uncommitted changes (tracked or untracked).
async fn is_dirty(path: &Path, git: &GitRunner) -> Result<bool, GitError> {
    Ok(!git
        .git(path, &["status", "--porcelain"], false)
        .await?
        .trim()
        .is_empty())
}

/// Create the task branch when the workspace is a git repo with an `origin` and the
/// workflow is enabled; `None` otherwise.
pub async fn start_branch(
    cfg: &Config,
    task: &Task,
    ws: &Workspace,
    git: &GitRunner,
) -> Result<Option<TaskBranch>, GitError> {
    if !cfg.git.enabled || ws.kind == WorkspaceKind::Temp {
        return Ok(None);
    }
    let path = &ws.path;
    // The top of a work tree always has a `.git` entry: without one, skip spawning git.
    if tokio::fs::symlink_metadata(path.join(".git"))
        .await
        .is_err()
    {
        return Ok(None);
    }
    // Only the top of a work tree: a `repo_dir` that merely sits inside some repository must
    // not branch, commit and push that whole repository.
    let is_repo = match git
        .git(path, &["rev-parse", "--show-toplevel"], false)
        .await
    {
        Ok(top) => {
            let top = tokio::fs::canonicalize(top.trim()).await.ok();
            top.is_some() && top == tokio::fs::canonicalize(path).await.ok()
        }
        Err(_) => false,
    };
    if !is_repo
        || git
            .git(path, &["remote", "get-url", "origin"], false)
            .await
            .is_err()
    {
        return Ok(None);
    }
    let base = match &ws.kind {
        WorkspaceKind::Managed { base } => base.clone(),
        _ => match default_branch(path, git, false).await {
            Ok(b) => b,
            // No origin/HEAD in an operator's clone: the branch they are on is the base.
            Err(_) => git
                .git(path, &["rev-parse", "--abbrev-ref", "HEAD"], false)
                .await?
                .trim()
                .to_string(),
        },
    };
    if is_dirty(path, git).await? {
        // Never mix someone's uncommitted work into a task's commit; a stash can be recovered.
        let msg = format!(
            "hub-sidecar: uncommitted work found before task {}",
            task.task_id
        );
        git.git(
            path,
            &["stash", "push", "--include-untracked", "-m", &msg],
            false,
        )
        .await?;
        tracing::warn!(task_id = %task.task_id, workspace = %path.display(), "dirty workspace stashed before branching");
    }
    let name = branch_name(&cfg.agent_id, task);
    // Start from origin's base, not from HEAD: in a `repo_dir` HEAD may still be the previous
    // task's branch, whose commit must not ride along in this task's push.
    let remote_base = format!("refs/remotes/origin/{base}");
    let start = if git
        .git(
            path,
            &["rev-parse", "--verify", "--quiet", &remote_base],
            false,
        )
        .await
        .is_ok()
    {
        remote_base
    } else {
        "HEAD".to_string()
    };
    // -B: a branch of that name left by an earlier run of the same task is recreated here.
    git.git(path, &["checkout", "--quiet", "-B", &name, &start], false)
        .await?;
    let base_sha = git
        .git(path, &["rev-parse", "HEAD"], false)
        .await?
        .trim()
        .to_string();
    tracing::info!(task_id = %task.task_id, branch = %name, base = %base, "task branch created");
    Ok(Some(TaskBranch {
        name,
        base,
        base_sha,
    }))
}

/// `git diff --numstat` totals: what the hub's risk classifier looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiffStats {
    pub lines_added: u64,
    pub lines_deleted: u64,
    pub files_changed: u64,
    /// Changed files that look like tests (`tests/`, `*_test.*`, `*.spec.*`, …).
    pub tests_touched: u64,
}

/// Totals of `git diff --numstat` output (binary files count as changed, with no lines).
pub fn parse_numstat(out: &str) -> DiffStats {
    let mut s = DiffStats::default();
    for line in out.lines() {
        let mut parts = line.splitn(3, '\t');
        let (Some(a), Some(d), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        s.files_changed += 1;
        s.lines_added += a.parse::<u64>().unwrap_or(0);
        s.lines_deleted += d.parse::<u64>().unwrap_or(0);
        if is_test_path(path) {
            s.tests_touched += 1;
        }
    }
    s
}

fn is_test_path(path: &str) -> bool {
    let p = path.to_ascii_lowercase();
    p.split('/').any(|seg| {
        seg == "test"
            || seg == "tests"
            || seg == "spec"
            || seg == "__tests__"
            || seg.starts_with("test_")
            || seg.contains("_test.")
            || seg.contains(".test.")
            || seg.contains("_spec.")
            || seg.contains(".spec.")
    })
}

/// After verification: commit, push, pull request, classification. Returns the keys to merge
/// into `task_complete.result`. Push and PR failures are reported (`git_error`), never fatal:
/// the work is verified either way.
pub async fn finish(
    cfg: &Config,
    task: &Task,
    lo: &LoopOutcome,
    ws: &Workspace,
    tb: &TaskBranch,
    git: &GitRunner,
) -> Map<String, Value> {
    let mut r = Map::new();
    r.insert("branch".into(), json!(tb.name));
    let draft = match lo.verification_status {
        VerificationStatus::Verified => false,
        VerificationStatus::PartialPass if cfg.git.push_drafts => true,
        VerificationStatus::PartialPass => {
            r.insert("pushed".into(), json!(false));
            r.insert(
                "git_note".into(),
                json!("partial_pass: nothing committed or pushed (git.push_drafts is off)"),
            );
            return r;
        }
        VerificationStatus::ExecutionFailed => return r,
    };
    if let Err(e) = commit_push_pr(cfg, task, lo, ws, tb, git, draft, &mut r).await {
        tracing::warn!(task_id = %task.task_id, error = %e, "git workflow step failed; the result reports it");
        r.insert("git_error".into(), json!(e.to_string()));
    }
    r
}

#[allow(clippy::too_many_arguments)]
async fn commit_push_pr(
    cfg: &Config,
    task: &Task,
    lo: &LoopOutcome,
    ws: &Workspace,
    tb: &TaskBranch,
    git: &GitRunner,
    draft: bool,
    r: &mut Map<String, Value>,
) -> Result<(), GitError> {
    let path = &ws.path;
    r.insert("pushed".into(), json!(false));
    git.git(path, &["add", "-A"], false).await?;
    if is_dirty(path, git).await? {
        commit(cfg, task, path, git).await?;
    }
    // An LLM executor may have committed by itself: its commits are the task's work too.
    let sha = git
        .git(path, &["rev-parse", "HEAD"], false)
        .await?
        .trim()
        .to_string();
    if sha == tb.base_sha {
        r.insert(
            "git_note".into(),
            json!("nothing to commit: the task left the tree unchanged; nothing pushed"),
        );
        return Ok(());
    }
    r.insert("commit".into(), json!(sha));
    let title = commit_title(task);
    let range = format!("{}..HEAD", tb.base_sha);
    let stats = parse_numstat(&git.git(path, &["diff", "--numstat", &range], false).await?);
    r.insert("diff_stats".into(), json!(stats));
    r.insert(
        "risk_classification".into(),
        classify(cfg, &task.task_id, &stats).await,
    );

    git.git(
        path,
        &[
            "push",
            "--quiet",
            "--force-with-lease",
            "-u",
            "origin",
            &tb.name,
        ],
        true,
    )
    .await?;
    r.insert("pushed".into(), json!(true));

    let Some(gh) = find_gh(cfg, git, path) else {
        r.insert(
            "git_note".into(),
            json!("branch pushed; no pull request: `gh` not found (install GitHub CLI or set git.gh_path)"),
        );
        return Ok(());
    };
    let body_path = cfg
        .state_dir
        .join(format!("pr-body-{}.md", slugify(&task.task_id, 60)));
    tokio::fs::write(&body_path, pr_body(task, lo))
        .await
        .map_err(|e| GitError {
            step: "writing the pull request body".into(),
            detail: format!("{}: {e}", body_path.display()),
        })?;
    let title_arg = format!("--title={title}");
    let body_arg = format!("--body-file={}", body_path.display());
    let head_arg = format!("--head={}", tb.name);
    let base_arg = format!("--base={}", tb.base);
    let agent_label = format!("--label=agent:{}", cfg.agent_id);
    let prio_label = format!("--label=priority:{}", priority(task));
    let mut args: Vec<&str> = vec![
        "pr",
        "create",
        &title_arg,
        &body_arg,
        &head_arg,
        &base_arg,
        &agent_label,
        &prio_label,
    ];
    let reviewer_arg;
    if let Some(rv) = cfg.git.reviewer.as_deref().filter(|r| !r.is_empty()) {
        reviewer_arg = format!("--reviewer={rv}");
        args.push(&reviewer_arg);
    }
    if draft {
        args.push("--draft");
    }
    let res = git
        .run_program(gh.as_os_str(), "gh pr create", path, &args, true)
        .await;
    let _ = tokio::fs::remove_file(&body_path).await;
    let out = res?;
    let url = out
        .lines()
        .map(str::trim)
        .rfind(|l| l.starts_with("http"))
        .unwrap_or_else(|| out.trim());
    r.insert("pr_url".into(), json!(url));
    Ok(())
}

/// `git commit` of the staged tree: description title, `Task-Id` trailer, configured author.
async fn commit(cfg: &Config, task: &Task, path: &Path, git: &GitRunner) -> Result<(), GitError> {
    let title = commit_title(task);
    let trailer = format!("Task-Id: {}", task.task_id);
    let name = format!("user.name={}", cfg.git.author_name);
    let email = format!("user.email={}", cfg.git.author_email);
    git.git(
        path,
        &[
            "-c",
            &name,
            "-c",
            &email,
            "-c",
            "commit.gpgsign=false",
            "commit",
            "--quiet",
            "--no-verify",
            "-m",
            &title,
            "-m",
            &trailer,
        ],
        false,
    )
    .await
    .map(|_| ())
}

/// `git.gh_path`, else `gh` on the child PATH.
fn find_gh(cfg: &Config, git: &GitRunner, cwd: &Path) -> Option<PathBuf> {
    if let Some(p) = &cfg.git.gh_path {
        return p.is_file().then(|| p.clone());
    }
    let path = git
        .env()
        .vars()
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())?;
    which::which_in("gh", Some(path), cwd).ok()
}

/// `metadata.priority` (string or number), else `normal`.
fn priority(task: &Task) -> String {
    match task.metadata.extra.get("priority") {
        Some(Value::String(s)) if !s.is_empty() => slugify(s, 20),
        Some(Value::Number(n)) => n.to_string(),
        _ => "normal".into(),
    }
}

/// The pull request body: what was asked, how it was verified, what it cost.
pub fn pr_body(task: &Task, lo: &LoopOutcome) -> String {
    let mut b = String::new();
    let _ = writeln!(b, "## Task\n\n{}\n", task.description.trim());
    if !task.success_criteria.is_empty() {
        let _ = writeln!(b, "## Success criteria\n");
        for c in &task.success_criteria {
            let _ = writeln!(b, "- {c}");
        }
        b.push('\n');
    }
    let _ = writeln!(b, "## Verification\n");
    let _ = writeln!(
        b,
        "| attempt | status | passed | failed |\n|---|---|---|---|"
    );
    for a in &lo.attempts {
        let rep = &a.report;
        let status = serde_json::to_value(rep.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            b,
            "| {} | {} | {} | {} |",
            rep.run_number,
            status,
            rep.summary.passed,
            rep.summary.failed + rep.summary.errors + rep.summary.timed_out
        );
    }
    let _ = writeln!(
        b,
        "\nAttempts: {} · cost: ${:.4} ({} tokens in, {} out)\n\nTask-Id: {}",
        lo.attempts.len(),
        lo.cost_usd,
        lo.tokens_in,
        lo.tokens_out,
        task.task_id
    );
    b
}

/// Ask the hub for the change's risk tier. Any failure gives tier 2, "classification
/// unavailable": a missing classifier must not block a verified result.
pub async fn classify(cfg: &Config, task_id: &str, stats: &DiffStats) -> Value {
    let fallback = json!({"tier": 2, "reason": "classification unavailable"});
    let url = format!(
        "{}/api/tasks/{}/classify",
        cfg.hub_api_url(),
        slug_path_segment(task_id)
    );
    // Building a client loads the native root store: blocking work, so off the runtime.
    let client = match tokio::task::spawn_blocking(|| {
        reqwest::Client::builder().timeout(CLASSIFY_TIMEOUT).build()
    })
    .await
    {
        Ok(Ok(c)) => c,
        _ => return fallback,
    };
    let res = client
        .post(&url)
        .bearer_auth(&cfg.token)
        .json(stats)
        .send()
        .await;
    let answer = match res {
        Ok(r) if r.status().is_success() => r.json::<Value>().await.ok(),
        Ok(r) => {
            tracing::warn!(status = %r.status(), "risk classification refused; using tier 2");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "risk classification unavailable; using tier 2");
            None
        }
    };
    match answer {
        Some(v) if v.get("tier").is_some() => v,
        _ => fallback,
    }
}

/// A task id made safe as one URL path segment (percent-encoding everything unusual).
fn slug_path_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, desc: &str) -> Task {
        serde_json::from_value(json!({"task_id": id, "description": desc})).unwrap()
    }

    #[test]
    fn workspace_slug_strips_credentials_and_is_safe() {
        let a = slug_of_url("https://user:s3cret@github.com/org/repo.git");
        assert!(a.starts_with("github.com_org_repo.git-"), "{a}");
        assert!(!a.contains("s3cret") && !a.contains("user"));
        assert_eq!(a, slug_of_url("https://github.com/org/repo.git"));
        assert_ne!(slug_of_url("file:///a/b"), slug_of_url("file:///a_b"));
        let p = slug_of_url("/tmp/x y/../bare.git");
        assert!(p
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)));
        assert!(!p.contains(".."), "{p}");
    }

    #[test]
    fn workspace_url_secrets_and_stripping() {
        let u = "http://user:s3cretpass@127.0.0.1:1/x.git";
        assert_eq!(strip_userinfo(u), "http://127.0.0.1:1/x.git");
        assert_eq!(url_secrets(u), vec!["user:s3cretpass", "s3cretpass"]);
        assert!(url_secrets("/srv/git/x.git").is_empty());
        assert!(url_secrets("https://h/a@b").is_empty());
    }

    #[test]
    fn workspace_branch_name_is_a_sane_ref_whatever_the_description() {
        let t = task(
            "task-1234-ABCDEF99",
            "$(touch /tmp/pwned) `id` ; rm -rf ~ | & > < Fix the parser",
        );
        let b = branch_name("Agent 7", &t);
        assert_eq!(
            b,
            "agent-7/touch-tmp-pwned-id-rm-rf-fix-the-parser-abcdef99"
        );
        let t = task("t", &"x".repeat(300));
        let b = branch_name("a", &t);
        assert!(b.len() <= 2 + 50 + 2, "{b}");
        assert_eq!(branch_name("a", &task("t-9", "!!!")), "a/t9");
    }

    #[test]
    fn workspace_commit_title_is_first_line_within_72() {
        assert_eq!(commit_title(&task("t", "\n  Add x  \nmore")), "Add x");
        assert_eq!(
            commit_title(&task("t", &"y".repeat(100))).chars().count(),
            72
        );
        assert_eq!(commit_title(&task("t", "")), "Task t");
    }

    #[test]
    fn workspace_numstat_totals_and_tests() {
        let s = parse_numstat(
            "3\t1\tsrc/a.rs\n10\t0\ttests/it/b.rs\n-\t-\timg.png\n2\t2\tfoo_test.go\n",
        );
        assert_eq!(
            s,
            DiffStats {
                lines_added: 15,
                lines_deleted: 3,
                files_changed: 4,
                tests_touched: 2
            }
        );
    }

    #[tokio::test]
    async fn workspace_lock_is_exclusive_and_a_dead_pid_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.lock");
        let l = WorkspaceLock::acquire(&p).await.unwrap();
        let e = WorkspaceLock::acquire(&p).await.unwrap_err();
        assert!(e.contains("in use by process"), "{e}");
        drop(l);
        assert!(!p.exists());
        // A pid that cannot be alive: beyond pid_max on Linux.
        std::fs::write(&p, "2147483000\n").unwrap();
        let _l = WorkspaceLock::acquire(&p).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            std::process::id().to_string()
        );
    }
}
