//! What only a service user meets, found by running as one and covered here so that a run
//! as root would notice too: a workspace the service user may write but does not own.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{json, Value};

use crate::git::git;

/// Run `task` with `run-task` in `workspace`; the result frame.
fn run_task(dir: &Path, workspace: &Path, task: Value) -> Value {
    let file = dir.join("task.json");
    std::fs::write(&file, task.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hub-sidecar"))
        .arg("run-task")
        .arg("--workspace")
        .arg(workspace)
        .arg(&file)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no result ({e}): {}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_tasks_own_git_works_in_a_shared_workspace_it_does_not_own() {
    if !crate::containment::supported() {
        return;
    }
    // Root gives the workspace another owner.
    if !crate::util::require("root", crate::util::missing_root()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    git(&repo, &["add", "a.txt"]);
    git(
        &repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "init",
        ],
    );
    // Another owner, shared for writing: inside the task's user namespace the owner is
    // unmapped, as a repo_dir shared with the service user through a group appears.
    let chown = std::process::Command::new("chown")
        .args(["-R", "12345:12345"])
        .arg(&repo)
        .status()
        .unwrap();
    assert!(chown.success());
    std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o777)).unwrap();
    let task = json!({
        "task_id": "shared-ws", "description": "git in a shared workspace", "generation": 1,
        "metadata": {"shell_command": "git status --short && git log --oneline | wc -l", "timeout_ms": 60000},
        "routing_decision": {"target_type": "sidecar"},
        "verification_steps": [], "max_verification_retries": 0
    });
    let done = run_task(dir.path(), &repo, task);
    let output = done["result"]["output"].as_str().unwrap_or_default();
    assert!(!output.contains("dubious ownership"), "{output}");
    assert_eq!(
        done["result"]["verification_status"], "verified",
        "{done:#}"
    );
    assert_eq!(output.trim(), "1", "{output}");
}
