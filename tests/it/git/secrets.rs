//! The agent's own credential (issue 35, class 6): every credential the daemon knows, in
//! every spelling, is refused in a commit (nothing pushed, the hub told why, the work kept)
//! and redacted from the progress and result frames and the flight record; a credential
//! shape is refused too, except under a path the operator allows.
//!
//! The real binary, so that the `[env] agent` and `[env] publish` values and the agent login
//! (`CLAUDE_CONFIG_DIR`) come from its environment as in production; a real bare remote.

use base64::Engine;
use hub_sidecar::mock_hub::MockHubOptions;
use serde_json::json;

use super::{git, shell_task, terminal, Remote};
use crate::harness::Setup;
use crate::util::*;

const HUB_TOKEN: &str = "hub/tok+en-7Q2x9v";
const SECRET: &str = "listed?secret+4Kd8w";
const AGENT_KEY: &str = "sk-ant-test/agent+key5Tz";
const PUBLISH_TOKEN: &str = "gh-publish/tok+3Wm";
const LOGIN_TOKEN: &str = "oauth-access/tok+8Pq";

/// Each source, as the refusal names it, and its value.
const SOURCES: &[(&str, &str)] = &[
    ("the hub token", HUB_TOKEN),
    ("a `secrets` value", SECRET),
    ("`[env] agent` ANTHROPIC_API_KEY", AGENT_KEY),
    ("`[env] publish` GH_TOKEN", PUBLISH_TOKEN),
    (
        "the agent login (.credentials.json: claudeAiOauth.accessToken)",
        LOGIN_TOKEN,
    ),
];

/// One file per spelling: its name, the line written (the encoders' own output inside
/// ordinary text), and the encoded part alone.
fn spellings(v: &str) -> Vec<(String, String, String)> {
    let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
    let mut out = vec![
        ("verbatim.txt", "key=", v.to_string()),
        (
            "urlencoded.txt",
            "u=https://h/?k=",
            hub_sidecar::util::percent_encode(v),
        ),
        ("hex.txt", "0x", hex),
    ];
    let names = [
        ["b64-0.txt", "b64url-0.txt"],
        ["b64-1.txt", "b64url-1.txt"],
        ["b64-2.txt", "b64url-2.txt"],
    ];
    for (lead, [std_name, url_name]) in ["", "x", "xy"].iter().zip(names) {
        let blob = format!("{lead}{v}:tail");
        let std = base64::engine::general_purpose::STANDARD.encode(&blob);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&blob);
        out.push((std_name, "Basic ", std));
        out.push((url_name, "jwt.", url));
    }
    out.into_iter()
        .map(|(f, p, b)| (f.to_string(), format!("{p}{b}"), b))
        .collect()
}

/// A shell command writing `files` into the work tree and printing them.
fn writer(files: &[(String, String, String)]) -> String {
    let mut cmd = String::new();
    for (name, text, _) in files {
        cmd.push_str(&format!("printf '%s\\n' '{text}' > {name}; "));
    }
    cmd.push_str("cat *.txt");
    cmd
}

/// What must never leave the daemon: each encoded spelling without the two characters at
/// either end (a base64 alignment shares those with its neighbours).
fn cores() -> Vec<String> {
    SOURCES
        .iter()
        .flat_map(|(_, v)| spellings(v))
        .map(|(_, _, body)| body[2..body.len() - 2].to_string())
        .collect()
}

fn staged(ws: &std::path::Path) -> String {
    git(ws, &["status", "--porcelain"])
}

#[tokio::test]
async fn no_credential_the_daemon_knows_is_committed_pushed_or_sent_in_any_spelling() {
    let s = Setup::with_hub(MockHubOptions {
        agents: vec![("sidecar-test".into(), HUB_TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await;
    let dir = s.dir().to_path_buf();
    let remote = Remote::new();
    let template = dir.join("operator-claude");
    std::fs::create_dir_all(&template).unwrap();
    std::fs::write(
        template.join(".credentials.json"),
        json!({"claudeAiOauth": {"accessToken": LOGIN_TOKEN, "expiresAt": 1}}).to_string(),
    )
    .unwrap();
    let extra = format!(
        "secrets = [\"{SECRET}\"]\n[git]\nhub_api_url = \"http://127.0.0.1:1\"\n[publish]\nallow_secrets_in = [\"fixtures/**\"]\n"
    );
    let tpl = template.display().to_string();
    let mut h = s
        .start_bin(
            HUB_TOKEN,
            &extra,
            &[
                ("ANTHROPIC_API_KEY", AGENT_KEY),
                ("GH_TOKEN", PUBLISH_TOKEN),
                ("CLAUDE_CONFIG_DIR", &tpl),
            ],
        )
        .await;
    let ws = dir.join("workspaces");
    let before = remote.refs();
    let spelled = cores();
    let spelled: Vec<&str> = spelled.iter().map(String::as_str).collect();
    for (n, (source, value)) in SOURCES.iter().enumerate() {
        let id = format!("leak-{n}");
        let files = spellings(value);
        let mut t = shell_task(&id, &writer(&files), &remote.url(), "Write a config");
        t["verification_steps"] = json!([{"type": "file_exists", "target": "verbatim.txt"}]);
        h.assign(t);
        let done = terminal(h.hub(), &id).await;
        let r = &done["result"];
        assert_eq!(done["type"], "task_complete", "{done}");
        assert_eq!(r["verification_status"], "verified", "{r}");
        // Refused, as its own outcome, naming the source and the file of each spelling.
        assert_eq!(r["pushed"], false, "{r}");
        assert!(r.get("commit").is_none(), "{r}");
        assert_eq!(r["publish_refused"]["reason"], "credential", "{r}");
        let findings = r["publish_refused"]["findings"].as_array().unwrap();
        for (file, _, _) in &files {
            assert!(
                findings.iter().any(|f| f["path"] == file.as_str()
                    && f["what"].as_str().unwrap().starts_with(source)),
                "{source}: {file} not refused: {r}"
            );
        }
        assert!(
            findings.iter().any(|f| f["path"] == "verbatim.txt"
                && f["what"] == format!("{source} (verbatim)")),
            "{r}"
        );
        assert!(
            r["git_note"].as_str().unwrap().contains("not committed"),
            "{r}"
        );
        // Nothing pushed: every ref of the remote as it was, and no object in its store
        // holding any spelling of any credential. The work kept, staged, in the workspace.
        remote.assert_untouched(&before, &spelled, source);
        let clone = std::fs::read_dir(&ws)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.is_dir())
            .unwrap();
        let status = staged(&clone);
        assert!(status.contains("A  verbatim.txt"), "{status}");
        assert_eq!(
            std::fs::read_to_string(clone.join("verbatim.txt")).unwrap(),
            format!("key={value}\n")
        );
    }

    // A credential shape: refused in a source file, let through under an allowed path.
    let key = "-----BEGIN OPENSSH PRIVATE KEY-----";
    h.assign(shell_task(
        "shape-1",
        &format!("mkdir -p src; echo '{key}' > src/id_ed25519"),
        &remote.url(),
        "Add a key",
    ));
    let r = terminal(h.hub(), "shape-1").await["result"].clone();
    assert_eq!(r["pushed"], false, "{r}");
    assert_eq!(
        r["publish_refused"]["findings"],
        json!([{"path": "src/id_ed25519", "line": 1, "what": "a private key block"}])
    );
    remote.assert_untouched(&before, &[key], "a private key block");
    h.assign(shell_task(
        "shape-2",
        &format!("mkdir -p fixtures/keys; echo '{key}' > fixtures/keys/test_key"),
        &remote.url(),
        "Add a fixture",
    ));
    let r = terminal(h.hub(), "shape-2").await["result"].clone();
    assert_eq!(r["pushed"], true, "{r}");
    assert!(r.get("publish_refused").is_none(), "{r}");

    // Redacted from every frame the hub got and from the flight records.
    // (`identify` carries the hub token by design: it is how the daemon logs in.)
    let frames: Vec<_> = h
        .hub()
        .received()
        .into_iter()
        .filter(|f| f["type"] != "identify")
        .collect();
    let sent = serde_json::to_string(&frames).unwrap();
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let mut records = String::new();
    for e in walk(&dir.join("tasks")) {
        records.push_str(&String::from_utf8_lossy(&std::fs::read(e).unwrap()));
    }
    assert!(records.contains("leak-4"), "no flight record found");
    assert!(sent.contains("[REDACTED]"), "the output reached the hub");
    for core in cores() {
        assert!(!sent.contains(&core), "{core} reached the hub");
        assert!(!records.contains(&core), "{core} in a flight record");
    }
    h.finish().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The class as it was shown: an agent (a stand-in `claude` given the key and a copy of the
/// login, as the real one is) writes its key and its login into the work tree and says the
/// key in its answer. Nothing is pushed; the key reaches no frame and no record.
#[tokio::test]
async fn an_agent_that_writes_its_key_and_login_into_the_work_tree_gets_nothing_published() {
    if !crate::containment::supported() {
        return;
    }
    let s = crate::harness::Harness::setup().await;
    let dir = s.dir().to_path_buf();
    let remote = Remote::new();
    let before = remote.refs();
    let template = dir.join("operator-claude");
    std::fs::create_dir_all(&template).unwrap();
    std::fs::write(
        template.join(".credentials.json"),
        json!({"claudeAiOauth": {"accessToken": LOGIN_TOKEN, "refreshToken": "refresh-tok-9Lx2"}})
            .to_string(),
    )
    .unwrap();
    let bin = tempfile::tempdir().unwrap();
    let claude = bin.path().join("claude");
    super::write_exe(
        &claude,
        r#"#!/bin/sh
# Test double for the Claude Code CLI: leaks its key and its login into the work tree.
printf '%s\n' "$ANTHROPIC_API_KEY" > key.txt
cp "$CLAUDE_CONFIG_DIR/.credentials.json" login.json
echo '{"type":"system","subtype":"init","cwd":"/w","session_id":"s-1","tools":["Write"],"model":"claude-sonnet-4-5-20250929"}'
echo "{\"type\":\"assistant\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5-20250929\",\"content\":[{\"type\":\"text\",\"text\":\"my key is $ANTHROPIC_API_KEY\"}],\"stop_reason\":\"end_turn\",\"usage\":{\"input_tokens\":5,\"output_tokens\":3}},\"session_id\":\"s-1\"}"
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"duration_ms\":5,\"num_turns\":1,\"result\":\"done with $ANTHROPIC_API_KEY\",\"session_id\":\"s-1\",\"total_cost_usd\":0.001,\"usage\":{\"input_tokens\":5,\"output_tokens\":3}}"
"#,
    );
    let extra = format!(
        "[executor]\nclaude_path = \"{}\"\n[git]\nhub_api_url = \"http://127.0.0.1:1\"\n",
        claude.display()
    );
    let tpl = template.display().to_string();
    let mut h = s
        .start_bin(
            "test-token",
            &extra,
            &[
                ("ANTHROPIC_API_KEY", AGENT_KEY),
                ("CLAUDE_CONFIG_DIR", &tpl),
            ],
        )
        .await;
    h.assign(json!({
        "task_id": "agent-leak",
        "description": "Write key.txt",
        "repo": remote.url(),
        "routing_decision": {"effective_tier": "complex", "target_type": "claude",
            "selected_endpoint": null, "selected_model": null, "fallback_used": false,
            "fallback_reason": null, "classification_reason": "test", "estimated_cost_tier": "high"},
        "verification_steps": [{"type": "file_exists", "target": "key.txt"}],
        "max_verification_retries": 0
    }));
    let done = terminal(h.hub(), "agent-leak").await;
    let r = &done["result"];
    assert_eq!(r["verification_status"], "verified", "{done}");
    assert_eq!(r["pushed"], false, "{r}");
    let found = &r["publish_refused"]["findings"];
    for (path, what) in [
        ("key.txt", "`[env] agent` ANTHROPIC_API_KEY (verbatim)"),
        (
            "login.json",
            "the agent login (.credentials.json: claudeAiOauth.accessToken) (verbatim)",
        ),
        (
            "login.json",
            "the agent login (.credentials.json: claudeAiOauth.refreshToken) (verbatim)",
        ),
    ] {
        assert!(
            found
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["path"] == path && f["what"] == what),
            "{path}: {what} not in {found}"
        );
    }
    remote.assert_untouched(
        &before,
        &[AGENT_KEY, LOGIN_TOKEN, "refresh-tok-9Lx2"],
        "the agent's key and login",
    );
    let frames: Vec<_> = h
        .hub()
        .received()
        .into_iter()
        .filter(|f| f["type"] != "identify")
        .collect();
    let sent = serde_json::to_string(&frames).unwrap();
    assert!(
        sent.contains("my key is [REDACTED]"),
        "the agent's text reached the hub"
    );
    h.bin().signal("TERM");
    h.bin_mut().wait(T).await;
    let mut records = String::new();
    for e in walk(&dir.join("tasks")) {
        records.push_str(&String::from_utf8_lossy(&std::fs::read(e).unwrap()));
    }
    assert!(records.contains("agent-leak"), "no flight record");
    for v in [AGENT_KEY, LOGIN_TOKEN, "refresh-tok-9Lx2"] {
        assert!(!sent.contains(v), "{v} reached the hub");
        assert!(!records.contains(v), "{v} in the flight record");
    }
    h.finish().await;
}
