//! A strict daemon on a machine that cannot confine: it takes no work, says so to the hub
//! (a `status` frame once its probe has answered, which is after `identify`), in `status`
//! and in its log, and starts taking work once the machine is fixed — without
//! a restart.
//!
//! The machine is made unable to confine for the daemon alone: the real binary runs in a
//! user namespace whose `user.max_user_namespaces` is 0, so the daemon's probe (and any
//! task's spawn) cannot create the namespaces strict containment needs. Raising the limit
//! from outside is the operator's fix. Works as root and as an unprivileged user.

use std::path::Path;
use std::process::Stdio;

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};

use crate::util::*;

const TOKEN: &str = "tok-ready-3b7e1f0c";

/// Why this machine cannot run the test, if it cannot.
/// The gate: containment (the daemon must first be able to confine), `unshare` and
/// `nsenter` (each a `require`).
fn supported() -> bool {
    crate::containment::supported()
        && ["unshare", "nsenter"]
            .iter()
            .all(|t| crate::util::require("unshare", crate::util::missing_tool(t)))
}

/// Set `user.max_user_namespaces` in the user namespace of `pid`.
fn set_userns_limit(pid: u32, limit: u32) {
    let st = std::process::Command::new("nsenter")
        .args([
            "--user",
            "--preserve-credentials",
            "--target",
            &pid.to_string(),
        ])
        .args([
            "sh",
            "-c",
            &format!("echo {limit} > /proc/sys/user/max_user_namespaces"),
        ])
        .status()
        .unwrap();
    assert!(st.success(), "nsenter could not set the limit");
}

/// `hub-sidecar status --json` from inside the daemon's user namespace: the status socket
/// admits only peers of the daemon's own namespace (a task's is another), and an operator
/// of a daemon run this way asks from there too.
async fn status(dir: &Path, pid: u32) -> hub_sidecar::ops::StatusSnapshot {
    let out = tokio::process::Command::new("nsenter")
        .args([
            "--user",
            "--preserve-credentials",
            "--target",
            &pid.to_string(),
        ])
        .arg(env!("CARGO_BIN_EXE_hub-sidecar"))
        .args(["status", "--json", "--state-dir"])
        .arg(dir)
        .output()
        .await
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status: {e}: {}", String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test]
async fn a_strict_daemon_that_cannot_confine_takes_no_work_and_recovers_without_restart() {
    if !supported() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let hub = MockHub::start(MockHubOptions {
        agents: vec![("sidecar-test".into(), TOKEN.into())],
        ..MockHubOptions::default()
    })
    .await
    .unwrap();
    // No containment line: the default, strict.
    let config = write_config(&hub, dir, TOKEN, "");
    let log = dir.join("daemon.log");
    // `unshare` (without --fork) and `sh` exec in place: the child's pid is the daemon's.
    let mut daemon = tokio::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c"])
        .arg("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" run --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_hub-sidecar"))
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    // `identify` goes out before the containment probe runs (nothing but the config and
    // the connection is on its way: BENCHMARKS.md, figure 1), so it cannot know yet; the
    // probe's answer follows as a `status` frame, which the real hub takes (light tier,
    // answered `status_updated`).
    let identify = hub
        .wait_for_type("identify", T)
        .await
        .unwrap_or_else(|| panic!("no identify; log:\n{}", logs()));
    assert_eq!(identify["status"], "idle", "{identify:#}");
    let corrected = hub
        .wait_for_type("status", T)
        .await
        .unwrap_or_else(|| panic!("no status frame; log:\n{}", logs()));
    let announced = corrected["status"].as_str().unwrap_or_default();
    assert!(
        announced.starts_with("not accepting tasks: containment_unavailable"),
        "status: {announced}"
    );

    // An assignment is handed back before anything runs or is spent: no task_accepted.
    hub.assign(sample_shell_task("refused", "echo ran > ran.txt"));
    let failed = hub
        .wait_for(
            |f| f["type"] == "task_failed" && f["task_id"] == "refused",
            T,
        )
        .await
        .unwrap_or_else(|| panic!("no task_failed; log:\n{}", logs()));
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("containment_unavailable"), "{reason}");
    assert!(reason.contains("best-effort"), "says what to do: {reason}");
    assert!(
        hub.received_of("task_accepted")
            .iter()
            .all(|f| f["task_id"] != "refused"),
        "a refused task was accepted"
    );
    let pid = daemon.id().unwrap();
    let snap = status(dir, pid).await;
    assert_eq!(snap.containment.as_deref(), Some("strict"));
    let why = snap.not_accepting.expect("status says it takes no work");
    assert!(why.contains("namespaces"), "{why}");
    assert!(logs().contains("NOT accepting tasks"), "log:\n{}", logs());

    // The operator's fix; the daemon notices by itself.
    set_userns_limit(pid, 1000);
    let mut recovered = false;
    for _ in 0..60 {
        if status(dir, pid).await.not_accepting.is_none() {
            recovered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(
        recovered,
        "still not accepting after the fix; log:\n{}",
        logs()
    );
    // The hub is told too.
    hub.wait_for(|f| f["type"] == "status" && f["status"] == "idle", T)
        .await
        .unwrap_or_else(|| panic!("no status frame saying idle; log:\n{}", logs()));
    hub.assign(sample_shell_task("accepted", "echo ran"));
    let done = hub
        .wait_for(
            |f| {
                (f["type"] == "task_complete" || f["type"] == "task_failed")
                    && f["task_id"] == "accepted"
            },
            T,
        )
        .await
        .unwrap_or_else(|| panic!("no result; log:\n{}", logs()));
    assert_eq!(done["type"], "task_complete", "{done:#}");
    assert_eq!(done["result"]["containment"], "strict", "{done:#}");
    assert_no_violations(&hub);
    daemon.kill().await.unwrap();
}
