//! After verification: commit the task's work, push the task branch, open the pull request,
//! and ask the hub to classify the change's risk. A change that carries a credential is
//! neither committed nor pushed (see [`super::secrets`]): the commit object is written
//! first, every object the push would send is scanned, and only then does the task branch
//! move to it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::redact::known::Credential;
use crate::task::Task;

use super::branch::{commit_title, is_dirty, push_url, slugify, TaskBranch};
use super::{GitError, GitRunner};

/// Bound on the classification request: the hub answers from memory, so a slow answer means
/// trouble, and the task's result must not wait for it.
const CLASSIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// `git diff --numstat` totals: what the hub's risk classifier looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiffStats {
    /// Lines added over all files.
    pub lines_added: u64,
    /// Lines deleted over all files.
    pub lines_deleted: u64,
    /// Files with any change.
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

/// The task's work to publish: where it is and how.
#[derive(Debug, Clone, Copy)]
pub struct Publish<'a> {
    /// The daemon's configuration (`[git]`).
    pub cfg: &'a Config,
    /// The task whose work it is.
    pub task: &'a Task,
    /// The work tree.
    pub path: &'a Path,
    /// The task branch to commit on and push.
    pub branch: &'a TaskBranch,
    /// The runner git and gh go through.
    pub git: &'a GitRunner,
    /// Every credential the task's redactor knows: a change that holds one is refused.
    pub credentials: &'a [Credential],
}

/// Commit, push and open the pull request (a draft with `draft`). Returns the keys to merge
/// into `task_complete.result`. Push and PR failures are reported (`git_error`), never fatal:
/// the work is verified either way.
pub async fn publish(p: Publish<'_>, pr_body: &str, draft: bool) -> Map<String, Value> {
    let mut r = Map::new();
    r.insert("branch".into(), json!(p.branch.name));
    if let Err(e) = commit_push_pr(p, pr_body, draft, &mut r).await {
        tracing::warn!(task_id = %p.task.task_id, error = %e, "git workflow step failed; the result reports it");
        r.insert("git_error".into(), json!(e.to_string()));
    }
    r
}

async fn commit_push_pr(
    p: Publish<'_>,
    pr_body: &str,
    draft: bool,
    r: &mut Map<String, Value>,
) -> Result<(), GitError> {
    let Publish {
        cfg,
        task,
        path,
        branch: tb,
        git,
        credentials,
    } = p;
    r.insert("pushed".into(), json!(false));
    git.git(path, &["add", "-A"], false).await?;
    // An LLM executor may have committed by itself: its commits are the task's work too.
    let head = git
        .git(path, &["rev-parse", "HEAD"], false)
        .await?
        .trim()
        .to_string();
    // The commit object is written from the index as it is (an index the agent shaped
    // decides its tree); what is scanned is that tree, and no ref moves before the scan.
    let sha = if is_dirty(path, git).await? {
        commit(cfg, task, path, git, &head).await?
    } else {
        head.clone()
    };
    if sha == tb.base_sha {
        r.insert(
            "git_note".into(),
            json!("nothing to commit: the task left the tree unchanged; nothing pushed"),
        );
        return Ok(());
    }
    // Credentials are for publishing only: the task URL's `user:token` as a header (the
    // clone's config never holds it) and `[env] publish` (`GH_TOKEN` for gh).
    let publisher = git
        .clone()
        .publishing()
        .with_url_credentials(task.repo.as_deref());
    // Nothing is committed, let alone pushed, that carries a credential: every object the
    // push sends, against what the remote it goes to says it has.
    let url = push_url(path, git).await?;
    let tips = super::secrets::remote_tips(&publisher, path, &url).await?;
    let found = super::secrets::scan(path, git, &sha, &tips, &cfg.publish, credentials).await?;
    if !found.findings.is_empty() {
        tracing::warn!(task_id = %task.task_id, findings = found.findings.len() as u64 + found.more, scanned_bytes = found.bytes, "credential in what the push would send: not committed, nothing pushed");
        r.extend(super::secrets::refusal(&found, path, &tb.name));
        return Ok(());
    }
    if sha != head {
        git.git(
            path,
            &[
                "update-ref",
                "-m",
                "hub-sidecar: task commit",
                "HEAD",
                &sha,
                &head,
            ],
            false,
        )
        .await?;
    }
    r.insert("commit".into(), json!(sha));
    let title = commit_title(task);
    // The statistics are of exactly the commit pushed below, named by its id, between two
    // ids: no ref is resolved in between, replace refs and grafts are off (`harden::ENV`),
    // and no textconv or external diff shapes the counts.
    let stats = parse_numstat(
        &git.git(
            path,
            &[
                "diff",
                "--numstat",
                "--no-textconv",
                "--no-ext-diff",
                "--no-renames",
                &tb.base_sha,
                &sha,
            ],
            false,
        )
        .await?,
    );
    r.insert("diff_stats".into(), json!(stats));
    r.insert(
        "risk_classification".into(),
        classify(cfg, &task.task_id, &stats).await,
    );

    // To the URL whose tips were scanned against, nowhere else. The lease is origin's value
    // of the branch as last seen here (absent: the branch must not exist yet).
    let dst = format!("refs/heads/{}", tb.name);
    let tracking = format!("refs/remotes/origin/{}", tb.name);
    let seen = git
        .git(
            path,
            &["rev-parse", "--verify", "--quiet", &tracking],
            false,
        )
        .await
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let lease = format!("--force-with-lease={dst}:{seen}");
    let refspec = format!("{sha}:{dst}");
    publisher
        .git(
            path,
            &[
                "push",
                "--quiet",
                "--no-verify",
                &lease,
                "--",
                &url,
                &refspec,
            ],
            true,
        )
        .await?;
    r.insert("pushed".into(), json!(true));
    // A push to a URL moves no remote-tracking ref: the next run of this task leases on it.
    git.git(path, &["update-ref", &tracking, &sha], false)
        .await?;

    let Some(gh) = find_gh(cfg, git, path) else {
        r.insert(
            "git_note".into(),
            json!("branch pushed; no pull request: `gh` not found (install GitHub CLI or set git.gh_path)"),
        );
        return Ok(());
    };
    // In the task's private TMPDIR when confined: `gh` can read it there, and nothing of
    // the state directory has to be opened to it.
    let body_dir = git
        .env()
        .get("TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cfg.state_dir.clone());
    let body_name = format!("pr-body-{}.md", slugify(&task.task_id, 60));
    let body_path = body_dir.join(&body_name);
    // The task could write its TMPDIR: whatever it left under that name (a link to a file of
    // the daemon's) is replaced, never written through (see `sandbox::beneath`).
    let body = pr_body.as_bytes().to_vec();
    tokio::task::spawn_blocking(move || {
        crate::sandbox::beneath::Tree::open_root(&body_dir)?.put_file(&body_name, &body, 0o600)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
    .map_err(|e| GitError {
        step: "writing the pull request body".into(),
        detail: format!("{}: {e}", body_path.display()),
        refused: false,
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
    let res = publisher
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

/// The commit object of the staged tree on `parent` (description title, `Task-Id`
/// trailer, configured author), written but not yet on any ref; its id.
async fn commit(
    cfg: &Config,
    task: &Task,
    path: &Path,
    git: &GitRunner,
    parent: &str,
) -> Result<String, GitError> {
    let title = commit_title(task);
    let trailer = format!("Task-Id: {}", task.task_id);
    let name = format!("user.name={}", cfg.git.author_name);
    let email = format!("user.email={}", cfg.git.author_email);
    let tree = git.git(path, &["write-tree"], false).await?;
    let out = git
        .git(
            path,
            &[
                "-c",
                &name,
                "-c",
                &email,
                "-c",
                "commit.gpgsign=false",
                "commit-tree",
                tree.trim(),
                "-p",
                parent,
                "-m",
                &title,
                "-m",
                &trailer,
            ],
            false,
        )
        .await?;
    Ok(out.trim().to_string())
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

/// Ask the hub for the change's risk tier. Any failure gives tier 2, "classification
/// unavailable": a missing classifier must not block a verified result.
pub async fn classify(cfg: &Config, task_id: &str, stats: &DiffStats) -> Value {
    let fallback = json!({"tier": 2, "reason": "classification unavailable"});
    let url = format!(
        "{}/api/tasks/{}/classify",
        cfg.hub_api_url(),
        crate::util::percent_encode(task_id)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
