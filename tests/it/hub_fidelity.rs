//! The real hub's (4718a58) task and agent behaviour, as the mock hub now models it, met by
//! two real daemons (the binary) over loopback: reclaim on disconnect (also through a second
//! connection of the same agent), the per-agent state machine that ends whatever task it
//! holds, the scheduler's double assignment, the acceptance timer re-armed after a hub
//! restart, results fenced by generation only, and the dead letter (issues 42 and 47).
//!
//! Tasks write a start line and an end line to a shared file outside every workspace, so a
//! test counts how often each task ran to its end, and where. Three tests assert the outcome
//! the sidecar reaches against this hub since its fencing (issue 42); each one's doc says what
//! the sidecar did before it.

use std::path::{Path, PathBuf};

use futures_util::SinkExt;
use hub_sidecar::mock_hub::{sample_shell_task, FsmState, MockHub, MockHubOptions, MockTaskState};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio_tungstenite::tungstenite::Message;

use crate::util::*;

/// Two sidecars (agent-0, agent-1, the real binary) and a hub with limits out of the way.
struct Pair {
    hub: MockHub,
    dirs: [PathBuf; 2],
    configs: [PathBuf; 2],
    bins: [Option<Bin>; 2],
    shared: PathBuf,
    _root: TempDir,
}

const AGENTS: [&str; 2] = ["agent-0", "agent-1"];

impl Pair {
    async fn new(opts: MockHubOptions) -> Pair {
        let hub = MockHub::start(MockHubOptions {
            agents: AGENTS
                .iter()
                .map(|a| (a.to_string(), format!("{a}-token")))
                .collect(),
            normal_capacity: 100_000,
            normal_per_minute: 100_000,
            light_capacity: 100_000,
            light_per_minute: 100_000,
            ..opts
        })
        .await
        .unwrap();
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        std::fs::create_dir_all(&shared).unwrap();
        let dirs = AGENTS.map(|a| root.path().join(a));
        let configs = [0, 1].map(|i| {
            let a = AGENTS[i];
            write_agent_config(&hub, &dirs[i], a, &format!("{a}-token"), "", &shared)
        });
        Pair {
            hub,
            dirs,
            configs,
            bins: [None, None],
            shared,
            _root: root,
        }
    }

    /// Start agent `i` and wait until its state machine exists at the hub.
    async fn up(&mut self, i: usize) {
        self.bins[i] = Some(Bin::start(&self.dirs[i], &self.configs[i], &[]));
        let hub = self.hub.clone();
        assert!(
            wait_until(|| hub.fsm(AGENTS[i]).is_some(), T).await,
            "{} never identified:\n{}",
            AGENTS[i],
            self.logs(i)
        );
    }

    async fn kill(&mut self, i: usize) {
        if let Some(b) = self.bins[i].as_mut() {
            b.kill9().await;
        }
    }

    fn logs(&self, i: usize) -> String {
        self.bins[i].as_ref().map(Bin::logs).unwrap_or_default()
    }

    /// A shell task that writes a start line, sleeps `secs`, writes an end line naming its
    /// workspace, and exits with `code`.
    fn task(&self, id: &str, secs: f64, code: i32) -> Value {
        let (starts, ends) = (self.shared.join("starts"), self.shared.join("ends"));
        sample_shell_task(
            id,
            &format!(
                "echo {id} >> {}; sleep {secs:.2}; echo \"{id} $PWD\" >> {}; exit {code}",
                starts.display(),
                ends.display()
            ),
        )
    }

    fn lines(&self, file: &str, id: &str) -> Vec<String> {
        std::fs::read_to_string(self.shared.join(file))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').next() == Some(id))
            .map(str::to_string)
            .collect()
    }

    /// The agents whose workspaces the `ends` lines of `id` name, in order.
    fn ran_on(&self, id: &str) -> Vec<&'static str> {
        self.lines("ends", id)
            .iter()
            .filter_map(|l| {
                let pwd = l.split_once(' ')?.1;
                (0..2)
                    .find(|i| Path::new(pwd).starts_with(&self.dirs[*i]))
                    .map(|i| AGENTS[i])
            })
            .collect()
    }

    fn state(&self, id: &str) -> Option<MockTaskState> {
        self.hub.task(id).map(|t| t.state)
    }

    async fn complete(&self, ids: &[&str]) -> bool {
        self.hub
            .wait_state(T + T, |h| {
                ids.iter().all(|id| {
                    h.task(id)
                        .is_some_and(|t| t.state == MockTaskState::Complete)
                })
            })
            .await
    }

    /// Every frame of `ty` for task `id` that agent `agent` sent.
    fn sent_by(&self, agent: &str, ty: &str, id: &str) -> Vec<Value> {
        let frames = self.hub.frames();
        let conns: Vec<u64> = frames
            .iter()
            .filter(|r| r.inbound && r.frame["type"] == "identify")
            .filter(|r| r.frame["agent_id"] == agent)
            .map(|r| r.conn)
            .collect();
        frames
            .iter()
            .filter(|r| r.inbound && conns.contains(&r.conn))
            .filter(|r| r.frame["type"] == ty && r.frame["task_id"] == id)
            .map(|r| r.frame.clone())
            .collect()
    }

    fn logged(&self, agent: &str, event: &str) -> Vec<Option<String>> {
        self.hub
            .hub_log()
            .into_iter()
            .filter(|e| e.agent == agent && e.event == event)
            .map(|e| e.task_id)
            .collect()
    }

    async fn finish(mut self) {
        for (bin, agent) in self.bins.iter_mut().zip(AGENTS) {
            if let Some(b) = bin.as_mut() {
                if b.child.try_wait().ok().flatten().is_none() {
                    b.signal("TERM");
                    assert_eq!(b.wait(T).await, Some(0), "{agent} exit code");
                }
            }
        }
        assert_no_violations(&self.hub);
    }
}

/// A sidecar killed mid-task: its state machine's connection closes, the hub reclaims the
/// task (generation 2) and gives it to the other agent (3). The killed agent comes back and
/// asks; told `task_continue` at generation 3 (the hub's recovery check looks only at whether
/// the task is assigned), it must send no result: this hub, like the real one, would take a
/// result at generation 3 from anyone.
#[tokio::test]
async fn a_disconnect_reclaims_the_task_and_the_returning_agent_sends_no_result_the_hub_would_take()
{
    let mut p = Pair::new(MockHubOptions::default()).await;
    p.up(0).await;
    p.hub.submit(p.task("moved", 3.0, 0));
    assert!(wait_until(|| p.lines("starts", "moved").len() == 1, T).await);
    p.up(1).await;
    p.kill(0).await;
    assert!(
        wait_until(|| p.lines("starts", "moved").len() == 2, T).await,
        "agent-1 never started it:\n{}",
        p.logs(1)
    );
    assert_eq!(
        p.logged("agent-0", "fsm_task_reclaimed"),
        [Some("moved".into())]
    );
    let t = p.hub.task("moved").unwrap();
    assert_eq!((t.agent.as_str(), t.generation), ("agent-1", 3));
    p.up(0).await;
    assert!(p.complete(&["moved"]).await, "{}", p.logs(1));
    assert!(
        wait_until(
            || p.sent_by("agent-0", "state_report", "moved").len() == 1,
            T
        )
        .await
    );
    assert_eq!(p.ran_on("moved"), ["agent-1"]);
    for ty in ["task_complete", "task_failed"] {
        assert!(
            p.sent_by("agent-0", ty, "moved").is_empty(),
            "agent-0 sent {ty} for a task agent-1 runs:\n{}",
            p.logs(0)
        );
    }
    assert_eq!(p.sent_by("agent-1", "task_complete", "moved").len(), 1);
    p.finish().await;
}

/// A second connection identifying as a connected agent replaces its state machine; when it
/// closes, the hub reclaims the task the agent still runs on its first connection and gives
/// it out again. The sidecar's link never dropped, so it cannot know: the hub refuses its
/// result, and, with no state machine left, the agent gets no more work on that connection.
#[tokio::test]
async fn a_second_connection_of_a_running_agent_closing_reclaims_its_task() {
    let mut p = Pair::new(MockHubOptions::default()).await;
    p.up(0).await;
    p.hub.submit(p.task("shared", 2.0, 0));
    assert!(wait_until(|| p.lines("starts", "shared").len() == 1, T).await);
    let (mut ws, _) = tokio_tungstenite::connect_async(p.hub.url()).await.unwrap();
    let identify = json!({"type":"identify","agent_id":"agent-0","token":"agent-0-token"});
    ws.send(Message::text(identify.to_string())).await.unwrap();
    assert!(p
        .hub
        .wait_hub_event(|e| e.event == "fsm_existing_assignment", T)
        .await
        .is_some());
    ws.close(None).await.unwrap();
    drop(ws);
    assert!(p
        .hub
        .wait_hub_event(|e| e.event == "fsm_task_reclaimed", T)
        .await
        .is_some());
    assert!(
        p.hub.agent_connected("agent-0"),
        "the first connection stays open"
    );
    p.up(1).await;
    assert!(p.complete(&["shared"]).await);
    let refused = p
        .hub
        .wait_state(T, |h| {
            h.frames().iter().any(|r| {
                !r.inbound
                    && r.frame["error"]
                        .as_str()
                        .is_some_and(|e| e.starts_with("task_complete_failed"))
            })
        })
        .await;
    assert!(
        refused,
        "agent-0's late result was not refused:\n{}",
        p.logs(0)
    );
    let mut ran = p.ran_on("shared");
    ran.sort_unstable();
    assert_eq!(
        ran,
        ["agent-0", "agent-1"],
        "both ran it: nothing a sidecar can see"
    );
    assert!(
        p.hub.fsm("agent-0").is_none(),
        "no machine: no more work for agent-0"
    );
    p.finish().await;
}

/// The scheduler's double assignment (reproduced with the knob): agent-0 gets t1 and t2 in
/// one go. Correct outcome: t1 runs once on agent-0 and the hub's machine for agent-0 never
/// believes t1 ended before t1's own result; t2 runs once; no agent ends stuck. Today the
/// `task_failed` (`sidecar_busy`) for t2 ends t1 in the hub's eyes (`fsm_task_failed` names
/// t1), the hub assigns again, is refused again, and the machine sits in `assigned`.
#[tokio::test]
async fn a_double_assignment_costs_neither_task_and_leaves_the_hubs_view_true() {
    let mut p = Pair::new(MockHubOptions::default()).await;
    p.hub.race_next_assignment("agent-0");
    p.hub.submit(p.task("t1", 2.0, 0));
    p.hub.submit(p.task("t2", 0.2, 0));
    p.up(0).await;
    assert!(wait_until(|| p.hub.task("t2").is_some_and(|t| t.agent == "agent-0"), T).await);
    p.up(1).await;
    assert!(p.complete(&["t1", "t2"]).await, "{:?}", p.hub.hub_log());
    assert_eq!(p.ran_on("t1"), ["agent-0"]);
    assert_eq!(p.ran_on("t2").len(), 1, "t2 ran {:?}", p.ran_on("t2"));
    // No result for one task may end another in the hub's eyes.
    let crossed: Vec<_> = p
        .hub
        .hub_log()
        .into_iter()
        .filter(|e| matches!(e.event, "fsm_task_failed" | "fsm_task_completed"))
        .filter(|e| e.cause != e.task_id)
        .collect();
    assert!(crossed.is_empty(), "{crossed:?}");
    assert!(p.logged("agent-0", "fsm_acceptance_timeout").is_empty());
    for a in AGENTS {
        assert!(
            p.hub
                .wait_state(T, |h| h.fsm(a).is_some_and(|f| f.state == FsmState::Idle))
                .await,
            "{a} stuck: {:?}",
            p.hub.fsm(a)
        );
    }
    p.finish().await;
}

/// A sidecar killed mid-task comes back while the hub has given its task to the other agent
/// and has work queued: its new state machine starts idle, the hub assigns at once, before
/// the sidecar has dropped the task it recovers. Correct outcome: every task runs to its end
/// once and no machine sits in `assigned` until the acceptance timer. Today the sidecar
/// refuses (`sidecar_busy`), the machine, `assigned`, ignores the refusal, and its timer
/// later reclaims the task from the other agent, which is running it by then.
#[tokio::test]
async fn an_agent_back_from_a_crash_while_recovering_is_not_left_stuck_by_its_refusal() {
    let opts = MockHubOptions {
        acceptance_timeout: std::time::Duration::from_secs(5),
        ..MockHubOptions::default()
    };
    let mut p = Pair::new(opts).await;
    p.up(0).await;
    p.hub.submit(p.task("first", 4.0, 0));
    assert!(wait_until(|| p.lines("starts", "first").len() == 1, T).await);
    p.up(1).await;
    p.kill(0).await;
    assert!(wait_until(|| p.lines("starts", "first").len() == 2, T).await);
    p.hub.submit(p.task("queued", 6.0, 0));
    p.up(0).await;
    assert!(
        p.complete(&["first", "queued"]).await,
        "{:?}",
        p.hub.hub_log()
    );
    // One more acceptance period: a stuck machine's timer would have fired by then.
    let pings = p.hub.received_of("ping").len();
    p.hub.wait_for_nth("ping", pings + 12, T).await;
    assert_eq!(p.ran_on("first"), ["agent-1"]);
    assert_eq!(
        p.ran_on("queued").len(),
        1,
        "queued ran on {:?}",
        p.ran_on("queued")
    );
    assert!(
        p.logged("agent-0", "fsm_acceptance_timeout").is_empty(),
        "{:?}",
        p.hub.hub_log()
    );
    p.finish().await;
}

/// Each `task_failed` the hub takes counts against `max_retries`, `sidecar_busy` included:
/// a duplicate assignment of a task with a budget of one, refused, is dead-lettered and never
/// runs. Correct outcome: it runs once. Today the refusal dead-letters it.
#[tokio::test]
async fn a_refused_duplicate_is_not_dead_lettered() {
    let mut p = Pair::new(MockHubOptions::default()).await;
    p.hub.race_next_assignment("agent-0");
    p.hub.submit(p.task("long", 2.0, 0));
    let mut dup = p.task("dup", 0.2, 0);
    dup["max_retries"] = json!(1);
    p.hub.submit(dup);
    p.up(0).await;
    p.up(1).await;
    assert!(
        p.complete(&["long", "dup"]).await,
        "dup: {:?}; {:?}",
        p.state("dup"),
        p.hub.hub_log()
    );
    assert_eq!(p.ran_on("dup").len(), 1);
    assert_eq!(p.ran_on("long"), ["agent-0"]);
    p.finish().await;
}

/// A task that really fails, with a budget of two: it runs twice (on whichever agents), the
/// second failure dead-letters it, and the hub never gives it out again.
#[tokio::test]
async fn a_task_failing_max_retries_times_is_dead_lettered_and_never_given_out_again() {
    let mut p = Pair::new(MockHubOptions::default()).await;
    p.up(0).await;
    p.up(1).await;
    let mut t = p.task("doomed", 0.1, 3);
    t["max_retries"] = json!(2);
    p.hub.submit(t);
    assert!(
        p.hub
            .wait_state(T + T, |h| h.task("doomed").unwrap().state
                == MockTaskState::DeadLetter)
            .await,
        "{:?}",
        p.hub.task("doomed")
    );
    let acks: Vec<String> = p
        .hub
        .frames()
        .iter()
        .filter(|r| !r.inbound && r.frame["type"] == "task_ack" && r.frame["task_id"] == "doomed")
        .filter_map(|r| r.frame["status"].as_str().map(str::to_string))
        .filter(|s| s != "accepted")
        .collect();
    assert_eq!(acks, ["retried", "dead_letter"]);
    assert_eq!(p.ran_on("doomed").len(), 2);
    // Later work still flows, and the dead task is not in it.
    p.hub.submit(p.task("after", 0.1, 0));
    assert!(p.complete(&["after"]).await);
    let assigns = p
        .hub
        .frames()
        .iter()
        .filter(|r| !r.inbound && r.frame["type"] == "task_assign")
        .filter(|r| r.frame["task_id"] == "doomed")
        .count();
    assert_eq!(assigns, 2);
    p.finish().await;
}

/// A hub killed outright keeps its table; its new state machine for the agent starts
/// `assigned` on the task the agent accepted long ago, with a fresh acceptance timer. The
/// sidecar, still running it, must accept it again in time, or the hub reclaims it and the
/// other agent runs it too.
#[tokio::test]
async fn after_a_hub_restart_the_running_task_is_accepted_again_before_the_timer_reclaims_it() {
    let opts = MockHubOptions {
        acceptance_timeout: std::time::Duration::from_secs(4),
        ..MockHubOptions::default()
    };
    let mut p = Pair::new(opts).await;
    p.up(0).await;
    p.hub.submit(p.task("kept", 6.0, 0));
    assert!(wait_until(|| p.lines("starts", "kept").len() == 1, T).await);
    p.up(1).await;
    p.hub.stop().await;
    p.hub.restart().await.unwrap();
    assert!(p
        .hub
        .wait_hub_event(
            |e| e.agent == "agent-0" && e.event == "fsm_existing_assignment",
            T
        )
        .await
        .is_some());
    assert!(
        p.hub
            .wait_state(T, |h| h
                .fsm("agent-0")
                .is_some_and(|f| f.state == FsmState::Working))
            .await,
        "agent-0 never accepted its task again: {:?}\n{}",
        p.hub.hub_log(),
        p.logs(0)
    );
    assert!(p.complete(&["kept"]).await);
    assert_eq!(p.ran_on("kept"), ["agent-0"]);
    assert!(p.logged("agent-0", "fsm_acceptance_timeout").is_empty());
    assert!(
        p.hub
            .wait_state(T, |h| h
                .fsm("agent-0")
                .is_some_and(|f| f.state == FsmState::Idle))
            .await
    );
    p.finish().await;
}
