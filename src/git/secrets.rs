//! Before a task's work is pushed: refuse a push that carries a credential.
//!
//! What is scanned is exactly what the push sends, as git stores it: every object
//! reachable from the commit to push and from no tip the remote has, the remote asked
//! ([`remote_tips`], `git ls-remote` of the URL the push goes to; never a ref of the work
//! tree, which a task can move). `git rev-list --objects` lists them, `git cat-file
//! --batch` streams them raw ([`super::objects`]) into [`crate::redact::scan`]: each new
//! commit's and tag's bytes (every header, the message as stored), each new tree's entry
//! names, each new blob's bytes. The commit is made first (an index the agent shaped
//! decides the tree; the tree is what is read) but no ref moves until the scan passes
//! (see `publish`). Memory is one block plus the list of object names; time is one pass
//! over the new objects. A hit leaves the work uncommitted in the workspace, pushes
//! nothing, and says why in the result (`publish_refused`).

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::config::PublishConfig;
use crate::redact::known::Credential;
use crate::redact::scan::{Report, Rules, Scanner};

use super::objects::{ObjectStream, BATCH};
use super::{GitError, GitRunner};

/// Every branch and tag tip the remote at `url` has (tags peeled too): what the push will
/// not send again. Asked of the remote itself, with the runner the push uses (its
/// credentials); streamed, so a remote with many refs is read whole.
pub async fn remote_tips(git: &GitRunner, path: &Path, url: &str) -> Result<Vec<String>, GitError> {
    let mut out = Vec::new();
    git.git_stream(
        path,
        &["ls-remote", "--heads", "--tags", "--", url],
        None,
        true,
        &mut |b: &[u8]| out.extend_from_slice(b),
    )
    .await?;
    let mut tips: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| l.split('\t').next())
        .filter(|oid| !oid.is_empty() && oid.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
        .collect();
    tips.sort_unstable();
    tips.dedup();
    Ok(tips)
}

/// Scan every object a push of `new` sends to a remote whose tips are `tips`.
pub async fn scan(
    path: &Path,
    git: &GitRunner,
    new: &str,
    tips: &[String],
    publish: &PublishConfig,
    credentials: &[Credential],
) -> Result<Report, GitError> {
    let rules = Rules::new(credentials, publish.allow_set()).map_err(|e| GitError {
        step: "the credential scan".into(),
        detail: e.to_string(),
        refused: false,
    })?;
    // A tip this clone lacks cannot spare anything from the push: `--ignore-missing`
    // drops it, and what it would have excluded is scanned.
    let mut revs = format!("{new}\n");
    for t in tips {
        revs.push('^');
        revs.push_str(t);
        revs.push('\n');
    }
    let mut listed = Vec::new();
    git.git_stream(
        path,
        &["rev-list", "--objects", "--ignore-missing", "--stdin"],
        Some(revs.into_bytes()),
        false,
        &mut |b: &[u8]| listed.extend_from_slice(b),
    )
    .await?;
    let mut scanner = Scanner::new(&rules);
    let mut objects = ObjectStream::new();
    git.git_stream(
        path,
        &["cat-file", BATCH],
        Some(listed),
        false,
        &mut |b: &[u8]| objects.feed(&mut scanner, b),
    )
    .await?;
    let read = objects.finish().map_err(|detail| GitError {
        step: "the credential scan".into(),
        detail: format!("{detail}; nothing was pushed"),
        refused: false,
    })?;
    let report = scanner.finish();
    tracing::debug!(objects = read, bytes = report.bytes, "push scanned");
    Ok(report)
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
