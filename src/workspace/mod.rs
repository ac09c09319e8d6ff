//! Where a task runs.
//!
//! A task with a `repo` gets a managed clone in `state_dir/workspaces/<slug-of-url>`, cloned
//! on first use, otherwise fetched and hard-reset to the remote's default branch (or the
//! task's `branch`) and fully cleaned. Without a `repo`: the configured `repo_dir`, else a
//! per-task directory that [`Workspace::release`] removes.
//!
//! Clean policy: a managed workspace is cleaned with `git clean -ffdx`, ignored files
//! included. Build caches such as `target/` go too; a rebuild costs time, but a task must see
//! exactly the remote's tree, and an ignored `.env` or stale artefact from an earlier task
//! must never decide whether this one verifies — unless the operator lists paths in
//! `git.warm_cache` (off by default): those are kept between tasks of the same clone, with
//! the risk that one task's artefacts reach the next. `repo_dir` is the operator's directory: it is
//! never reset or cleaned; a dirty tree there is stashed (recoverable) before branching.
//!
//! # Layout
//!
//! - [`prepare`] and [`Workspace`]: this file.
//! - [`lock`]: [`WorkspaceLock`], one task at a time per managed clone.

mod lock;

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::git::branch::default_branch;
use crate::git::url::{slug_of_url, strip_userinfo, userinfo};
use crate::git::{GitError, GitRunner};
use crate::sandbox::teardown;
use crate::task::Task;

pub use lock::WorkspaceLock;

/// Why a workspace could not be prepared. The message is the task's failure reason: it says
/// what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// Another live process holds the managed clone's lock.
    #[error("workspace is in use by process {pid} (lock {}); each hub-sidecar needs its own state_dir", lock.display())]
    Busy {
        /// The process holding it.
        pid: u32,
        /// The lock file.
        lock: PathBuf,
    },
    /// The task or the config asks for something the daemon refuses to do.
    #[error("{0}")]
    Refused(String),
    /// A file-system step failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("create workspace", …).
        action: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// A git step failed (clone, fetch, reset, …); the message names the repository.
    #[error("{0}")]
    Git(String),
}

impl WorkspaceError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> WorkspaceError {
        let path = path.to_path_buf();
        move |source| WorkspaceError::Io {
            action,
            path,
            source,
        }
    }
}

/// What kind of directory a task runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceKind {
    /// A managed clone of the task's `repo`; `base` is the branch it was reset to, and
    /// `git_dir` its git directory, kept outside the workspace (see [`prepare`]).
    Managed {
        /// The branch the clone was reset to.
        base: String,
        /// The clone's git directory (outside the workspace).
        git_dir: PathBuf,
    },
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
    /// Managed clone, `repo_dir` or per-task directory.
    pub kind: WorkspaceKind,
    _lock: Option<WorkspaceLock>,
}

impl Workspace {
    /// The git directory the daemon owns, for a managed clone.
    pub fn git_dir(&self) -> Option<&Path> {
        match &self.kind {
            WorkspaceKind::Managed { git_dir, .. } => Some(git_dir),
            _ => None,
        }
    }

    /// Give the workspace up: a temp directory is removed off the runtime (or set aside, see
    /// [`remove_task_tree`]: returned, for the caller to report), a lock released.
    pub async fn release(self) -> Option<SetAside> {
        if self.kind != WorkspaceKind::Temp {
            return None;
        }
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || self.release_blocking())
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, what = "temp workspace", "cannot remove what the task left; delete it by hand");
                None
            })
    }

    /// [`Workspace::release`] on the calling thread (it may block): for a caller already
    /// off the runtime.
    pub fn release_blocking(self) -> Option<SetAside> {
        if self.kind == WorkspaceKind::Temp {
            let budget = teardown::Budget::for_task_tree();
            return remove_task_tree(&self.path, "temp workspace", budget);
        }
        None
    }
}

/// What a task's workspace is, decided once from the config and the task: the runner asks
/// [`Shape::of`] once and prepares, confines and cleans up from that one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// A managed clone of the task's `repo` (the URL as given, trimmed).
    Managed {
        /// The repository URL.
        url: String,
    },
    /// The operator's `repo_dir`.
    RepoDir {
        /// `repo_dir`.
        path: PathBuf,
    },
    /// A per-task directory (`state_dir/work/<id>`): nobody's repository, so the daemon runs
    /// no git in it and no dependency caches are kept for it; removed with its task.
    Temp {
        /// The directory.
        path: PathBuf,
    },
}

impl Shape {
    /// The shape of `task`'s workspace: its `repo`, else `repo_dir`, else a directory of its
    /// own, `work/<dirs>` (see [`dirs_name`]).
    pub fn of(cfg: &Config, task: &Task, dirs: &str) -> Shape {
        if let Some(url) = task
            .repo
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        {
            return Shape::Managed {
                url: url.to_string(),
            };
        }
        match &cfg.repo_dir {
            Some(path) => Shape::RepoDir { path: path.clone() },
            None => Shape::Temp {
                path: task_dirs_root(cfg).join(dirs),
            },
        }
    }

    /// Where the daemon's git calls write: the managed clones' root (a clone is made beside
    /// its final place) and a remote that is a local path (a push writes there), else the
    /// workspace itself.
    pub fn git_write_roots(&self, cfg: &Config) -> Vec<PathBuf> {
        match self {
            Shape::Managed { url } => {
                let mut v = vec![
                    cfg.state_dir.join("workspaces"),
                    cfg.state_dir.join("gitdirs"),
                ];
                v.extend(crate::git::url::local_path(url));
                v
            }
            Shape::RepoDir { path } | Shape::Temp { path } => vec![path.clone()],
        }
    }
}

/// The workspace of `shape` for `task`: see the module docs. Failures are the task's failure
/// reason. `git` is used for a managed clone only.
pub async fn prepare(
    cfg: &Config,
    task: &Task,
    shape: &Shape,
    git: &GitRunner,
) -> Result<Workspace, WorkspaceError> {
    match shape {
        Shape::Managed { url } => prepare_managed(cfg, task, url, git).await,
        Shape::RepoDir { path } => directory(path, WorkspaceKind::RepoDir, "create repo_dir").await,
        Shape::Temp { path } => prepare_temp(path).await,
    }
}

/// The per-task directory of a [`Shape::Temp`] task: created empty, removed on release.
pub async fn prepare_temp(path: &Path) -> Result<Workspace, WorkspaceError> {
    directory(path, WorkspaceKind::Temp, "create workspace").await
}

/// [`prepare_temp`], blocking: for a directory made ahead of its task (`runner::ahead`).
pub fn prepare_temp_blocking(path: &Path) -> Result<Workspace, WorkspaceError> {
    std::fs::create_dir_all(path).map_err(WorkspaceError::io("create workspace", path))?;
    Ok(Workspace {
        path: path.to_path_buf(),
        kind: WorkspaceKind::Temp,
        _lock: None,
    })
}

/// A workspace of `kind` at `path`, created if missing (`what` names the step in an error).
async fn directory(
    path: &Path,
    kind: WorkspaceKind,
    what: &'static str,
) -> Result<Workspace, WorkspaceError> {
    tokio::fs::create_dir_all(path)
        .await
        .map_err(WorkspaceError::io(what, path))?;
    Ok(Workspace {
        path: path.to_path_buf(),
        kind,
        _lock: None,
    })
}

async fn prepare_managed(
    cfg: &Config,
    task: &Task,
    url: &str,
    git: &GitRunner,
) -> Result<Workspace, WorkspaceError> {
    // Task data never becomes an option: git would read `-…` as one.
    if url.starts_with('-') {
        return Err(WorkspaceError::Refused(format!(
            "task repo `{}` is not a repository URL",
            strip_userinfo(url)
        )));
    }
    if task
        .branch
        .as_deref()
        .is_some_and(|b| b.trim().starts_with('-'))
    {
        return Err(WorkspaceError::Refused(
            "task branch must not start with `-`".into(),
        ));
    }
    let root = cfg.state_dir.join("workspaces");
    let git_root = cfg.state_dir.join("gitdirs");
    for d in [&root, &git_root] {
        tokio::fs::create_dir_all(d)
            .await
            .map_err(WorkspaceError::io("create", d))?;
    }
    let slug = slug_of_url(url);
    let path = root.join(&slug);
    // The git directory lives outside the workspace, where the task cannot write: its
    // hooks and config stay the daemon's own (see `git::harden`).
    let git_dir = git_root.join(format!("{slug}.git"));
    let lock = WorkspaceLock::acquire(&root.join(format!("{slug}.lock"))).await?;
    let shown = strip_userinfo(url);
    // Credentials in the URL go with each call, never into the clone's config.
    let git = match userinfo(url) {
        Some(info) if url.starts_with("http") => git.clone().with_credentials(&info),
        _ => git.clone(),
    };
    let fail = |e: GitError| {
        WorkspaceError::Git(format!(
            "preparing workspace for {shown}: {e} (workspace {}; delete it to force a fresh clone)",
            path.display()
        ))
    };

    let cloned = if tokio::fs::metadata(git_dir.join("HEAD")).await.is_ok()
        && tokio::fs::metadata(&path).await.is_ok()
    {
        false
    } else {
        // Clone beside the final places and rename when complete: a daemon killed mid-clone
        // leaves only `.partial` directories, never a half-clone that looks usable. A
        // workspace from an older layout (its `.git` inside) is replaced the same way.
        let partial = root.join(format!("{slug}.partial"));
        let partial_git = git_root.join(format!("{slug}.git.partial"));
        for stale in [&path, &partial, &git_dir, &partial_git] {
            if tokio::fs::symlink_metadata(stale).await.is_ok() {
                blocking_remove(stale)
                    .await
                    .map_err(WorkspaceError::io("remove stale workspace", stale))?;
            }
        }
        let dest = partial.to_string_lossy().into_owned();
        let sep = format!("--separate-git-dir={}", partial_git.display());
        if let Err(e) = git
            .git(
                &root,
                &["clone", "--quiet", &sep, "--", &shown, &dest],
                true,
            )
            .await
        {
            let _ = blocking_remove(&partial).await;
            let _ = blocking_remove(&partial_git).await;
            return Err(WorkspaceError::Git(format!(
                "preparing workspace for {shown}: {e}"
            )));
        }
        tokio::fs::rename(&partial_git, &git_dir)
            .await
            .map_err(WorkspaceError::io("move the new clone into", &git_dir))?;
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(WorkspaceError::io("move the new clone into", &path))?;
        true
    };
    let git = git.trusting(&path, &git_dir);
    if !cloned {
        // The URL may have moved: always fetch from the task's (without credentials).
        git.git(&path, &["remote", "set-url", "origin", &shown], false)
            .await
            .map_err(fail)?;
        git.git(&path, &["fetch", "--prune", "--quiet", "origin"], true)
            .await
            .map_err(fail)?;
    }
    let base = match task.branch.as_deref().filter(|b| !b.trim().is_empty()) {
        Some(b) => b.trim().to_string(),
        None => default_branch(&path, &git, true).await.map_err(fail)?,
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
        return Err(WorkspaceError::Git(format!(
            "preparing workspace for {shown}: branch `{base}` does not exist on origin; check the task's branch"
        )));
    }
    let mut clean = vec!["clean".to_string(), "-ffdxq".to_string()];
    clean.extend(keep_patterns(&cfg.git.warm_cache)?);
    let clean: Vec<&str> = clean.iter().map(String::as_str).collect();
    for args in [
        vec!["checkout", "--quiet", "-f", "-B", &base, &remote_ref],
        vec!["reset", "--quiet", "--hard", &remote_ref],
        clean,
    ] {
        git.git(&path, &args, false).await.map_err(fail)?;
    }
    // The task's own git finds the (read-only) history through a `.git` file; whatever the
    // last task put in its place is replaced. The daemon never reads it: it names the git
    // directory itself.
    let dot_git = path.join(".git");
    if let Ok(m) = tokio::fs::symlink_metadata(&dot_git).await {
        let _ = if m.is_dir() {
            blocking_remove(&dot_git).await
        } else {
            tokio::fs::remove_file(&dot_git).await
        };
    }
    tokio::fs::write(&dot_git, format!("gitdir: {}\n", git_dir.display()))
        .await
        .map_err(WorkspaceError::io("write", &dot_git))?;
    tracing::info!(task_id = %task.task_id, workspace = %path.display(), base = %base, cloned, "workspace ready");
    Ok(Workspace {
        path,
        kind: WorkspaceKind::Managed { base, git_dir },
        _lock: Some(lock),
    })
}

/// `git clean` arguments that keep the warm-cache paths (`git.warm_cache`): with `-x` only
/// the `-e` patterns given here are honoured, so nothing else ignored survives. Each path is
/// anchored at the clone's root (`target/` keeps `/target/`, not `src/target/`). A path that
/// could name something outside the clone or the clone's git link is refused, not skipped:
/// the operator asked for it and should hear why it is not kept.
fn keep_patterns(paths: &[String]) -> Result<Vec<String>, WorkspaceError> {
    let mut out = Vec::with_capacity(paths.len() * 2);
    for p in paths {
        let Some(rel) = crate::config::warm_cache_entry(p) else {
            return Err(WorkspaceError::Refused(format!(
                "git.warm_cache entry `{p}` is not a plain path inside the clone (like `target/`); fix the config"
            )));
        };
        out.push("-e".to_string());
        out.push(format!("/{rel}"));
    }
    Ok(out)
}

/// The workspace for a task without a repository: `repo_dir`, else a per-task directory
/// (which [`prepare`] treats as temporary).
pub fn workspace_for(cfg: &Config, task: &Task) -> PathBuf {
    match &cfg.repo_dir {
        Some(d) => d.clone(),
        None => task_dirs_root(cfg).join(safe_name(&task.task_id)),
    }
}

/// A task id as one safe directory name.
fn safe_name(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect()
}

/// The name of a task's private directories (its TMPDIR and, without a repository, its
/// workspace): the one recorded with the task when its directories were made ahead of it
/// (`runner::ahead`), else its id as a safe name. A name made ahead has a `.` in it, which
/// no task id's safe name has.
pub fn dirs_name(task: &Task, recorded: Option<&str>) -> String {
    // The state file is the daemon's own, but a name read back from it becomes a path the
    // daemon creates and removes trees at: only one plain component of the safe characters.
    let plain = |n: &&str| {
        !n.is_empty()
            && n.len() <= 120
            && !n.starts_with('.')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match recorded.filter(plain) {
        Some(name) => name.to_string(),
        None => safe_name(&task.task_id),
    }
}

/// Whether a task without a repository gets a directory of its own ([`Shape::Temp`]), not
/// the operator's `repo_dir`.
pub fn temp_shaped(cfg: &Config, task: &Task) -> bool {
    matches!(Shape::of(cfg, task, ""), Shape::Temp { .. })
}

/// The task's private TMPDIR, `state_dir/tmp/<dirs>` ([`dirs_name`]): inside the state
/// directory, which a task's children cannot otherwise reach, and removed with the task.
pub fn task_tmp_dir(cfg: &Config, dirs: &str) -> PathBuf {
    tmp_dirs_root(cfg).join(dirs)
}

/// Where the per-task directories ([`WorkspaceKind::Temp`]) are: `state_dir/work`.
pub fn task_dirs_root(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("work")
}

/// Where the tasks' private TMPDIRs are: `state_dir/tmp`.
fn tmp_dirs_root(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("tmp")
}

/// Remove what tasks of an earlier run left in the state directory: the per-task TMPDIRs
/// (`tmp/`) and per-task workspaces (`work/`) of every task but the one whose directories
/// are named `keep` ([`dirs_name`]: the unfinished task the hub is asked about, whose work
/// may continue), and but what this run makes ahead (names starting with `ours`, see
/// `runner::ahead`). A daemon killed mid-task, or between a result and its removal (see
/// `runner::Leftovers`), leaves them; nothing else would ever remove them. Returns how many
/// were removed and how many trees are set aside (found from an earlier run, never walked
/// again, and set aside now), for the caller to report.
pub async fn remove_orphans(cfg: &Config, keep: Option<String>, ours: &str) -> Swept {
    let ours = ours.to_string();
    let roots = [tmp_dirs_root(cfg), task_dirs_root(cfg)];
    let swept = tokio::task::spawn_blocking(move || {
        let mut swept = Swept::default();
        for root in roots {
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            for e in entries.flatten() {
                if keep.as_deref().is_some_and(|k| e.file_name() == k) {
                    continue;
                }
                if !ours.is_empty() && e.file_name().to_string_lossy().starts_with(&ours) {
                    continue;
                }
                // What an earlier removal set aside is never walked again on its own: a
                // tree that stopped one removal would stop every start.
                if e.file_name() == teardown::SET_ASIDE {
                    let names = teardown::set_aside_in(&root);
                    swept.set_aside += names.len();
                    if !names.is_empty() {
                        tracing::warn!(dir = %e.path().display(), trees = names.len(), "trees tasks left that could not be removed are set aside here; delete them by hand (rm -rf as the service user) when the disk allows");
                    }
                    continue;
                }
                match teardown::remove_or_set_aside(&e.path()) {
                    teardown::Removal::Removed => swept.removed += 1,
                    teardown::Removal::SetAside { to, why } => {
                        swept.set_aside += 1;
                        tracing::warn!(path = %e.path().display(), set_aside = %to.display(), why, "cannot remove what an earlier task left; set it aside (delete it by hand)")
                    }
                    teardown::Removal::Failed(err) => {
                        tracing::warn!(path = %e.path().display(), error = %err, "cannot remove what an earlier task left; delete it by hand")
                    }
                }
            }
        }
        swept
    })
    .await
    .unwrap_or_default();
    if swept.removed > 0 {
        tracing::info!(
            removed = swept.removed,
            "removed the directories tasks of an earlier run left in the state directory"
        );
    }
    swept
}

/// What [`remove_orphans`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Directories removed.
    pub removed: usize,
    /// Trees in the `.set-aside` directories now: found there (never walked again) or set
    /// aside by this sweep.
    pub set_aside: usize,
}

/// A tree a task left that could not be removed and was set aside (see [`teardown`]): what
/// the caller reports (metrics, health, the task's flight record).
#[derive(Debug, Clone)]
pub struct SetAside {
    /// What it was: `TMPDIR`, `temp workspace`.
    pub what: &'static str,
    /// Where it was.
    pub path: PathBuf,
    /// Where it is now (delete it by hand).
    pub to: PathBuf,
    /// Why it could not be removed.
    pub why: String,
}

/// Remove a task's TMPDIR (whatever the task left there, read-only directories included:
/// Go makes its module cache so, and with caches off it is in the task's HOME here) within
/// `budget` ([`teardown::Budget::for_task_tree`] but in tests), on the calling thread (it
/// blocks: the caller is off the runtime).
pub fn remove_task_tmp_dir(path: &Path, budget: teardown::Budget) -> Option<SetAside> {
    remove_task_tree(path, "TMPDIR", budget)
}

/// Remove a tree a task wrote (its TMPDIR, a temp workspace) at any depth within `budget`,
/// on the calling thread (it blocks); one that cannot be removed within its budget is set
/// aside beside it and returned for the caller to report, never walked again by the start-up
/// sweep (see [`teardown`]).
fn remove_task_tree(
    path: &Path,
    what: &'static str,
    mut budget: teardown::Budget,
) -> Option<SetAside> {
    match teardown::remove_or_set_aside_within(path, &mut budget) {
        teardown::Removal::Removed => None,
        teardown::Removal::SetAside { to, why } => {
            tracing::warn!(path = %path.display(), set_aside = %to.display(), why, what, "cannot remove what the task left; set it aside (delete it by hand)");
            Some(SetAside {
                what,
                path: path.to_path_buf(),
                to,
                why,
            })
        }
        teardown::Removal::Failed(e) => {
            tracing::warn!(path = %path.display(), error = %e, what, "cannot remove what the task left; delete it by hand");
            None
        }
    }
}

/// Remove the tree (or file, or link) at `path`, off the runtime, at any depth.
async fn blocking_remove(path: &Path) -> std::io::Result<()> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || crate::sandbox::beneath::remove_tree(&p))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
}

#[cfg(test)]
mod tests;
