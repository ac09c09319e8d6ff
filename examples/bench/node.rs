//! Figure 14: the Node sidecar, measured in the same run against the same mock hub, when
//! `NODE_SIDECAR` names a copy of it (public notno/AgentCom, `sidecar/`, with its
//! dependencies installed: `npm ci`). Never part of this repository: it is installed by hand
//! beside the bench (BENCHMARKS.md, "The Node sidecar").
//!
//! Both get the same tasks, one at a time with the same pause after each: `n` shell
//! `echo` tasks after five warm-ups, timed on the mock's clock from the `task_assign` it
//! wrote to the `task_accepted` and `task_complete` it read; and spawn → `identify`
//! received, median of five starts each. The two runs alternate (Node, then hub-sidecar,
//! each figure), so a machine busy at one moment weighs on both.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::{sample_shell_task, MockHub};

use crate::harness::*;
use crate::Opts;

/// A Node sidecar started from a copy of `NODE_SIDECAR` in a temp dir (it reads
/// `config.json` beside its `index.js`), connected to `hub`.
struct Node {
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
    spawned: Instant,
}

impl Node {
    fn start(src: &Path, hub: &MockHub) -> Node {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("sidecar");
        let st = std::process::Command::new("cp")
            .arg("-a")
            .arg(src)
            .arg(&root)
            .status()
            .expect("cp");
        assert!(st.success(), "cannot copy {}", src.display());
        let config = serde_json::json!({
            "agent_id": "sidecar-test",
            "token": "test-token",
            "hub_url": hub.url(),
            "capabilities": [],
            // It refuses every task without one, even those it runs itself (routed to
            // `sidecar`, as these are): never run here.
            "wake_command": "true",
            "results_dir": dir.path().join("results"),
            "log_file": dir.path().join("node.log"),
        });
        std::fs::write(root.join("config.json"), config.to_string()).expect("node config");
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg("index.js")
            .current_dir(&root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let spawned = Instant::now();
        let child = cmd.spawn().expect("node: is it installed?");
        Node {
            child,
            _dir: dir,
            spawned,
        }
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// p50 of assign → accepted and assign → complete over `n` `echo` tasks on `hub` (after
/// five warm-ups), in ms.
async fn round_trips(hub: &MockHub, n: usize) -> (Stats, Stats) {
    for i in 0..5 {
        hub.assign(sample_shell_task(&format!("warm-{i}"), "echo warm"));
        hub.wait_for_nth("task_complete", i + 1, T)
            .await
            .expect("warm-up task_complete");
        settle().await;
    }
    for i in 0..n {
        hub.assign(sample_shell_task(&format!("rt-{i}"), &format!("echo {i}")));
        hub.wait_for_nth("task_complete", i + 6, T)
            .await
            .expect("task_complete");
        settle().await;
    }
    let (mut accepted, mut complete) = (Vec::new(), Vec::new());
    for i in 0..n {
        let id = format!("rt-{i}");
        let at = |inbound, ty| {
            hub.frames()
                .into_iter()
                .find(|r| {
                    r.inbound == inbound && type_of(&r.frame) == ty && r.frame["task_id"] == *id
                })
                .map(|r| r.at)
        };
        if let Some(a) = at(false, "task_assign") {
            if let Some(t) = at(true, "task_accepted") {
                accepted.push(ms(t - a));
            }
            if let Some(t) = at(true, "task_complete") {
                complete.push(ms(t - a));
            }
        }
    }
    (Stats::new(accepted), Stats::new(complete))
}

/// Spawn → `identify` received at the mock, ms.
async fn to_identify(hub: &MockHub, spawned: Instant) -> f64 {
    let got = hub.wait_for_type("identify", T).await;
    assert!(got.is_some(), "no identify");
    let at = hub
        .frames()
        .into_iter()
        .find(|r| r.inbound && type_of(&r.frame) == "identify")
        .map(|r| r.at)
        .expect("identify recorded");
    ms(at.saturating_duration_since(spawned))
}

/// The `NODE_SIDECAR` directory, when set.
pub(crate) fn node_sidecar() -> Option<PathBuf> {
    std::env::var_os("NODE_SIDECAR")
        .map(PathBuf::from)
        .filter(|p| p.join("index.js").is_file())
}

/// Figure 14, see the module docs.
pub(crate) async fn compare(o: &Opts, src: &Path, n: usize) -> Vec<Row> {
    let (mut node_up, mut ours_up) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let hub = hub_unlimited().await;
        let node = Node::start(src, &hub);
        node_up.push(to_identify(&hub, node.spawned).await);
        node.stop().await;
        let hub = hub_unlimited().await;
        let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
        ours_up.push(to_identify(&hub, d.spawned).await);
        d.stop().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    flush_writeback().await;
    let hub = hub_unlimited().await;
    let node = Node::start(src, &hub);
    identified(&hub).await;
    let (node_acc, node_rt) = round_trips(&hub, n).await;
    node.stop().await;
    flush_writeback().await;
    let hub = hub_unlimited().await;
    let d = Daemon::start(o, &hub, UNTHROTTLED, &[]);
    identified(&hub).await;
    let (ours_acc, ours_rt) = round_trips(&hub, n).await;
    d.stop().await;
    let (node_up, ours_up) = (Stats::new(node_up), Stats::new(ours_up));
    let speedup = node_rt.median() / ours_rt.median();
    vec![
        Row::new(
            &format!("14a. task round trip vs the Node sidecar, p50 ({n} × shell `echo`, assign → task_complete, same mock hub, this run)"),
            "≥ 1.5 × Node",
            &format!("{:.2} ms (measured)", node_rt.median()),
            format!(
                "{:.2} ms: {speedup:.2}× Node (p99 {:.2}; Node p99 {:.2})",
                ours_rt.median(),
                ours_rt.p(0.99),
                node_rt.p(0.99)
            ),
            Some(speedup >= 1.5),
        ),
        Row::new(
            "14b. assign → task_accepted vs the Node sidecar, p50 (same tasks)",
            "—",
            &format!("{:.2} ms (measured)", node_acc.median()),
            format!(
                "{:.2} ms: {:.1}× Node",
                ours_acc.median(),
                node_acc.median() / ours_acc.median()
            ),
            None,
        ),
        Row::new(
            "14c. spawn → identify received vs the Node sidecar (median of 5 each)",
            "≥ 35 × Node",
            &format!("{:.1} ms (measured)", node_up.median()),
            format!(
                "{:.1} ms: {:.0}× Node",
                ours_up.median(),
                node_up.median() / ours_up.median()
            ),
            Some(node_up.median() / ours_up.median() >= 35.0),
        ),
    ]
}
