//! The hub's scheduler, for tasks handed in with [`MockHub::submit`]: a queued task goes to
//! an idle agent (one holding no task in flight) at generation + 1, as the hub's `Scheduler`
//! and `TaskQueue.assign_task` do; an assignment not accepted within
//! [`MockHubOptions::acceptance_timeout`] while its agent is connected is reclaimed
//! (generation + 1, queued again), as the AgentFSM's acceptance timer does. The loop runs
//! while the hub runs; it wakes on every inbound frame, every agent coming or going, every
//! submission, and at the next acceptance deadline.

use super::*;

impl Inner {
    /// The scheduler of one run of the hub (until [`MockHub::stop`] or the last handle).
    pub(super) fn launch_scheduler(self: &Arc<Self>, run: CancellationToken) {
        let inner = Arc::clone(self);
        self.tracker.spawn(async move {
            loop {
                let next = inner.schedule_once();
                let wake = inner.schedule.notified();
                tokio::select! {
                    _ = run.cancelled() => break,
                    _ = wake => {}
                    _ = sleep_until_std(next) => {}
                }
            }
        });
    }

    /// Reclaim what was not accepted in time, then assign queued submitted tasks to idle
    /// agents. Returns the next acceptance deadline.
    fn schedule_once(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.submitted.is_empty() {
            return None;
        }
        let connected: Vec<String> = {
            let mut agents: Vec<String> =
                st.conns.values().filter_map(|c| c.agent.clone()).collect();
            agents.sort();
            agents.dedup();
            agents
        };
        for (task_id, _) in &st.submitted {
            let Some(t) = st.tasks.get_mut(task_id) else {
                continue;
            };
            let overdue = st.accept_by.get(task_id).is_some_and(|by| *by <= now);
            if t.state == MockTaskState::Assigned && overdue && connected.contains(&t.agent) {
                tracing::debug!(task_id = %task_id, agent = %t.agent, "mock hub: acceptance timeout, reclaiming");
                t.generation += 1;
                t.state = MockTaskState::Queued;
                st.accept_by.remove(task_id);
            }
        }
        let mut idle: Vec<&String> = connected
            .iter()
            .filter(|a| !st.tasks.values().any(|t| t.in_flight() && &t.agent == *a))
            .collect();
        let mut pushes = Vec::new();
        for (task_id, body) in &st.submitted {
            if idle.is_empty() {
                break;
            }
            let Some(t) = st.tasks.get_mut(task_id) else {
                continue;
            };
            if t.state != MockTaskState::Queued {
                continue;
            }
            let agent = idle.remove(0).clone();
            t.generation += 1;
            t.agent = agent.clone();
            t.state = MockTaskState::Assigned;
            st.accept_by
                .insert(task_id.clone(), now + self.opts.acceptance_timeout);
            let mut frame = body.clone();
            if let Value::Object(m) = &mut frame {
                m.insert("type".into(), json!("task_assign"));
                m.insert("task_id".into(), json!(task_id));
                m.insert("generation".into(), json!(t.generation));
                m.insert("assigned_at".into(), json!(now_ms()));
            }
            pushes.push((agent, frame));
        }
        for (agent, frame) in &pushes {
            st.push_to(agent, frame);
        }
        let tasks = &st.tasks;
        st.accept_by.retain(|id, _| {
            tasks
                .get(id)
                .is_some_and(|t| t.state == MockTaskState::Assigned)
        });
        // A deadline counts only while its agent is connected (it starts again at identify).
        st.accept_by
            .iter()
            .filter(|(id, _)| tasks.get(*id).is_some_and(|t| connected.contains(&t.agent)))
            .map(|(_, by)| *by)
            .min()
    }

    /// The agent identified: the acceptance timers of what the hub holds for it start again,
    /// as a new AgentFSM starts in `assigned` with a fresh timer.
    pub(super) fn restart_acceptance_timers(&self, agent: &str) {
        let now = Instant::now();
        let mut guard = self.lock();
        let st = &mut *guard;
        for (id, by) in st.accept_by.iter_mut() {
            if st.tasks.get(id).is_some_and(|t| t.agent == agent) {
                *by = now + self.opts.acceptance_timeout;
            }
        }
        drop(guard);
        self.schedule.notify_one();
    }
}

async fn sleep_until_std(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{identified_as, recv, send, Client};
    use super::*;

    fn fleet(acceptance_timeout: Duration) -> MockHubOptions {
        MockHubOptions {
            agents: vec![
                ("agent-a".into(), "token-a".into()),
                ("agent-b".into(), "token-b".into()),
            ],
            acceptance_timeout,
            ..MockHubOptions::default()
        }
    }

    async fn ask(c: &mut Client, frame: Value) -> Value {
        send(c, frame).await;
        recv(c).await.expect("an answer")
    }

    #[tokio::test]
    async fn a_task_reclaimed_from_a_dead_agent_goes_to_the_next_and_recovery_still_says_continue()
    {
        let hub = MockHub::start(fleet(Duration::from_secs(60)))
            .await
            .unwrap();
        let mut a = identified_as(&hub, "agent-a", "token-a").await;
        hub.submit(sample_shell_task("t1", "true"));
        let first = recv(&mut a).await.unwrap();
        assert_eq!(
            (first["type"].as_str(), first["generation"].as_u64()),
            (Some("task_assign"), Some(1))
        );
        let ack = ask(&mut a, json!({"type":"task_accepted","task_id":"t1"})).await;
        assert_eq!(ack["status"], "accepted");
        let mut b = identified_as(&hub, "agent-b", "token-b").await;
        // A dies: the hub reclaims the task (2) and gives it to B, idle (3).
        drop(a);
        let second = recv(&mut b).await.unwrap();
        assert_eq!(
            (second["task_id"].as_str(), second["generation"].as_u64()),
            (Some("t1"), Some(3))
        );
        // A comes back and asks about the task it had: the recovery check looks only at
        // whether the task is assigned, so A hears `continue` with B's generation.
        let mut a = identified_as(&hub, "agent-a", "token-a").await;
        let answer = ask(
            &mut a,
            json!({"type":"task_recovering","task_id":"t1","generation":1}),
        )
        .await;
        assert_eq!(
            answer,
            json!({"type":"task_continue","task_id":"t1","generation":3})
        );
        // The reconciliation of a state report knows whose it is, and at which generation.
        let report =
            |g: u64| json!({"type":"state_report","task_id":"t1","status":"x","generation":g});
        assert_eq!(ask(&mut a, report(3)).await["action"], "abort");
        assert_eq!(ask(&mut b, report(1)).await["action"], "abort");
        assert_eq!(ask(&mut b, report(3)).await["action"], "continue");
        let t = hub.task("t1").unwrap();
        assert_eq!(
            (t.agent.as_str(), t.generation, t.state),
            ("agent-b", 3, MockTaskState::Assigned)
        );
    }

    #[tokio::test]
    async fn an_assignment_not_accepted_in_time_is_reclaimed_and_given_out_again() {
        let hub = MockHub::start(fleet(Duration::from_millis(300)))
            .await
            .unwrap();
        let mut a = identified_as(&hub, "agent-a", "token-a").await;
        hub.submit(sample_shell_task("t1", "true"));
        let t0 = Instant::now();
        assert_eq!(recv(&mut a).await.unwrap()["generation"], 1);
        // Not accepted: reclaimed (2) after the timeout, and A, idle again, gets it (3).
        let again = recv(&mut a).await.unwrap();
        assert_eq!(again["generation"], 3);
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        let ack = ask(&mut a, json!({"type":"task_accepted","task_id":"t1"})).await;
        assert_eq!(ack["status"], "accepted");
        let done = ask(
            &mut a,
            json!({"type":"task_complete","task_id":"t1","generation":3}),
        )
        .await;
        assert_eq!(done["status"], "complete");
        assert_eq!(hub.task("t1").unwrap().state, MockTaskState::Complete);
    }
}
