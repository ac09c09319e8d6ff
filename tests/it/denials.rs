//! A task refused a path by containment gets an infrastructure error naming the path and the
//! config line that grants it: not a failed check for the corrective loop to retry.

use hub_sidecar::mock_hub::sample_shell_task;
use hub_sidecar::sandbox::Support;
use serde_json::json;

use crate::git::terminal;
use crate::harness::Harness;

fn supported() -> bool {
    let missing = Support::probe().missing();
    if !missing.is_empty() {
        eprintln!(
            "skipped: this machine cannot confine tasks: {}",
            missing.join("; ")
        );
        return false;
    }
    true
}

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
    assert!(out.contains(&format!("{}/x", outside.display())), "{out}");
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
