//! Workspaces and the git workflow (issue: workspaces and git workflow): real git against a
//! bare repository in a temp dir, the real daemon against the mock hub, stand-in `gh` and
//! `claude` scripts, and a tiny classify endpoint.
//!
//! The bare remote's default branch is `trunk`, so anything that assumed `main` would fail.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hub_sidecar::config::Config;
use hub_sidecar::mock_hub::{sample_shell_task, MockHub};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::Harness;
use crate::util::*;

/// Run git synchronously (only while the daemon is idle: tests are single-threaded).
pub(crate) fn git(cwd: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=seed", "-c", "user.email=seed@test"])
        .args(args)
        .current_dir(cwd)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bare remote seeded with one commit on `trunk` (README and a .gitignore for `build/`).
pub(crate) struct Remote {
    dir: tempfile::TempDir,
}

impl Remote {
    pub(crate) fn new() -> Remote {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        git(
            d,
            &[
                "init",
                "-q",
                "--bare",
                "--initial-branch=trunk",
                "remote.git",
            ],
        );
        git(d, &["clone", "-q", "remote.git", "seed"]);
        let seed = d.join("seed");
        std::fs::write(seed.join("README"), "original\n").unwrap();
        std::fs::write(seed.join(".gitignore"), "build/\n").unwrap();
        git(&seed, &["checkout", "-q", "-b", "trunk"]);
        git(&seed, &["add", "-A"]);
        git(&seed, &["commit", "-q", "-m", "seed"]);
        git(&seed, &["push", "-q", "origin", "trunk"]);
        Remote { dir }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("remote.git")
    }

    pub(crate) fn url(&self) -> String {
        format!("file://{}", self.path().display())
    }

    /// `git --git-dir bare ARGS`.
    pub(crate) fn git(&self, args: &[&str]) -> String {
        let gd = format!("--git-dir={}", self.path().display());
        let mut all = vec![gd.as_str()];
        all.extend_from_slice(args);
        git(self.dir.path(), &all)
    }

    fn branches(&self) -> Vec<String> {
        self.git(&["for-each-ref", "--format=%(refname:short)", "refs/heads"])
            .lines()
            .map(str::to_string)
            .collect()
    }
}

pub(crate) fn write_exe(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stand-in `gh` (test double): records its argv (NUL-separated) and a copy of the body
/// file, prints a PR URL; with `fail`, exits 1 like gh does on a missing label.
struct Gh {
    dir: tempfile::TempDir,
}

impl Gh {
    fn new(fail: bool) -> Gh {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let end = if fail {
            "echo 'could not add label: priority:high not found' >&2; exit 1"
        } else {
            "echo 'Creating pull request for branch'; echo 'https://github.com/acme/widgets/pull/42'"
        };
        write_exe(
            &d.join("gh"),
            &format!(
                r#"#!/bin/sh
# Test double for the GitHub CLI: record the call, answer like `gh pr create`.
D='{}'
: > "$D/argv"
for a in "$@"; do
  printf '%s\0' "$a" >> "$D/argv"
  case "$a" in --body-file=*) cp "${{a#--body-file=}}" "$D/body.md" ;; esac
done
{end}
"#,
                d.display()
            ),
        );
        Gh { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("gh")
    }

    fn argv(&self) -> Option<Vec<String>> {
        let raw = std::fs::read_to_string(self.dir.path().join("argv")).ok()?;
        Some(
            raw.split('\0')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    fn body(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("body.md")).unwrap_or_default()
    }
}

/// A one-route HTTP responder on 127.0.0.1:0 standing in for the hub's classify API:
/// records each request (head and body) and answers with `status` and `body`.
struct Classify {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Classify {
    async fn start(status: u16, body: &'static str) -> Classify {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let rec = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read the head, then as much body as Content-Length says.
                while let Ok(n) = s.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(i) = text.find("\r\n\r\n") {
                        let len = text[..i]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= i + 4 + len {
                            break;
                        }
                    }
                }
                rec.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
                let resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            }
        });
        Classify {
            url,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Classify {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A shell task on `repo` with `description`.
pub(crate) fn shell_task(id: &str, cmd: &str, repo: &str, description: &str) -> Value {
    let mut t = sample_shell_task(id, cmd);
    t["repo"] = json!(repo);
    t["description"] = json!(description);
    t
}

/// The terminal frame (`task_complete` or `task_failed`) for `id`.
pub(crate) async fn terminal(hub: &MockHub, id: &str) -> Value {
    hub.wait_for(
        |f| (f["type"] == "task_complete" || f["type"] == "task_failed") && f["task_id"] == id,
        T,
    )
    .await
    .unwrap_or_else(|| panic!("no terminal frame for {id}"))
}

pub(crate) fn base_cfg(hub: &MockHub, dir: &Path) -> Config {
    let mut c = cfg(hub, dir);
    // Nothing listens here: any classification attempt falls back fast.
    c.git.hub_api_url = Some("http://127.0.0.1:1".into());
    c
}

#[tokio::test]
async fn first_task_clones_second_reuses_and_resets_the_workspace() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    // Without the branch workflow, task 1's edits stay in the workspace: exactly what the
    // reset before task 2 must undo.
    c.git.enabled = false;
    let h = s.start(c).await;
    // A plain path works as a repository URL too.
    let repo = remote.path().display().to_string();

    h.assign(shell_task(
        "ws-1",
        "git rev-parse --abbrev-ref HEAD; echo stray > stray.txt; echo changed > README; mkdir build; echo o > build/cache",
        &repo,
        "Make a mess",
    ));
    let done = terminal(h.hub(), "ws-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert_eq!(
        done["result"]["output"].as_str().unwrap().trim(),
        "trunk",
        "the clone is on origin's default branch"
    );

    h.assign(shell_task(
        "ws-2",
        "git rev-parse --abbrev-ref HEAD; ls -A; cat README; git status --porcelain",
        &repo,
        "Look around",
    ));
    let done = terminal(h.hub(), "ws-2").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let out = done["result"]["output"].as_str().unwrap();
    assert!(out.starts_with("trunk\n"), "{out}");
    assert!(!out.contains("stray.txt"), "untracked file survived: {out}");
    assert!(!out.contains("build"), "ignored build dir survived: {out}");
    assert!(out.contains("original"), "local change survived: {out}");
    assert!(!out.contains("changed"), "{out}");

    // Both tasks used clones in state_dir/workspaces, no lock left behind.
    let entries: Vec<String> = std::fs::read_dir(h.dir().join("workspaces"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        entries.iter().all(|e| !e.ends_with(".lock")),
        "lock left: {entries:?}"
    );
    assert_eq!(entries.len(), 1, "one clone, reused: {entries:?}");
    h.finish().await;
}

#[tokio::test]
async fn a_task_reuses_its_clone_when_the_same_url_is_given_again() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.enabled = false;
    let h = s.start(c).await;
    h.assign(shell_task(
        "re-1",
        "echo stray > stray.txt; echo x >> README",
        &remote.url(),
        "a",
    ));
    assert_eq!(terminal(h.hub(), "re-1").await["type"], "task_complete");
    // Someone pushes to trunk in between: the next task sees it (fetch + hard reset).
    let seed = remote.dir.path().join("seed");
    std::fs::write(seed.join("NEW"), "new\n").unwrap();
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-q", "-m", "upstream"]);
    git(&seed, &["push", "-q", "origin", "trunk"]);
    h.assign(shell_task("re-2", "ls -A; cat README", &remote.url(), "b"));
    let done = terminal(h.hub(), "re-2").await;
    let out = done["result"]["output"].as_str().unwrap();
    assert!(
        out.contains("NEW"),
        "fetch missed the upstream commit: {out}"
    );
    assert!(!out.contains("stray.txt"), "{out}");
    assert!(!out.contains("\nx\n") && !out.ends_with("x\n"), "{out}");
    let clones = std::fs::read_dir(h.dir().join("workspaces"))
        .unwrap()
        .count();
    assert_eq!(clones, 1, "one clone per URL");
    h.finish().await;
}

#[tokio::test]
async fn verified_task_pushes_exactly_its_commit_opens_a_pr_and_is_classified() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let classify = Classify::start(200, r#"{"tier":1,"reason":"small change"}"#).await;
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.git.reviewer = Some("octo".into());
    c.git.hub_api_url = Some(classify.url.clone());
    c.git.author_name = "Sidecar Bot".into();
    c.git.author_email = "bot@example.test".into();
    let h = s.start(c).await;

    let mut t = shell_task(
        "task-push-0001",
        "echo hello > hello.txt; mkdir -p tests; echo t > tests/hello_test.sh",
        &remote.url(),
        "Add a greeting file\n\nIt should say hello.",
    );
    t["success_criteria"] = json!(["hello.txt exists"]);
    t["verification_steps"] = json!([{"type": "file_exists", "target": "hello.txt"}]);
    t["metadata"]["priority"] = json!("high");
    h.assign(t);
    let done = terminal(h.hub(), "task-push-0001").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified");
    let branch = r["branch"].as_str().unwrap();
    assert_eq!(branch, "sidecar-test/add-a-greeting-file-push0001");
    assert_eq!(r["pushed"], true, "{r}");
    assert!(r.get("git_error").is_none(), "{r}");

    // The remote branch holds exactly one commit on top of trunk: the task's.
    let log = remote.git(&[
        "log",
        "--format=%H%x1f%an <%ae>%x1f%B%x1e",
        &format!("trunk..{branch}"),
    ]);
    let commits: Vec<&str> = log
        .split('\x1e')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(commits.len(), 1, "{log}");
    let parts: Vec<&str> = commits[0].split('\x1f').collect();
    assert_eq!(parts[0], r["commit"].as_str().unwrap());
    assert_eq!(parts[1], "Sidecar Bot <bot@example.test>");
    assert_eq!(parts[2], "Add a greeting file\n\nTask-Id: task-push-0001");
    let files = remote.git(&["show", "--name-only", "--format=", branch]);
    assert_eq!(files.trim(), "hello.txt\ntests/hello_test.sh");

    // The pull request call, argv only, body from a file.
    let argv = gh.argv().expect("gh was called");
    for want in [
        "pr",
        "create",
        "--title=Add a greeting file",
        &format!("--head={branch}"),
        "--base=trunk",
        "--label=agent:sidecar-test",
        "--label=priority:high",
        "--reviewer=octo",
    ] {
        assert!(argv.iter().any(|a| a == want), "missing {want} in {argv:?}");
    }
    assert!(!argv.iter().any(|a| a == "--draft"));
    let body = gh.body();
    assert!(body.contains("It should say hello."), "{body}");
    assert!(body.contains("- hello.txt exists"), "{body}");
    assert!(body.contains("| 1 | pass | 1 | 0 |"), "{body}");
    assert!(body.contains("Attempts: 1"), "{body}");
    assert_eq!(r["pr_url"], "https://github.com/acme/widgets/pull/42");

    // Classification: the hub's answer, asked with the token and the diff's numbers.
    assert_eq!(
        r["risk_classification"],
        json!({"tier": 1, "reason": "small change"})
    );
    let reqs = classify.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let req = &reqs[0];
    assert!(
        req.starts_with("POST /api/tasks/task-push-0001/classify "),
        "{req}"
    );
    assert!(
        req.to_ascii_lowercase()
            .contains("authorization: bearer test-token"),
        "{req}"
    );
    let body: Value = serde_json::from_str(req.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"lines_added": 2, "lines_deleted": 0, "files_changed": 2, "tests_touched": 1})
    );
    h.finish().await;
}

#[tokio::test]
async fn pr_and_classification_failures_are_reported_not_fatal() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(true);
    let classify = Classify::start(500, r#"{"error":"boom"}"#).await;
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.git.hub_api_url = Some(classify.url.clone());
    let h = s.start(c).await;
    h.assign(shell_task("pf-1", "echo a > a.txt", &remote.url(), "Add a"));
    let done = terminal(h.hub(), "pf-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified");
    assert_eq!(r["pushed"], true);
    let err = r["git_error"].as_str().unwrap();
    assert!(
        err.contains("gh pr create failed") && err.contains("label"),
        "{err}"
    );
    assert!(r.get("pr_url").is_none());
    assert_eq!(
        r["risk_classification"],
        json!({"tier": 2, "reason": "classification unavailable"})
    );
    assert_eq!(classify.requests().len(), 1);
    assert!(remote
        .branches()
        .iter()
        .any(|b| b == r["branch"].as_str().unwrap()));
    h.finish().await;
}

#[tokio::test]
async fn nothing_to_commit_pushes_nothing_and_says_so() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    let h = s.start(c).await;
    h.assign(shell_task("noop-1", "true", &remote.url(), "Do nothing"));
    let done = terminal(h.hub(), "noop-1").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(r["pushed"], false);
    assert!(
        r["git_note"]
            .as_str()
            .unwrap()
            .contains("nothing to commit"),
        "{r}"
    );
    assert!(r.get("commit").is_none());
    assert_eq!(remote.branches(), vec!["trunk"]);
    assert!(gh.argv().is_none(), "no PR without a commit");
    h.finish().await;
}

/// A stand-in `claude` (test double speaking the real stream-json format) that edits a file
/// but never creates `wanted.txt`, the file the check asks for.
fn stand_in_claude() -> (tempfile::TempDir, PathBuf) {
    let bin = tempfile::tempdir().unwrap();
    let claude = bin.path().join("claude");
    write_exe(
        &claude,
        r#"#!/bin/sh
# Test double for the Claude Code CLI: edits the workspace, reports success in stream-json.
echo edited > edited.txt
echo '{"type":"system","subtype":"init","cwd":"/w","session_id":"s-9","tools":["Write"],"model":"claude-sonnet-4-5-20250929"}'
echo '{"type":"assistant","message":{"id":"m1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Edited."}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":3}},"session_id":"s-9"}'
echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":5,"num_turns":1,"result":"Edited.","session_id":"s-9","total_cost_usd":0.001,"usage":{"input_tokens":5,"output_tokens":3}}'
"#,
    );
    (bin, claude)
}

/// A Claude task on `repo` whose one check (`wanted.txt` exists) the stand-in never passes.
fn claude_task(id: &str, repo: &str) -> Value {
    json!({
        "task_id": id,
        "description": "Create wanted.txt",
        "repo": repo,
        "routing_decision": {"effective_tier": "complex", "target_type": "claude",
            "selected_endpoint": null, "selected_model": null, "fallback_used": false,
            "fallback_reason": null, "classification_reason": "test", "estimated_cost_tier": "high"},
        "verification_steps": [{"type": "file_exists", "target": "wanted.txt"}],
        "max_verification_retries": 0
    })
}

#[tokio::test]
async fn partial_pass_with_push_drafts_opens_a_draft_pr() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let (_bin, claude) = stand_in_claude();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.git.push_drafts = true;
    c.executor.claude_path = Some(claude);
    let h = s.start(c).await;
    h.assign(claude_task("draft-1", &remote.url()));
    let done = terminal(h.hub(), "draft-1").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "partial_pass", "{done}");
    assert_eq!(r["pushed"], true, "{r}");
    let branch = r["branch"].as_str().unwrap();
    assert!(remote.branches().iter().any(|b| b == branch));
    let argv = gh.argv().expect("gh called");
    assert!(argv.iter().any(|a| a == "--draft"), "{argv:?}");
    assert!(gh.body().contains("| 1 | fail | 0 | 1 |"), "{}", gh.body());
    h.finish().await;
}

#[tokio::test]
async fn partial_pass_pushes_nothing() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let (_bin, claude) = stand_in_claude();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    c.executor.claude_path = Some(claude);
    let h = s.start(c).await;
    h.assign(claude_task("pp-1", &remote.url()));
    let done = terminal(h.hub(), "pp-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let r = &done["result"];
    assert_eq!(r["verification_status"], "partial_pass", "{r}");
    assert_eq!(r["pushed"], false);
    assert!(
        r["git_note"].as_str().unwrap().contains("push_drafts"),
        "{r}"
    );
    assert_eq!(
        remote.branches(),
        vec!["trunk"],
        "partial_pass pushed a branch"
    );
    assert!(gh.argv().is_none());
    h.finish().await;
}

#[tokio::test]
async fn credentials_in_the_repo_url_never_reach_logs_or_the_hub() {
    let s = Harness::setup().await;
    let mut h = s
        .start_bin("test-token", "", &[("RUST_LOG", "debug")])
        .await;
    let mut t = shell_task(
        "cred-1",
        "true",
        "http://user:s3cretpass@127.0.0.1:1/x.git",
        "Touch the secret repo",
    );
    t["verification_steps"] = json!([]);
    h.assign(t);
    let done = h
        .wait_for(
            |f| f["type"] == "task_failed" && f["task_id"] == "cred-1",
            T,
        )
        .await
        .unwrap_or_else(|| panic!("no task_failed; daemon log:\n{}", h.bin().logs()));
    let reason = done["reason"].as_str().unwrap();
    assert!(reason.contains("git clone failed"), "{reason}");
    assert!(
        reason.contains("http://127.0.0.1:1/x.git"),
        "names the repo: {reason}"
    );
    assert!(!reason.contains("s3cretpass"), "{reason}");
    for f in h.received() {
        assert!(
            !f.to_string().contains("s3cretpass"),
            "leaked to the hub: {f}"
        );
    }
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let logs = h.bin().logs();
    assert!(logs.contains("git step"), "debug git logs expected: {logs}");
    assert!(!logs.contains("s3cretpass"), "leaked to the log:\n{logs}");
    h.finish().await;
}

#[tokio::test]
async fn shell_metacharacters_in_the_description_stay_inert() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let gh = Gh::new(false);
    let pwned = s.dir().join("pwned");
    let desc = format!("$(touch {}) `id` ; rm -rf ~ | & > <", pwned.display());
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    let h = s.start(c).await;
    h.assign(shell_task("meta-1", "echo m > m.txt", &remote.url(), &desc));
    let done = terminal(h.hub(), "meta-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let branch = done["result"]["branch"].as_str().unwrap().to_string();
    assert!(
        branch.starts_with("sidecar-test/touch-")
            && branch.ends_with("-meta1")
            && branch[13..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{branch}"
    );
    assert!(remote.branches().contains(&branch));
    let argv = gh.argv().unwrap();
    assert!(argv.contains(&format!("--title={desc}")), "{argv:?}");
    let subject = remote.git(&["log", "-1", "--format=%s", &branch]);
    assert_eq!(subject.trim(), desc);
    assert!(!pwned.exists(), "the description was executed");
    h.finish().await;
}

#[tokio::test]
async fn a_reassigned_task_recreates_its_branch_and_force_pushes_with_lease() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    h.assign(shell_task(
        "again-1",
        "echo one > one.txt",
        &remote.url(),
        "Redo me",
    ));
    let first = terminal(h.hub(), "again-1").await;
    assert_eq!(first["result"]["pushed"], true, "{first}");
    assert!(wait_until(|| h.acked_terminal("again-1") == 1, T).await);
    // The hub re-queues the task: same id, next generation, different work.
    let mut t = shell_task("again-1", "echo two > two.txt", &remote.url(), "Redo me");
    t["generation"] = json!(2);
    h.assign(t);
    let second = h
        .wait_for(
            |f| f["type"] == "task_complete" && f["task_id"] == "again-1" && f["generation"] == 2,
            T,
        )
        .await
        .expect("second run's result");
    let r = &second["result"];
    assert_eq!(r["pushed"], true, "{r}");
    assert_eq!(r["branch"], first["result"]["branch"]);
    let branch = r["branch"].as_str().unwrap();
    let log = remote.git(&["log", "--format=%H", &format!("trunk..{branch}")]);
    assert_eq!(
        log.trim(),
        r["commit"].as_str().unwrap(),
        "only the new commit"
    );
    let files = remote.git(&["show", "--name-only", "--format=", branch]);
    assert_eq!(files.trim(), "two.txt");
    h.finish().await;
}

#[tokio::test]
async fn a_dirty_repo_dir_is_stashed_never_mixed_into_the_task_commit() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    // An operator's checkout with uncommitted work, used as repo_dir.
    let work = s.dir().join("checkout");
    git(s.dir(), &["clone", "-q", &remote.url(), "checkout"]);
    std::fs::write(work.join("README"), "operator's edit\n").unwrap();
    std::fs::write(work.join("notes.txt"), "mine\n").unwrap();
    let mut c = base_cfg(&s.hub, s.dir());
    c.repo_dir = Some(work.clone());
    // A push from an operator's directory to a remote on local disk needs that remote in
    // the sandbox's write paths (a managed clone's local remote is granted by itself).
    c.sandbox.write_paths.push(remote.path().to_path_buf());
    let h = s.start(c).await;
    let mut t = sample_shell_task("dirty-1", "echo task > task.txt");
    t["description"] = json!("Task on a dirty tree");
    h.assign(t);
    let done = terminal(h.hub(), "dirty-1").await;
    let r = &done["result"];
    assert_eq!(r["pushed"], true, "{done}");
    let branch = r["branch"].as_str().unwrap();
    let files = remote.git(&["show", "--name-only", "--format=", branch]);
    assert_eq!(
        files.trim(),
        "task.txt",
        "operator's work leaked into the commit"
    );
    let stash = git(&work, &["stash", "list"]);
    assert!(
        stash.contains("uncommitted work found before task dirty-1"),
        "{stash}"
    );
    h.finish().await;
}

/// A managed clone's git directory is outside the workspace and read-only to the task: the
/// executor can read history but not commit (or plant hooks and config); the daemon commits
/// its work.
#[tokio::test]
async fn the_executor_cannot_write_the_git_directory_its_work_is_committed_by_the_daemon() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    h.assign(shell_task(
        "self-1",
        "echo s > s.txt; git log --oneline | head -1; if git add s.txt 2>/dev/null; then echo WROTE-GIT-DIR; fi; if echo x >> \"$(git rev-parse --git-dir)/config\"; then echo WROTE-CONFIG; fi; true",
        &remote.url(),
        "Commit by yourself",
    ));
    let done = terminal(h.hub(), "self-1").await;
    let r = &done["result"];
    let out = r["output"].as_str().unwrap();
    assert!(out.contains("seed"), "history is readable: {done}");
    assert!(
        !out.contains("WROTE-GIT-DIR") && !out.contains("WROTE-CONFIG"),
        "{done}"
    );
    assert_eq!(r["pushed"], true, "{done}");
    let branch = r["branch"].as_str().unwrap();
    let log = remote.git(&["log", "--format=%s", &format!("trunk..{branch}")]);
    assert_eq!(log.trim(), "Commit by yourself");
    assert_eq!(r["diff_stats"]["files_changed"], 1);
    h.finish().await;
}

#[tokio::test]
async fn command_running_transports_and_option_like_urls_are_refused() {
    let s = Harness::setup().await;
    let pwned = s.dir().join("pwned");
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    let ext = format!("ext::sh -c touch% {}", pwned.display());
    h.assign(shell_task("ext-1", "true", &ext, "ext transport"));
    let done = terminal(h.hub(), "ext-1").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("git clone failed"),
        "{done}"
    );
    assert!(!pwned.exists(), "the ext:: transport ran a command");
    h.assign(shell_task(
        "opt-1",
        "true",
        "--upload-pack=touch /tmp/x",
        "option",
    ));
    let done = terminal(h.hub(), "opt-1").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("not a repository URL"),
        "{done}"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_repo_dir_inside_a_repository_gets_no_git_workflow() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    git(s.dir(), &["clone", "-q", &remote.url(), "checkout"]);
    let sub = s.dir().join("checkout/sub");
    std::fs::create_dir(&sub).unwrap();
    let mut c = base_cfg(&s.hub, s.dir());
    c.repo_dir = Some(sub);
    let h = s.start(c).await;
    h.assign(sample_shell_task("sub-1", "echo s > s.txt"));
    let done = terminal(h.hub(), "sub-1").await;
    assert_eq!(done["result"]["verification_status"], "verified", "{done}");
    assert!(done["result"].get("branch").is_none(), "{done}");
    assert_eq!(remote.branches(), vec!["trunk"]);
    h.finish().await;
}

#[tokio::test]
async fn a_live_lock_fails_the_task_and_a_dead_one_is_taken_over() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.enabled = false;
    let h = s.start(c).await;
    let root = h.dir().join("workspaces");
    std::fs::create_dir_all(&root).unwrap();
    let lock = root.join(format!(
        "{}.lock",
        hub_sidecar::git::url::slug_of_url(&remote.url())
    ));
    // Held by a live process (this one): the task must not share the clone.
    std::fs::write(&lock, format!("{}\n", std::process::id())).unwrap();
    h.assign(shell_task("lock-1", "true", &remote.url(), "locked"));
    let done = terminal(h.hub(), "lock-1").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("in use by process"),
        "{done}"
    );
    // Left by a crashed run (a pid beyond pid_max cannot be alive): taken over.
    std::fs::write(&lock, "2147483000\n").unwrap();
    h.assign(shell_task("lock-2", "true", &remote.url(), "stale"));
    let done = terminal(h.hub(), "lock-2").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(!lock.exists(), "released after the task");
    h.finish().await;
}

#[tokio::test]
async fn a_task_without_repo_or_repo_dir_gets_a_temp_dir_removed_afterwards() {
    let s = Harness::setup().await;
    let cfg = base_cfg(&s.hub, s.dir());
    let h = s.start(cfg).await;
    h.assign(sample_shell_task("tmp-1", "pwd; echo x > x.txt"));
    let done = terminal(h.hub(), "tmp-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    let cwd = done["result"]["output"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(
        cwd.starts_with(&h.dir().canonicalize().unwrap().display().to_string())
            || cwd.starts_with(&h.dir().display().to_string()),
        "{cwd}"
    );
    assert!(done["result"].get("branch").is_none());
    assert!(
        !Path::new(&cwd).exists(),
        "temp workspace {cwd} left behind"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_task_branch_is_the_base_of_workspace_and_pull_request() {
    let s = Harness::setup().await;
    let remote = Remote::new();
    let seed = remote.dir.path().join("seed");
    git(&seed, &["checkout", "-q", "-b", "release"]);
    std::fs::write(seed.join("RELEASE"), "1.0\n").unwrap();
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-q", "-m", "release"]);
    git(&seed, &["push", "-q", "origin", "release"]);
    let gh = Gh::new(false);
    let mut c = base_cfg(&s.hub, s.dir());
    c.git.gh_path = Some(gh.path());
    // The stand-in records its calls beside itself, outside any workspace.
    c.sandbox.write_paths.push(gh.dir.path().to_path_buf());
    let h = s.start(c).await;
    let mut t = shell_task(
        "rel-1",
        "cat RELEASE; echo fix > fix.txt",
        &remote.url(),
        "Fix release",
    );
    t["branch"] = json!("release");
    h.assign(t);
    let done = terminal(h.hub(), "rel-1").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        done["result"]["output"].as_str().unwrap().contains("1.0"),
        "{done}"
    );
    let argv = gh.argv().unwrap();
    assert!(argv.iter().any(|a| a == "--base=release"), "{argv:?}");
    let branch = done["result"]["branch"].as_str().unwrap();
    let log = remote.git(&["log", "--format=%s", &format!("release..{branch}")]);
    assert_eq!(log.trim(), "Fix release");
    // A branch the remote does not have fails clearly.
    let mut t = shell_task("rel-2", "true", &remote.url(), "No such branch");
    t["branch"] = json!("nope");
    h.assign(t);
    let done = terminal(h.hub(), "rel-2").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("branch `nope` does not exist on origin"),
        "{done}"
    );
    h.finish().await;
}
