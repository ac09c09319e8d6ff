//! Before a task's work is committed and pushed: refuse a change that carries a credential.
//!
//! What publishing would send is scanned with [`crate::redact::scan`]: the staged change
//! against `HEAD`, and, when the agent committed by itself, each of its commits' patches
//! (so a secret added and removed again is still seen) and their messages and authors. Only
//! added lines are read, streamed from git ([`GitRunner::git_stream`]): memory is one block,
//! time one pass over what the change adds. A hit leaves the work uncommitted in the
//! workspace, pushes nothing, and says why in the result (`publish_refused`).

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::config::PublishConfig;
use crate::redact::known::Credential;
use crate::redact::scan::{Report, Rules, Scanner};

use super::{GitError, GitRunner};

/// How the diffs are asked for: every added line whole and as stored (binary files as
/// text, no textconv, no external diff, no renames), no context, fixed prefixes.
const DIFF: &[&str] = &[
    "--text",
    "-U0",
    "--no-color",
    "--no-textconv",
    "--no-ext-diff",
    "--no-renames",
    "--src-prefix=a/",
    "--dst-prefix=b/",
];

/// Scan what publishing the work at `path` would send: the staged change, and the agent's
/// own commits since `base_sha`.
pub async fn scan(
    path: &Path,
    git: &GitRunner,
    base_sha: &str,
    publish: &PublishConfig,
    credentials: &[Credential],
) -> Result<Report, GitError> {
    let rules = Rules::new(credentials, publish.allow_set()).map_err(|e| GitError {
        step: "the credential scan".into(),
        detail: e,
        refused: false,
    })?;
    let mut scanner = Scanner::new(&rules);
    let mut staged = vec!["diff", "--cached"];
    staged.extend_from_slice(DIFF);
    staged.extend_from_slice(&["HEAD", "--"]);
    scanner.begin_diff();
    git.git_stream(path, &staged, &mut |b: &[u8]| scanner.feed(b))
        .await?;
    let head = git.git(path, &["rev-parse", "HEAD"], false).await?;
    if head.trim() != base_sha {
        let range = format!("{base_sha}..HEAD");
        let mut patches = vec!["log", "-p", "--diff-merges=first-parent", "--format="];
        patches.extend_from_slice(DIFF);
        patches.extend_from_slice(&[&range, "--"]);
        scanner.begin_diff();
        git.git_stream(path, &patches, &mut |b: &[u8]| scanner.feed(b))
            .await?;
        scanner.begin_text("(commit message)");
        let messages = ["log", "--format=%an <%ae>%n%cn <%ce>%n%B", &range, "--"];
        git.git_stream(path, &messages, &mut |b: &[u8]| scanner.feed(b))
            .await?;
    }
    Ok(scanner.finish())
}

/// The result keys of a refused publication: `publish_refused` (what was found, where;
/// never a value) and a `git_note` saying what the operator can do.
pub fn refusal(report: &Report, path: &Path, branch: &str) -> Map<String, Value> {
    let mut r = Map::new();
    let first = report
        .findings
        .first()
        .map(|f| format!("{} at {}:{}", f.what, f.path, f.line))
        .unwrap_or_default();
    let others = (report.findings.len() as u64).saturating_sub(1) + report.more;
    let more = if others > 0 {
        format!(" and {others} more")
    } else {
        String::new()
    };
    r.insert(
        "publish_refused".into(),
        json!({
            "reason": "credential",
            "findings": report.findings,
            "more": report.more,
        }),
    );
    r.insert(
        "git_note".into(),
        json!(format!(
            "not committed, nothing pushed: the change holds {first}{more}; the work is left uncommitted in the workspace {} on branch {branch} (a managed clone is reset by the next task on it). Remove the credential (rotate it if it is real) and publish by hand; a test fixture's path can be allowed in [publish] allow_secrets_in (credential shapes only, never the daemon's own)",
            path.display()
        )),
    );
    r
}
