//! The first phase of a task, before anything of the task runs: its workspace (clone and
//! task branch, with the daemon's own confined git) and the sandbox its children run in.

use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::git::branch::TaskBranch;
use crate::git::{GitError, GitRunner};
use crate::process::ChildEnv;
use crate::progress::{ProgressEvent, ProgressSink};
use crate::sandbox::{ContainmentError, Grants};
use crate::task::Task;
use crate::workspace::{self, Shape, Workspace, WorkspaceKind};

use super::RunnerDeps;

/// What a task runs with, ready: the daemon's git (confined, no HOME), the workspace and its
/// task branch, and the task's children's environment with its sandbox.
pub(super) type Prepared = (GitRunner, Workspace, Option<TaskBranch>, ChildEnv);

/// What a task gets of the directories and sandbox made ahead of it ([`super::Ahead::hand_over`]):
/// both ready, or only the directories.
pub(super) type Handed = Result<(Workspace, ChildEnv), Workspace>;

/// Prepare: the workspace (clone, branch) with the daemon's confined git, then the task's
/// sandbox over it. The first phase of a task, before anything of the task runs. `dirs` names
/// the task's private directories (`tmp` among them); `ahead`, when given, is what was made
/// ahead of the task of them and of its sandbox (`ahead.rs`).
pub(super) async fn prepare(
    task: &Task,
    deps: &RunnerDeps,
    (dirs, ahead): (&str, Option<Handed>),
    tmp: &Path,
    progress: &ProgressSink,
    cancel: &CancellationToken,
) -> Result<Prepared, PrepareError> {
    let cfg = &deps.config;
    // What the workspace is, asked once: everything below follows from the answer.
    let shape = workspace::Shape::of(cfg, task, dirs);
    if let Shape::Temp { path } = &shape {
        return prepare_temp(task, path, deps, tmp, ahead, cancel).await;
    }
    // Made ahead only for a task in a directory of its own (the daemon asks the shape first).
    drop(ahead);
    // The daemon's own git calls are children too: confined to the workspaces, never
    // the state file, and with no HOME but an empty one of the daemon's (see
    // `git::home_dir`): nothing of the service user's reaches them.
    let git_roots = shape.git_write_roots(cfg);
    let git_home = crate::git::home_dir(cfg);
    for root in git_roots
        .iter()
        .filter(|r| r.starts_with(&cfg.state_dir))
        .chain([&git_home])
    {
        // A Landlock rule needs an existing directory.
        tokio::fs::create_dir_all(root)
            .await
            .map_err(|source| PrepareError::GitRoot {
                path: root.clone(),
                source,
            })?;
    }
    let git_env = confine_off_runtime(
        cfg,
        deps,
        tmp,
        Grants {
            write: git_roots,
            read: vec![git_home],
            task: false,
            caches: false,
            hosts: Vec::new(),
        },
    )
    .await?;
    let git = GitRunner::new(cfg, &git_env, cancel.clone());
    let (ws, branch) = prepare_workspace(cfg, task, &shape, &git, progress).await?;
    let (ws, env) = task_sandbox(task, deps, tmp, ws).await?;
    let git = match ws.git_dir() {
        Some(dir) => git.trusting(&ws.path, dir),
        None => git,
    };
    Ok((git, ws, branch, env))
}

/// [`prepare`] for a task in a per-task directory ([`Shape::Temp`]): nobody's repository,
/// so no git of the daemon's runs there and no sandbox is built for one (it was half of a
/// short task's set-up). The runner handed on is over the task's own sandbox and is never
/// called: there is no branch to publish.
async fn prepare_temp(
    task: &Task,
    path: &Path,
    deps: &RunnerDeps,
    tmp: &Path,
    ahead: Option<Handed>,
    cancel: &CancellationToken,
) -> Result<Prepared, PrepareError> {
    let runner = |env: &ChildEnv| GitRunner::new(&deps.config, env, cancel.clone());
    let ws = match ahead {
        Some(Ok((ws, env))) => return Ok((runner(&env), ws, None, env)),
        Some(Err(ws)) => {
            tracing::debug!(task_id = %task.task_id, "the sandbox made ahead may not serve this task; building its own");
            ws
        }
        None => workspace::prepare_temp(path).await?,
    };
    let (ws, env) = task_sandbox(task, deps, tmp, ws).await?;
    Ok((runner(&env), ws, None, env))
}

/// The task's own children's sandbox over `ws` ([`task_grants`]); a workspace the task
/// cannot be confined in is released.
async fn task_sandbox(
    task: &Task,
    deps: &RunnerDeps,
    tmp: &Path,
    ws: Workspace,
) -> Result<(Workspace, ChildEnv), PrepareError> {
    let grants = task_grants(task.repo.as_deref(), &ws);
    match confine_off_runtime(&deps.config, deps, tmp, grants).await {
        Ok(env) => {
            if let Some(bytes) = env.sandbox().and_then(|s| s.caches_bytes) {
                let max = deps.config.caches.max_size_mb.saturating_mul(1024 * 1024);
                deps.ops.caches_used(bytes, max);
            }
            Ok((ws, env))
        }
        Err(e) => {
            ws.release().await;
            Err(PrepareError::Containment(e))
        }
    }
}

/// What a task's own children may use: the workspace read-write, a managed clone's history
/// read-only (for the task's own git), the repository's caches (not for a per-task
/// directory, nobody's repository) and the network policy, with the remote of the task's
/// `repo` among the hosts it may reach.
pub(super) fn task_grants(repo: Option<&str>, ws: &Workspace) -> Grants {
    Grants {
        write: vec![ws.path.clone()],
        read: ws.git_dir().into_iter().map(Path::to_path_buf).collect(),
        task: true,
        caches: ws.kind != WorkspaceKind::Temp,
        hosts: repo
            .and_then(crate::sandbox::proxy::remote_host)
            .into_iter()
            .collect(),
    }
}

/// Why a task never reached its executor; the message is the `task_failed` reason.
#[derive(Debug, thiserror::Error)]
pub(super) enum PrepareError {
    /// A directory the daemon's git writes in could not be created.
    #[error("cannot create {}: {source}", path.display())]
    GitRoot {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The task's children cannot be confined as the level demands.
    #[error(transparent)]
    Containment(#[from] ContainmentError),
    /// The workspace could not be prepared (the workspace module's own message).
    #[error(transparent)]
    Workspace(#[from] workspace::WorkspaceError),
    /// The task branch could not be created.
    #[error("creating the task branch: {0}")]
    Branch(GitError),
}

/// [`process::confine`](crate::process::confine) on the blocking pool: building a ruleset opens every granted tree
/// (and lists the ones it carves), file-system work that has no place on the runtime.
async fn confine_off_runtime(
    cfg: &Arc<Config>,
    deps: &RunnerDeps,
    tmp: &Path,
    grants: Grants,
) -> Result<ChildEnv, ContainmentError> {
    let (cfg, policy, env, tmp) = (
        cfg.clone(),
        deps.containment.clone(),
        deps.env.clone(),
        tmp.to_path_buf(),
    );
    tokio::task::spawn_blocking(move || crate::process::confine(&cfg, &policy, &env, &tmp, &grants))
        .await
        .map_err(|e| ContainmentError::Panicked(e.to_string()))?
}

/// The task's workspace and, when the git workflow applies, its task branch.
async fn prepare_workspace(
    cfg: &Config,
    task: &Task,
    shape: &Shape,
    git: &GitRunner,
    progress: &ProgressSink,
) -> Result<(Workspace, Option<TaskBranch>), PrepareError> {
    if matches!(shape, Shape::Managed { .. }) {
        progress.emit(ProgressEvent::status("preparing the repository workspace"));
    }
    let ws = workspace::prepare(cfg, task, shape, git).await?;
    let branch = match &ws.kind {
        // A per-task directory is nobody's repository: nothing to branch or push.
        WorkspaceKind::Temp => Ok(None),
        WorkspaceKind::Managed { base, git_dir } => {
            let git = git.clone().trusting(&ws.path, git_dir);
            crate::git::branch::start_branch(cfg, task, &ws.path, Some(base), &git).await
        }
        WorkspaceKind::RepoDir => {
            crate::git::branch::start_branch(cfg, task, &ws.path, None, git).await
        }
    };
    match branch {
        Ok(branch) => {
            if let Some(b) = &branch {
                progress.emit(ProgressEvent::status(format!(
                    "git: task branch {} from {}",
                    b.name, b.base
                )));
            }
            Ok((ws, branch))
        }
        Err(e) => {
            ws.release().await;
            Err(PrepareError::Branch(e))
        }
    }
}
