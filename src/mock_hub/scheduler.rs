//! The hub's scheduler, for tasks handed in with [`MockHub::submit`], as `Scheduler` (4718a58)
//! runs it: event-driven, it assigns only after a trigger (a task submitted, retried or
//! reclaimed, a task completed, an agent joined or gone idle), and then matches queued tasks,
//! in submission order, to agents whose state machine is `idle`, one task per agent per pass,
//! at generation + 1 (`TaskQueue.assign_task`). The push goes to the agent's registered
//! connection, and the machine learns of it only through the socket's later cast: a second
//! pass before that cast lands sees the agent idle still and gives it a second task (the
//! double assignment; reproduced on demand by [`MockHub::race_next_assignment`]). The loop
//! runs while the hub runs; it also fires the machines' acceptance timers.

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

    /// Fire the acceptance timers that are due, then, after a trigger, assign. Returns the
    /// next acceptance deadline.
    fn schedule_once(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut guard = self.lock();
        let st = &mut *guard;
        let logged = st.hub_log.len();
        st.fsm_fire_timers(now);
        if std::mem::take(&mut st.sched_pending) {
            self.try_schedule_all(st);
        }
        let next = st.fsm_next_deadline();
        let woke = st.hub_log.len() > logged;
        drop(guard);
        if woke {
            self.inbound.notify_waiters();
        }
        next
    }

    /// One `try_schedule_all`: a pass over the queue; when an armed agent got a task, a
    /// second pass before its machine hears of it; then the held casts land, in order.
    fn try_schedule_all(&self, st: &mut State) {
        let timeout = self.opts.acceptance_timeout;
        let mut held: Vec<(String, String)> = Vec::new();
        for pass in 0..2 {
            if pass == 1 && held.is_empty() {
                break;
            }
            let mut idle = st.idle_agents();
            let mut made = Vec::new();
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
                let agent = idle.remove(0);
                t.generation += 1;
                t.agent = agent.clone();
                t.state = MockTaskState::Assigned;
                let mut frame = body.clone();
                if let Value::Object(m) = &mut frame {
                    m.insert("type".into(), json!("task_assign"));
                    m.insert("task_id".into(), json!(task_id));
                    m.insert("generation".into(), json!(t.generation));
                    m.insert("assigned_at".into(), json!(now_ms()));
                }
                made.push((agent, task_id.clone(), frame));
            }
            for (agent, task_id, frame) in made {
                // `scheduler_ws_not_found`: assigned, never pushed, no cast.
                if !st.push_registered(&agent, &frame) {
                    st.log(&agent, "scheduler_ws_not_found", Some(&task_id));
                    continue;
                }
                if held.iter().any(|(a, _)| *a == agent) || st.race.remove(&agent) {
                    held.push((agent, task_id));
                } else {
                    st.fsm_assigned(&agent, &task_id, timeout);
                }
            }
        }
        for (agent, task_id) in held {
            st.fsm_assigned(&agent, &task_id, timeout);
        }
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
