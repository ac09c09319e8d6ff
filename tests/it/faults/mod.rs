//! Fault injection (issue: reliability and security): hub crashes, daemon SIGKILLs, a stuck
//! hub, the real rate budget, a soak, an unwritable state file, hostile frames, and the
//! security properties (token never leaves, redaction, TLS verification, no shell
//! interpretation of task data).
//!
//! Every loop is bounded in count and time. The CI variants are sized to keep this module's
//! wall time modest on 2 cores; the long variants are `#[ignore]`d and run by
//! `scripts/soak.sh` (`cargo test --release -- --ignored`). Where a test sleeps, the sleep
//! *is* the fault (a random moment to crash the hub or kill the daemon) and says so.
//!
//! Layout: this file holds the shared helpers (state-file readers, hub
//! counters, `drive_to_ack`); each fault family is one submodule, reached through
//! `use super::*`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions, MockTaskState};
use serde_json::{json, Value};

use crate::harness::{Harness, Setup};
use crate::procfs::{fd_count, rss_kb, zombie_children};
use crate::util::*;

mod bad_input;
mod disk;
mod hub_restarts;
mod rate_budget;
mod security;
mod sigkill;
mod soak;
mod stuck_hub;

async fn hub() -> MockHub {
    MockHub::start(MockHubOptions::default()).await.unwrap()
}

// ---------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------

/// The state on disk as JSON (the journal replayed), `Null` if there is none.
fn state_json(path: &Path) -> Value {
    hub_sidecar::state::read_state(path)
        .ok()
        .and_then(|st| serde_json::to_value(st).ok())
        .unwrap_or(Value::Null)
}

fn active_id(st: &Value) -> Option<String> {
    st["active"]["task"]["task_id"].as_str().map(str::to_string)
}

fn outbox_has(st: &Value, id: &str) -> bool {
    st["outbox"]
        .as_array()
        .is_some_and(|o| o.iter().any(|e| e["task_id"] == id))
}

fn count_of(hub: &MockHub, ty: &str, id: &str) -> usize {
    hub.received_of(ty)
        .iter()
        .filter(|f| f["task_id"] == id)
        .count()
}

fn terminal_count(hub: &MockHub, id: &str) -> usize {
    count_of(hub, "task_complete", id) + count_of(hub, "task_failed", id)
}

fn dump(hub: &MockHub, id: &str) -> String {
    let mut s = String::new();
    for f in hub.frames() {
        if f.frame["task_id"] == id || f.frame["type"] == "error" || f.frame["type"] == "identify" {
            let dir = if f.inbound { "->" } else { "<-" };
            let mut text = f.frame.to_string();
            text.truncate(300);
            s.push_str(&format!("  c{} {dir} {text}\n", f.conn));
        }
    }
    s
}

/// Play the hub's part until `id` is acknowledged complete: assign it (unless `assigned`
/// already), and assign it again (at the table's current generation) when the hub re-queued
/// it or when the assignment evidently never reached the daemon (nothing heard about it for
/// 3 s while connected — the push was lost in a hub crash). Returns the assignments made.
async fn drive_to_ack(
    hub: &MockHub,
    id: &str,
    task: &Value,
    assigned: bool,
    limit: Duration,
) -> u32 {
    let deadline = Instant::now() + limit;
    let mut assigns = 0;
    let mut last_assign: Option<Instant> = assigned.then(Instant::now);
    loop {
        if hub.acked_terminal(id) >= 1
            && hub
                .task(id)
                .is_some_and(|t| t.state == MockTaskState::Complete)
        {
            return assigns;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} never acknowledged complete after {assigns} assignment(s):\n{}",
            dump(hub, id)
        );
        let heard = hub.received().iter().any(|f| f["task_id"] == id);
        let queued = hub
            .task(id)
            .is_some_and(|t| t.state == MockTaskState::Queued);
        let need = match last_assign {
            None => true,
            Some(t) => {
                (queued && t.elapsed() > Duration::from_millis(300))
                    || (!heard && t.elapsed() > Duration::from_secs(3))
            }
        };
        if need && hub.connected() {
            let mut t = task.clone();
            // The table's generation: a re-queued task goes out at generation + 1.
            t.as_object_mut().unwrap().remove("generation");
            hub.assign(t);
            assigns += 1;
            last_assign = Some(Instant::now());
        }
        // acked_terminal counts frames the hub sends: no event to wait on, so poll.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait for two more pings: a duplicate result would have arrived by then.
async fn settle(hub: &MockHub) {
    let n = hub.received_of("ping").len();
    hub.wait_for_nth("ping", n + 2, T).await;
}
