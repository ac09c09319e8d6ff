//! Smaller leaks (issue 27, class 5): the daemon's status socket and the credentials in its
//! environment must not reach a task.

use serde_json::json;

use hub_sidecar::mock_hub::sample_shell_task;

use crate::containment::supported;
use crate::git::terminal;
use crate::harness::Harness;

/// The status socket's mode admits the service user, which a task's processes are too;
/// Landlock does not govern `connect()` to a path socket. The daemon refuses a peer in
/// another user namespace, so the task learns nothing, while `status` still works.
#[tokio::test]
async fn a_task_cannot_read_the_status_socket() {
    if !supported() || which::which("curl").is_err() {
        eprintln!("skipped: needs containment and curl");
        return;
    }
    let s = Harness::setup().await;
    let sock = s.dir().join("status.sock");
    // The real binary: the socket is part of `run`, not of the daemon's library entry.
    let mut h = s.start_bin("test-token", "", &[]).await;
    let mut t = sample_shell_task(
        "peek",
        &format!(
            "curl -s --max-time 5 --unix-socket '{}' http://sidecar/status; echo \" curl=$?\"",
            sock.display()
        ),
    );
    t["verification_steps"] = json!([]);
    h.assign(t);
    let done = terminal(h.hub(), "peek").await;
    let out = done["result"]["output"].as_str().unwrap_or_default();
    assert!(out.contains("curl="), "{done}");
    assert!(
        !out.contains("active_task") && !out.contains("\"link\""),
        "the task read the daemon's status: {out}"
    );
    // The operator (same user, same namespace) still gets it.
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "5", "--unix-socket"])
        .arg(&sock)
        .arg("http://sidecar/status")
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("active_task"), "{body}");
    h.bin().signal("TERM");
    h.bin_mut().wait(crate::util::T).await;
    h.finish().await;
}
