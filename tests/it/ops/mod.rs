//! Operations (issue: operations and user experience): graceful stop through the real
//! binary, systemd notify datagrams, `/healthz` and `/metrics`, the `check`, `run-task` and
//! `verify` subcommands, and the shipped unit files.
//!
//! Layout: this file holds the shared readers (state, logs, close codes); `signals`, `health`,
//! `subcommands` and `install` hold the tests by topic.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions, RecoveryAnswer};
use hub_sidecar::ops::Ops;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::harness::Harness;
use crate::util::*;

mod alerts;
mod check;
mod health;
mod install;
mod signals;
mod subcommands;

/// `/healthz` and `/metrics` served on a free loopback port, as `run` serves them.
struct MetricsServer {
    ops: Ops,
    addr: std::net::SocketAddr,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl MetricsServer {
    async fn start() -> MetricsServer {
        let ops = Ops::new();
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let addr = hub_sidecar::ops::http::start(
            "127.0.0.1:0".parse().unwrap(),
            ops.clone(),
            cancel.clone(),
            &tracker,
        )
        .await
        .unwrap();
        MetricsServer {
            ops,
            addr,
            cancel,
            tracker,
        }
    }

    /// Stop serving and wait for the server to end.
    async fn stop(self) {
        self.cancel.cancel();
        self.tracker.close();
        tokio::time::timeout(T, self.tracker.wait()).await.unwrap();
    }
}

async fn hub() -> MockHub {
    MockHub::start(MockHubOptions::default()).await.unwrap()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The state on disk as JSON (the journal replayed).
fn state_json(dir: &Path) -> Value {
    serde_json::to_value(hub_sidecar::state::read_state(&dir.join("queue.json")).unwrap()).unwrap()
}

/// The phase of the active task in the state file, if any.
fn active_phase(dir: &Path) -> Option<String> {
    let st = hub_sidecar::state::read_state(&dir.join("queue.json")).ok()?;
    let v = serde_json::to_value(st).ok()?;
    v["active"]["phase"].as_str().map(str::to_string)
}

/// Wait until the daemon's log contains `needle` (the daemon logs each stop stage).
async fn wait_log(bin: &Bin, needle: &str) {
    assert!(
        wait_until(|| bin.logs().contains(needle), T).await,
        "log never showed {needle:?}:\n{}",
        bin.logs()
    );
}

/// Close frames the sidecar sent, as codes.
async fn close_codes(hub: &MockHub) -> Vec<u64> {
    let codes = || -> Vec<u64> {
        hub.received_of("<close>")
            .iter()
            .filter_map(|f| f["code"].as_u64())
            .collect()
    };
    // The hub records the close frame on its own task: after the daemon has exited, it may
    // not have read it yet.
    crate::util::wait_until(|| !codes().is_empty(), crate::util::T).await;
    codes()
}
