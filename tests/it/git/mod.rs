//! Workspaces and the git workflow (issue: workspaces and git workflow): real git against a
//! bare repository in a temp dir, the real daemon against the mock hub, stand-in `gh` and
//! `claude` scripts, and a tiny classify endpoint.
//!
//! The bare remote's default branch is `trunk`, so anything that assumed `main` would fail.
//!
//! Layout: this file holds the shared doubles (`Remote`, `Gh`, `Classify`, stand-in `claude`)
//! and task builders; `workspaces`, `publish`, `pushed`, `secrets` and `hostile` hold the
//! tests by topic.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hub_sidecar::config::Config;
use hub_sidecar::mock_hub::{sample_shell_task, MockHub};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::Harness;
use crate::util::*;

mod hostile;
mod publish;
mod pushed;
mod secrets;
mod steering;
mod task_tmpdir;
mod workspaces;

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

    /// Every ref of the remote with what it names, one `<oid> <ref>` a line, sorted.
    pub(crate) fn refs(&self) -> String {
        self.git(&["for-each-ref", "--format=%(objectname) %(refname)"])
    }

    /// Which of `needles` some object in the remote's store holds: every object, loose
    /// or packed, reachable or not, read raw (`cat-file --batch-all-objects --batch`).
    pub(crate) fn objects_holding<'n>(&self, needles: &[&'n str]) -> Vec<&'n str> {
        let out = std::process::Command::new("git")
            .arg(format!("--git-dir={}", self.path().display()))
            .args(["cat-file", "--batch-all-objects", "--batch"])
            .output()
            .expect("run git cat-file");
        assert!(
            out.status.success(),
            "git cat-file --batch-all-objects failed"
        );
        assert!(!out.stdout.is_empty(), "the remote holds no objects at all");
        needles
            .iter()
            .copied()
            .filter(|n| out.stdout.windows(n.len()).any(|w| w == n.as_bytes()))
            .collect()
    }

    /// Nothing reached the remote: every ref as it was (`refs`, from [`Remote::refs`]) and
    /// no object anywhere in its store holding any of `needles`.
    pub(crate) fn assert_untouched(&self, refs: &str, needles: &[&str], what: &str) {
        assert_eq!(self.refs(), refs, "{what}: a ref of the remote moved");
        // The search itself reads the store: the seed's README is found.
        assert_eq!(self.objects_holding(&["original"]), ["original"]);
        let held = self.objects_holding(needles);
        assert!(
            held.is_empty(),
            "{what}: the remote's objects hold {held:?}"
        );
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
