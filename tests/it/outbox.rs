//! Result delivery at scale: the outbox sends the newest result first, an unanswered frame
//! does not block the others, the backlog is bounded and old entries expire. Each test
//! seeds the on-disk state the way a previous daemon life (or a long hub outage) leaves it.

use std::path::Path;

use hub_sidecar::hub::proto::Outbound;
use hub_sidecar::mock_hub::{sample_shell_task, MockHub, MockHubOptions};
use hub_sidecar::state::{read_state, OutboxEntry, PersistedState, StateStore, STATE_VERSION};
use hub_sidecar::util::now_ms;

use crate::util::*;

async fn hub() -> MockHub {
    MockHub::start(MockHubOptions::default()).await.unwrap()
}

/// A result left in the outbox by an earlier run, `age_ms` old.
fn old_result(task_id: &str, age_ms: i64) -> OutboxEntry {
    OutboxEntry {
        task_id: task_id.into(),
        frame: Outbound::task_failed(task_id, 1, "left over from an earlier run"),
        created_at: now_ms() - age_ms,
    }
}

async fn seed(dir: &Path, outbox: Vec<OutboxEntry>) {
    StateStore::new(dir.join("queue.json"))
        .save(&PersistedState {
            version: STATE_VERSION,
            active: None,
            outbox,
        })
        .await
        .unwrap();
}

fn outbox_ids(dir: &Path) -> Vec<String> {
    read_state(&dir.join("queue.json"))
        .map(|s| s.outbox.into_iter().map(|e| e.task_id).collect())
        .unwrap_or_default()
}

fn sent(hub: &MockHub, task_id: &str) -> usize {
    hub.received()
        .iter()
        .filter(|f| f["task_id"] == task_id && f["type"] == "task_failed")
        .count()
}

/// `type:task_id` of the last frames the hub received, for failure messages.
fn summary(hub: &MockHub) -> String {
    let got = hub.received();
    let tail: Vec<String> = got
        .iter()
        .rev()
        .take(12)
        .map(|f| format!("{}:{}", f["type"], f["task_id"]))
        .collect();
    format!("{} frames, the last: {tail:?}", got.len())
}

/// Before: the outbox head was re-sent once a second for as long as the hub ignored it, and
/// nothing behind it was ever sent. Here the ignored result is the newest (sent first), so
/// only its waiting after a miss lets the older one and a fresh one through.
#[tokio::test]
async fn a_result_the_hub_never_answers_does_not_hold_back_the_others() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    seed(
        dir.path(),
        vec![old_result("older", 2000), old_result("stuck", 1000)],
    )
    .await;
    hub.set_ignore_terminal("stuck");
    let d = spawn(cfg(&hub, dir.path()));
    // The hub does not know "older": it refuses it for good, which takes it out.
    assert!(
        wait_until(|| outbox_ids(dir.path()) == ["stuck"], T).await,
        "older result held back; the hub got {}",
        summary(&hub)
    );
    assert_eq!(sent(&hub, "older"), 1);
    hub.assign(sample_shell_task("fresh", "echo fresh"));
    assert!(
        wait_until(|| hub.acked_terminal("fresh") == 1, T).await,
        "fresh result held back; the hub got {}",
        summary(&hub)
    );
    // The acknowledged result leaves the outbox once the daemon has handled the ack (a
    // durable write after the hub's frame); the unanswered one stays.
    assert!(
        wait_until(|| outbox_ids(dir.path()) == ["stuck"], T).await,
        "the unanswered result must stay on disk for a later try, the acknowledged one go: {:?}",
        outbox_ids(dir.path())
    );
    assert!(
        sent(&hub, "stuck") < 10,
        "an unanswered result is re-sent without pause"
    );
    d.stop().await;
    assert_no_violations(&hub);
}

#[tokio::test]
async fn past_outbox_max_entries_the_oldest_results_are_dropped_and_the_log_says_what_to_do() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    seed(
        dir.path(),
        (1..=4)
            .map(|i| old_result(&format!("o{i}"), 1000 - i))
            .collect(),
    )
    .await;
    let config = write_config(&hub, dir.path(), "test-token", "outbox_max_entries = 2\n");
    let mut bin = Bin::start(dir.path(), &config, &[]);
    // The hub does not know these tasks: it refuses each for good, which empties the outbox.
    assert!(
        wait_until(|| sent(&hub, "o3") == 1 && sent(&hub, "o4") == 1, T).await,
        "{}",
        bin.logs()
    );
    assert!(wait_until(|| outbox_ids(dir.path()).is_empty(), T).await);
    assert_eq!(
        (sent(&hub, "o1"), sent(&hub, "o2")),
        (0, 0),
        "dropped results sent"
    );
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    let logs = bin.logs();
    for id in ["o1", "o2"] {
        assert!(
            logs.lines()
                .any(|l| l.contains("outbox full") && l.contains(id)),
            "no log line for dropping {id}:\n{logs}"
        );
    }
    assert!(logs.contains("raise outbox_max_entries"), "{logs}");
}

#[tokio::test]
async fn a_result_older_than_outbox_expiry_secs_is_dropped_unsent_and_logged() {
    let hub = hub().await;
    let dir = tempfile::tempdir().unwrap();
    seed(
        dir.path(),
        vec![
            old_result("ancient", 2 * 3600 * 1000),
            old_result("recent", 1000),
        ],
    )
    .await;
    let config = write_config(
        &hub,
        dir.path(),
        "test-token",
        "outbox_expiry_secs = 3600\n",
    );
    let mut bin = Bin::start(dir.path(), &config, &[]);
    assert!(
        wait_until(|| sent(&hub, "recent") == 1, T).await,
        "{}",
        bin.logs()
    );
    assert!(wait_until(|| outbox_ids(dir.path()).is_empty(), T).await);
    assert_eq!(sent(&hub, "ancient"), 0, "an expired result was sent");
    bin.signal("TERM");
    assert_eq!(bin.wait(T).await, Some(0));
    let logs = bin.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("expired") && l.contains("ancient")),
        "{logs}"
    );
}
