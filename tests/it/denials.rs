//! A task refused a path by containment gets an infrastructure error naming the path and the
//! config line that grants it: not a failed check for the corrective loop to retry.

use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::{json, Value};

use crate::containment::supported;
use crate::git::terminal;
use crate::harness::Harness;

#[tokio::test]
async fn a_check_refused_a_path_is_a_check_error_naming_the_grant_and_is_not_retried() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    // Outside every grant, and writable by the daemon's user: only containment refuses it.
    let outside = s.dir().join("outside-cache");
    std::fs::create_dir_all(&outside).unwrap();
    let (c, _ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    let mut t = sample_shell_task("denied-check", "true");
    t["max_verification_retries"] = json!(2);
    t["verification_steps"] = json!([
        {"type": "command_succeeds", "target": format!("mkdir -p {}/x", outside.display())}
    ]);
    h.assign(t);
    let done = terminal(h.hub(), "denied-check").await;
    let r = &done["result"];
    assert_eq!(r["termination_reason"], "check_error", "{done}");
    assert_eq!(r["verification_attempts"], 1, "not retried: {done}");
    let check = &done["verification_report"]["checks"][0];
    assert_eq!(check["status"], "error", "{done}");
    let out = check["output"].as_str().unwrap_or_default();
    assert!(out.starts_with("infrastructure_error:"), "{out}");
    // The path, or the first of its directories the task could not make: the tree is
    // hidden from it (its mount namespace), so `mkdir -p` stops there.
    assert!(out.contains(&outside.display().to_string()), "{out}");
    assert!(out.contains("[sandbox] write_paths"), "{out}");
    h.finish().await;
}

#[tokio::test]
async fn a_shell_task_refused_a_path_fails_naming_it() {
    if !supported() {
        return;
    }
    let s = Harness::setup().await;
    let outside = s.dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let (c, _ws) = s.cfg_with_workspace();
    let h = s.start(c).await;
    let file = outside.join("f");
    h.assign(sample_shell_task(
        "denied-shell",
        &format!("echo x > {}", file.display()),
    ));
    let done = terminal(h.hub(), "denied-shell").await;
    let err = done["error"].as_str().unwrap_or_default();
    assert!(err.contains("infrastructure_error:"), "{done}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    h.finish().await;
}

/// `python3 -c` fetching `url`; exits non-zero when it cannot.
fn fetch(url: &str) -> String {
    format!("python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}', timeout=10).read().decode())\"")
}

#[tokio::test]
async fn with_network_none_a_task_reaches_no_host_service_but_its_own_loopback() {
    if !supported() || !crate::util::require("python3", crate::util::missing_tool("python3")) {
        return;
    }
    let server = crate::loopback::Loopback::serve(|_| {
        std::collections::HashMap::from([("/x".to_string(), b"host-service".to_vec())])
    })
    .await;
    let url = format!("{}/x", server.url());
    // Open: the host's loopback service answers.
    let s = Harness::setup().await;
    let (mut c, _ws) = s.cfg_with_workspace();
    c.network.mode = hub_sidecar::config::NetworkMode::Open;
    let h = s.start(c).await;
    h.assign(sample_shell_task("open", &fetch(&url)));
    let done = terminal(h.hub(), "open").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    h.finish().await;
    assert_eq!(server.hits().len(), 1);

    // None: it does not, while a server the task starts on its own loopback does.
    let s = Harness::setup().await;
    let (mut c, _ws) = s.cfg_with_workspace();
    c.network.mode = hub_sidecar::config::NetworkMode::None;
    let h = s.start(c).await;
    h.assign(sample_shell_task("cut", &fetch(&url)));
    let done = terminal(h.hub(), "cut").await;
    assert_eq!(done["type"], "task_failed", "{done}");
    assert_eq!(server.hits().len(), 1, "the host service saw nothing");
    let own = "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c = socket.create_connection(s.getsockname()); print('own loopback ok')\"";
    h.assign(sample_shell_task("own-lo", own));
    let done = terminal(h.hub(), "own-lo").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    // A check that needs a name resolved: an infrastructure error naming the setting.
    let out = check_error(
        &h,
        sample_shell_task("resolve", "true"),
        "python3 -c \"import socket; socket.getaddrinfo('registry.example.test', 443)\"",
    )
    .await;
    assert!(out.contains("[network] mode"), "{out}");
    h.finish().await;
}

/// Assign `task` with one check, `command` (a `command_succeeds`), and wait for the loop to
/// end with `check_error`: the check's output (the infrastructure error).
pub(crate) async fn check_error(h: &Harness, mut task: Value, command: &str) -> String {
    let id = task["task_id"].as_str().unwrap_or_default().to_string();
    task["verification_steps"] = json!([{"type": "command_succeeds", "target": command}]);
    h.assign(task);
    let done = terminal(h.hub(), &id).await;
    assert_eq!(
        done["result"]["termination_reason"], "check_error",
        "{done}"
    );
    done["verification_report"]["checks"][0]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
