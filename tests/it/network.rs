//! `[network] mode = "allowlist"`: a task's only way out is the daemon's proxy, which lets
//! through the hosts on the list (plain HTTP and CONNECT tunnels) and refuses the rest;
//! a check that needed a refused host is an infrastructure error naming it.

use std::collections::HashMap;

use hub_sidecar::config::NetworkMode;
use hub_sidecar::mock_hub::sample_shell_task;
use serde_json::json;

use crate::git::terminal;
use crate::harness::Harness;
use crate::loopback::Loopback;
use crate::util::{wait_until, T};

/// A python one-liner run with the proxy variables the sandbox set, minus NO_PROXY (the
/// stand-in hosts are loopback addresses, which NO_PROXY names).
fn via_proxy(py: &str) -> String {
    format!("env NO_PROXY= no_proxy= python3 -c \"{py}\"")
}

#[tokio::test]
async fn the_allowlist_lets_listed_hosts_through_the_proxy_and_nothing_else() {
    if !crate::containment::supported() {
        return;
    }
    if which::which("python3").is_err() {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let server =
        Loopback::serve(|_| HashMap::from([("/x".to_string(), b"through-the-proxy".to_vec())]))
            .await;
    let port = server.addr.port();
    let s = Harness::setup().await;
    let (mut c, _ws) = s.cfg_with_workspace();
    c.network.mode = NetworkMode::Allowlist;
    c.network.allow = vec!["127.0.0.1".into()];
    let h = s.start(c).await;

    // Plain HTTP to an allowed host, through HTTP_PROXY.
    let get = |host: &str| {
        via_proxy(&format!(
            "import urllib.request; print(urllib.request.urlopen('http://{host}:{port}/x', timeout=10).read().decode())"
        ))
    };
    h.assign(sample_shell_task("allowed", &get("127.0.0.1")));
    let done = terminal(h.hub(), "allowed").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(done["result"]["output"]
        .as_str()
        .unwrap_or_default()
        .contains("through-the-proxy"));

    // A CONNECT tunnel to an allowed host (what HTTPS clients do), bytes untouched.
    let tunnel = via_proxy(&format!(
        "import socket; s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\\\\r\\\\n\\\\r\\\\n'); assert b' 200 ' in s.recv(100); s.sendall(b'GET /x HTTP/1.1\\\\r\\\\nHost: t\\\\r\\\\n\\\\r\\\\n'); d = b''\nwhile True:\n    c = s.recv(4096)\n    if not c: break\n    d += c\nprint(d.decode())"
    ));
    h.assign(sample_shell_task("tunnel", &tunnel));
    let done = terminal(h.hub(), "tunnel").await;
    assert_eq!(done["type"], "task_complete", "{done}");
    assert!(
        done["result"]["output"]
            .as_str()
            .unwrap_or_default()
            .contains("through-the-proxy"),
        "{done}"
    );

    // Straight to the host's loopback, around the proxy: there is no route.
    let direct = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)\""
    );
    h.assign(sample_shell_task("direct", &direct));
    let done = terminal(h.hub(), "direct").await;
    assert_eq!(done["type"], "task_failed", "{done}");

    // A host not on the list is refused by the proxy (never connected), and a check that
    // needed it is an infrastructure error naming it.
    let before = server.hits().len();
    let mut t = sample_shell_task("refused", "true");
    t["verification_steps"] = json!([{"type": "command_succeeds", "target": get("127.0.0.2")}]);
    h.assign(t);
    let done = terminal(h.hub(), "refused").await;
    assert_eq!(
        done["result"]["termination_reason"], "check_error",
        "{done}"
    );
    let out = done["verification_report"]["checks"][0]["output"]
        .as_str()
        .unwrap_or_default();
    assert!(out.contains(&format!("refused 127.0.0.2:{port}")), "{out}");
    assert!(out.contains("[network] allow"), "{out}");
    assert_eq!(
        server.hits().len(),
        before,
        "the refused request reached no server"
    );

    // Every host, allowed or refused, with its bytes, is in the flight record and `show`.
    let state = h.dir().to_path_buf();
    let show = |id: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
            .args(["show", id, "--state-dir"])
            .arg(&state)
            .env_remove("HUB_SIDECAR_CONFIG")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let recorded = |id: &str| {
        let record = state.join("tasks").join(id).join("record.jsonl");
        std::fs::read_to_string(record)
            .unwrap_or_default()
            .contains("\"kind\":\"terminal\"")
    };
    assert!(wait_until(|| recorded("allowed") && recorded("refused"), T).await);
    let allowed = show("allowed");
    let line = allowed
        .lines()
        .find(|l| l.contains(&format!("allowed 127.0.0.1:{port}")))
        .unwrap_or_else(|| panic!("{allowed}"));
    assert!(!line.contains("0.0 KiB down"), "bytes are counted: {line}");
    let refused = show("refused");
    assert!(
        refused.contains(&format!("REFUSED 127.0.0.2:{port}")),
        "{refused}"
    );
    h.finish().await;
}
