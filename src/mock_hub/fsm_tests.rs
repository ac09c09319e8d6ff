//! The mock hub's per-agent state machine, scheduler triggers, result fencing and dead
//! letter against the real hub's (4718a58) behaviour, driven by raw clients.

use super::tests::{identified_as, recv, send, Client, T};
use super::*;

fn two_agents(acceptance_timeout: Duration) -> MockHubOptions {
    MockHubOptions {
        agents: vec![
            ("agent-a".into(), "token-a".into()),
            ("agent-b".into(), "token-b".into()),
        ],
        acceptance_timeout,
        ..MockHubOptions::default()
    }
}

async fn hub(acceptance_timeout: Duration) -> MockHub {
    MockHub::start(two_agents(acceptance_timeout))
        .await
        .unwrap()
}

async fn ask(c: &mut Client, frame: Value) -> Value {
    send(c, frame).await;
    recv(c).await.expect("an answer")
}

/// The next `task_assign`: (task, generation).
async fn assigned(c: &mut Client) -> (String, u64) {
    let f = recv(c).await.expect("a task_assign");
    assert_eq!(f["type"], "task_assign", "{f}");
    (
        f["task_id"].as_str().unwrap().to_string(),
        f["generation"].as_u64().unwrap(),
    )
}

fn fsm_is(hub: &MockHub, agent: &str, state: FsmState, task: Option<&str>) -> bool {
    hub.fsm(agent)
        .is_some_and(|f| f.state == state && f.task_id.as_deref() == task)
}

fn logged(hub: &MockHub, agent: &str, event: &str, task: &str) -> bool {
    hub.hub_log()
        .iter()
        .any(|e| e.agent == agent && e.event == event && e.task_id.as_deref() == Some(task))
}

async fn accept(c: &mut Client, task: &str) {
    let ack = ask(c, json!({"type":"task_accepted","task_id":task})).await;
    assert_eq!(ack["status"], "accepted");
}

fn failed(task: &str, generation: u64) -> Value {
    json!({"type":"task_failed","task_id":task,"generation":generation,"reason":"sidecar_busy"})
}

fn complete(task: &str, generation: u64) -> Value {
    json!({"type":"task_complete","task_id":task,"generation":generation})
}

#[tokio::test]
async fn a_second_connection_identifying_then_closing_reclaims_the_task_the_first_still_runs() {
    let hub = hub(Duration::from_secs(60)).await;
    let mut first = identified_as(&hub, "agent-a", "token-a").await;
    hub.submit(sample_shell_task("t1", "true"));
    assert_eq!(assigned(&mut first).await, ("t1".into(), 1));
    accept(&mut first, "t1").await;
    // A second connection as agent-a: a new machine (watching it) starts `assigned` on t1.
    let second = identified_as(&hub, "agent-a", "token-a").await;
    let conn = hub.fsm("agent-a").unwrap().conn;
    assert!(fsm_is(&hub, "agent-a", FsmState::Assigned, Some("t1")));
    drop(second);
    // Its close makes the hub reclaim t1, while the first connection is still open.
    assert!(
        hub.wait_state(T, |h| h.task("t1").unwrap().state == MockTaskState::Queued)
            .await
    );
    assert_eq!(hub.task("t1").unwrap().generation, 2);
    assert!(logged(&hub, "agent-a", "fsm_task_reclaimed", "t1"));
    assert!(hub.fsm("agent-a").is_none(), "the machine went with {conn}");
    assert_eq!(
        ask(&mut first, json!({"type":"ping"})).await["type"],
        "pong"
    );
    // Another agent gets it at once.
    let mut b = identified_as(&hub, "agent-b", "token-b").await;
    assert_eq!(assigned(&mut b).await, ("t1".into(), 3));
    // The first connection, with no machine, gets no work and its close reclaims nothing.
    drop(first);
    assert!(hub.wait_state(T, |h| !h.agent_connected("agent-a")).await);
    let t1 = hub.task("t1").unwrap();
    assert_eq!(
        (t1.agent.as_str(), t1.generation, t1.state),
        ("agent-b", 3, MockTaskState::Assigned)
    );
}

#[tokio::test]
async fn a_result_ends_whatever_task_the_machine_holds_whatever_id_it_names() {
    let hub = hub(Duration::from_secs(60)).await;
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    hub.submit(sample_shell_task("t1", "true"));
    assert_eq!(assigned(&mut a).await, ("t1".into(), 1));
    accept(&mut a, "t1").await;
    // A second assignment while it works: the machine ignores it and keeps t1.
    hub.assign_to("agent-a", sample_shell_task("t2", "true"));
    assert_eq!(assigned(&mut a).await.0, "t2");
    assert!(fsm_is(&hub, "agent-a", FsmState::Working, Some("t1")));
    assert!(logged(&hub, "agent-a", "fsm_invalid_transition", "t2"));
    // Refusing t2 ends t1 in the hub's eyes: the machine goes idle, t1 still assigned.
    assert_eq!(ask(&mut a, failed("t2", 1)).await["status"], "retried");
    assert!(fsm_is(&hub, "agent-a", FsmState::Idle, None));
    assert!(logged(&hub, "agent-a", "fsm_task_failed", "t1"));
    let ended = hub.hub_log().pop().unwrap();
    assert_eq!(
        (ended.event, ended.task_id, ended.cause),
        ("fsm_task_failed", Some("t1".into()), Some("t2".into()))
    );
    assert_eq!(hub.task("t1").unwrap().state, MockTaskState::Accepted);
    // `task_complete` likewise: a third assignment, accepted, then a result for t2's
    // successor id ends whatever is held.
    hub.assign_to("agent-a", sample_shell_task("t3", "true"));
    assert_eq!(assigned(&mut a).await.0, "t3");
    accept(&mut a, "t3").await;
    hub.assign_to("agent-a", sample_shell_task("t4", "true"));
    assert_eq!(assigned(&mut a).await.0, "t4");
    assert_eq!(ask(&mut a, complete("t4", 1)).await["status"], "complete");
    assert!(fsm_is(&hub, "agent-a", FsmState::Idle, None));
    assert!(logged(&hub, "agent-a", "fsm_task_completed", "t3"));
    assert_eq!(hub.task("t3").unwrap().state, MockTaskState::Accepted);
}

#[tokio::test]
async fn the_double_assignment_gives_one_agent_two_tasks_and_its_machine_holds_the_first() {
    let hub = hub(Duration::from_secs(60)).await;
    hub.submit(sample_shell_task("t1", "true"));
    hub.submit(sample_shell_task("t2", "true"));
    hub.race_next_assignment("agent-a");
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    assert_eq!(assigned(&mut a).await, ("t1".into(), 1));
    assert_eq!(assigned(&mut a).await, ("t2".into(), 1));
    assert!(fsm_is(&hub, "agent-a", FsmState::Assigned, Some("t1")));
    assert!(logged(&hub, "agent-a", "fsm_invalid_transition", "t2"));
    for t in ["t1", "t2"] {
        let t = hub.task(t).unwrap();
        assert_eq!(
            (t.agent.as_str(), t.state),
            ("agent-a", MockTaskState::Assigned)
        );
    }
    // A disconnect reclaims only the task the machine holds; t2 stays assigned to the agent
    // that is gone (until its next machine picks it up, or the hub's 10-minute sweep).
    drop(a);
    assert!(
        hub.wait_state(T, |h| h.task("t1").unwrap().state == MockTaskState::Queued)
            .await
    );
    let t2 = hub.task("t2").unwrap();
    assert_eq!((t2.generation, t2.state), (1, MockTaskState::Assigned));
}

#[tokio::test]
async fn refusing_duplicates_leaves_the_agent_stuck_in_assigned_until_the_acceptance_timeout() {
    let hub = hub(Duration::from_millis(400)).await;
    for t in ["t1", "t2", "t3"] {
        hub.submit(sample_shell_task(t, "true"));
    }
    hub.race_next_assignment("agent-a");
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    assert_eq!(assigned(&mut a).await, ("t1".into(), 1));
    assert_eq!(assigned(&mut a).await, ("t2".into(), 1));
    accept(&mut a, "t1").await;
    // The busy refusal of t2 idles the machine; the scheduler gives t2 straight back.
    assert_eq!(ask(&mut a, failed("t2", 1)).await["status"], "retried");
    assert_eq!(assigned(&mut a).await, ("t2".into(), 3));
    assert!(fsm_is(&hub, "agent-a", FsmState::Assigned, Some("t2")));
    // Refused again: from `assigned` the cast is ignored; t2 and t3 wait, the agent holds
    // nothing the hub would give it more work past.
    assert_eq!(ask(&mut a, failed("t2", 3)).await["status"], "retried");
    assert!(logged(&hub, "agent-a", "fsm_unexpected_event", "t2"));
    // t1 ends: the hub takes the result, the machine (not `working`) does not move.
    assert_eq!(ask(&mut a, complete("t1", 1)).await["status"], "complete");
    assert!(fsm_is(&hub, "agent-a", FsmState::Assigned, Some("t2")));
    assert_eq!(hub.task("t2").unwrap().state, MockTaskState::Queued);
    // The timer: a reclaim that fails (t2 is queued), then idle and `unresponsive` with no
    // scheduling trigger, so the queue waits with the agent idle.
    hub.wait_hub_event(
        |e| e.event == "fsm_reclaim_failed" && e.task_id.as_deref() == Some("t2"),
        T,
    )
    .await
    .expect("fsm_reclaim_failed");
    assert!(logged(&hub, "agent-a", "fsm_acceptance_timeout", "t2"));
    let fsm = hub.fsm("agent-a").unwrap();
    assert_eq!((fsm.state, fsm.unresponsive), (FsmState::Idle, true));
    for t in ["t2", "t3"] {
        assert_eq!(hub.task(t).unwrap().state, MockTaskState::Queued, "{t}");
    }
    // The next trigger (any submission) gets the queue moving again.
    hub.submit(sample_shell_task("t4", "true"));
    assert_eq!(assigned(&mut a).await.0, "t2");
}

#[tokio::test]
async fn identifying_again_re_creates_the_machine_from_the_task_table() {
    let hub = hub(Duration::from_secs(60)).await;
    hub.submit(sample_shell_task("t1", "true"));
    hub.submit(sample_shell_task("t2", "true"));
    hub.race_next_assignment("agent-b");
    let mut b = identified_as(&hub, "agent-b", "token-b").await;
    assert_eq!(assigned(&mut b).await.0, "t1");
    assert_eq!(assigned(&mut b).await.0, "t2");
    accept(&mut b, "t1").await;
    // agent-a takes the refused t2, so nothing else is queued for b.
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    assert_eq!(ask(&mut b, failed("t2", 1)).await["status"], "retried");
    assert_eq!(assigned(&mut a).await, ("t2".into(), 3));
    // b's machine believes t1 ended while b runs it.
    assert!(fsm_is(&hub, "agent-b", FsmState::Idle, None));
    // Identify again, on the same socket: the machine is rebuilt from the table, which shows
    // t1 assigned to b: `assigned` on t1, timer armed; `task_accepted` makes it `working`.
    let again = ask(
        &mut b,
        json!({"type":"identify","agent_id":"agent-b","token":"token-b"}),
    )
    .await;
    assert_eq!(again["type"], "identified");
    assert!(fsm_is(&hub, "agent-b", FsmState::Assigned, Some("t1")));
    assert!(logged(&hub, "agent-b", "fsm_existing_assignment", "t1"));
    accept(&mut b, "t1").await;
    assert!(fsm_is(&hub, "agent-b", FsmState::Working, Some("t1")));
    assert_eq!(ask(&mut b, complete("t1", 1)).await["status"], "complete");
    assert!(fsm_is(&hub, "agent-b", FsmState::Idle, None));
    // With nothing assigned to it, a machine starts idle.
    let again = ask(
        &mut b,
        json!({"type":"identify","agent_id":"agent-b","token":"token-b"}),
    )
    .await;
    assert_eq!(again["type"], "identified");
    assert!(fsm_is(&hub, "agent-b", FsmState::Idle, None));
}

#[tokio::test]
async fn a_result_from_another_agent_counts_when_its_generation_is_right() {
    let hub = hub(Duration::from_secs(60)).await;
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    hub.submit(sample_shell_task("t1", "true"));
    assert_eq!(assigned(&mut a).await, ("t1".into(), 1));
    accept(&mut a, "t1").await;
    let mut b = identified_as(&hub, "agent-b", "token-b").await;
    let stale = ask(&mut b, complete("t1", 2)).await;
    assert_eq!(stale["error"], "task_complete_failed: stale_generation");
    assert_eq!(ask(&mut b, complete("t1", 1)).await["status"], "complete");
    assert_eq!(hub.task("t1").unwrap().state, MockTaskState::Complete);
    // The cast goes to the sender's machine (idle: ignored); a's stays `working` on t1.
    assert!(hub
        .hub_log()
        .iter()
        .any(|e| e.agent == "agent-b" && e.event == "fsm_unexpected_event"));
    assert!(fsm_is(&hub, "agent-a", FsmState::Working, Some("t1")));
}

#[tokio::test]
async fn every_task_failed_counts_and_the_last_of_max_retries_dead_letters_the_task() {
    let hub = hub(Duration::from_secs(60)).await;
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    let mut body = sample_shell_task("t1", "false");
    body["max_retries"] = json!(2);
    hub.submit(body);
    let f = recv(&mut a).await.unwrap();
    assert!(
        f.get("max_retries").is_none(),
        "not a field of task_assign: {f}"
    );
    accept(&mut a, "t1").await;
    assert_eq!(ask(&mut a, failed("t1", 1)).await["status"], "retried");
    assert_eq!(assigned(&mut a).await, ("t1".into(), 3));
    accept(&mut a, "t1").await;
    assert_eq!(ask(&mut a, failed("t1", 3)).await["status"], "dead_letter");
    let t1 = hub.task("t1").unwrap();
    assert_eq!((t1.state, t1.retries), (MockTaskState::DeadLetter, 2));
    assert!(logged(&hub, "agent-a", "task_dead_letter", "t1"));
    // Out of the table: results and recovery for it are `not_found` answers.
    let late = ask(&mut a, complete("t1", 3)).await;
    assert_eq!(late["error"], "task_complete_failed: not_found");
    let rec = ask(&mut a, json!({"type":"task_recovering","task_id":"t1"})).await;
    assert_eq!(rec["type"], "task_reassign");
    assert!(fsm_is(&hub, "agent-a", FsmState::Idle, None));
    // The default budget is the hub's: 3.
    assert_eq!(MockHubOptions::default().max_retries, 3);
}

#[tokio::test]
async fn after_a_hub_restart_a_task_accepted_before_gets_a_fresh_acceptance_timer() {
    let hub = hub(Duration::from_millis(300)).await;
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    hub.submit(sample_shell_task("t1", "true"));
    assert_eq!(assigned(&mut a).await, ("t1".into(), 1));
    accept(&mut a, "t1").await;
    hub.stop().await;
    assert!(hub.fsm("agent-a").is_none());
    hub.restart().await.unwrap();
    let mut a = identified_as(&hub, "agent-a", "token-a").await;
    assert!(fsm_is(&hub, "agent-a", FsmState::Assigned, Some("t1")));
    // Not accepted again: reclaimed, though accepted before the restart, and given out anew.
    assert_eq!(assigned(&mut a).await, ("t1".into(), 3));
    assert!(logged(&hub, "agent-a", "fsm_acceptance_timeout", "t1"));
    assert!(logged(&hub, "agent-a", "fsm_task_reclaimed", "t1"));
}
