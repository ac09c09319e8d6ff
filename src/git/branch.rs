//! The task branch: its name, the base it starts from, and creating it in the workspace.
//!
//! The base is what the remote has when the task starts: fetched by the daemon from the
//! URL the push goes to ([`push_url`]), into `refs/remotes/origin/<base>`, and read back
//! before any of the task's processes run. A ref a previous task moved in the work tree
//! (`refs/remotes/origin/main` pointed at a commit of its own) is overwritten, never
//! branched from: a task never chooses the next task's base.

use std::path::Path;

use crate::config::Config;
use crate::task::Task;

use super::{GitError, GitRunner};

/// origin's default branch, as origin says (never assumed to be `main`). With `ask_remote`
/// the remote is asked first (`set-head --auto`); the local `origin/HEAD` is the fallback.
pub(crate) async fn default_branch(
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
            refused: e.refused,
        })?;
    Ok(head
        .trim()
        .trim_start_matches("refs/remotes/origin/")
        .to_string())
}

/// The task branch being worked on.
#[derive(Debug, Clone)]
pub struct TaskBranch {
    /// `<agent>/<slug>-<id>`, see [`branch_name`].
    pub name: String,
    /// Branch the PR targets.
    pub base: String,
    /// Commit the task branch started from, as the remote had it at the start: the diff
    /// base.
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

/// The URL a push to origin goes to (its first push URL): what the base is fetched from
/// and the push scan asks for the remote's tips, so both speak of the remote pushed to.
pub(crate) async fn push_url(path: &Path, git: &GitRunner) -> Result<String, GitError> {
    let out = git
        .git(path, &["remote", "get-url", "--push", "origin"], false)
        .await?;
    match out.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(url) if !url.starts_with('-') => Ok(url.to_string()),
        _ => Err(GitError {
            step: "git remote get-url".into(),
            detail: "origin has no usable push URL; set remote.origin.url".into(),
            refused: false,
        }),
    }
}

/// Fetch `base` from the push URL into `refs/remotes/origin/<base>` (forced: whatever a
/// task left there is replaced) and return the commit, read back before any task process
/// runs.
async fn fetch_base(path: &Path, git: &GitRunner, base: &str) -> Result<String, GitError> {
    let url = push_url(path, git).await?;
    let tracking = format!("refs/remotes/origin/{base}");
    let refspec = format!("+refs/heads/{base}:{tracking}");
    git.git(
        path,
        &["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", &url, &refspec],
        true,
    )
    .await
    .map_err(|e| GitError {
        step: format!("fetching the base branch `{base}` from origin"),
        detail: format!(
            "{}; a task branch starts only from what origin has (check the network and that `{base}` exists on origin)",
            e.detail
        ),
        refused: e.refused,
    })?;
    let commit = format!("{tracking}^{{commit}}");
    Ok(git
        .git(path, &["rev-parse", "--verify", "--quiet", &commit], false)
        .await?
        .trim()
        .to_string())
}

/// Whether the work tree has uncommitted changes (tracked or untracked).
pub(crate) async fn is_dirty(path: &Path, git: &GitRunner) -> Result<bool, GitError> {
    Ok(!git
        .git(path, &["status", "--porcelain"], false)
        .await?
        .trim()
        .is_empty())
}

/// Create the task branch in the work tree at `path` when it is a git repo with an `origin`
/// and the workflow is enabled; `None` otherwise. `managed_base` is the branch a managed
/// clone was reset to (it is the base); an operator's directory asks origin instead.
pub async fn start_branch(
    cfg: &Config,
    task: &Task,
    path: &Path,
    managed_base: Option<&str>,
    git: &GitRunner,
) -> Result<Option<TaskBranch>, GitError> {
    if !cfg.git.enabled {
        return Ok(None);
    }
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
        Err(e) if e.refused => return Err(e),
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
    let base = match managed_base {
        Some(base) => base.to_string(),
        // The local `origin/HEAD`, never `remote set-head --auto` here: git 2.47's
        // `remote` does not read `core.hooksPath` and runs the work tree's own
        // reference-transaction hook. (A task may have pointed it at another of origin's
        // branches: the base is still fetched from origin below.)
        None => match default_branch(path, git, false).await {
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
    // Start from what the remote has, not from HEAD or a local ref: in a `repo_dir` HEAD
    // may still be the previous task's branch, and any ref there may have been moved by a
    // task; their commits must not ride along in this task's push.
    let base_sha = fetch_base(
        path,
        &git.clone().with_url_credentials(task.repo.as_deref()),
        &base,
    )
    .await?;
    // -B: a branch of that name left by an earlier run of the same task is recreated here.
    git.git(
        path,
        &["checkout", "--quiet", "-B", &name, &base_sha],
        false,
    )
    .await?;
    tracing::info!(task_id = %task.task_id, branch = %name, base = %base, "task branch created");
    Ok(Some(TaskBranch {
        name,
        base,
        base_sha,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(id: &str, desc: &str) -> Task {
        serde_json::from_value(json!({"task_id": id, "description": desc})).unwrap()
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
}
