//! The test-facing [`MockHub`] API: start/stop/restart, pushes, knobs that script the hub's
//! answers, and the recorded frames, violations and task table with waits on them.

use super::*;

impl MockHub {
    /// Starts a hub on `127.0.0.1:opts.port` (0: a free port).
    pub async fn start(opts: MockHubOptions) -> std::io::Result<MockHub> {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], opts.port)))?;
        let addr = listener.local_addr()?;
        let root = CancellationToken::new();
        let inner = Arc::new(Inner {
            opts,
            addr,
            state: Mutex::new(State::default()),
            inbound: Notify::new(),
            schedule: Notify::new(),
            running: AtomicBool::new(false),
            run: Mutex::new(root.child_token()),
            root: root.clone(),
            tracker: TaskTracker::new(),
            next_conn: AtomicU64::new(1),
            port_hold: Mutex::new(None),
            connections_total: AtomicU64::new(0),
            stall: watch::Sender::new(false),
        });
        inner.launch(listener);
        Ok(MockHub {
            inner,
            _guard: Arc::new(root.drop_guard()),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `ws://127.0.0.1:PORT/ws`.
    pub fn url(&self) -> String {
        format!("ws://{}/ws", self.inner.addr)
    }

    /// Simulates a hub crash: closes the listener and drops every socket without a close
    /// frame. The task table, limiter buckets and records are kept (the hub's table is on
    /// disk), so nothing is re-queued.
    pub async fn stop(&self) {
        self.inner.running.store(false, Ordering::SeqCst);
        let run = self.inner.run_token();
        run.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        self.inner.tracker.reopen();
        {
            // The hub's processes die with it: sockets, state machines, registry, pending
            // triggers. Only the table (on disk) survives.
            let mut st = self.inner.lock();
            st.conns.clear();
            st.fsms.clear();
            st.registry.clear();
            st.sched_pending = false;
            st.race.clear();
        }
        let hold = TcpSocket::new_v4().and_then(|sock| {
            sock.set_reuseaddr(true)?;
            sock.bind(self.inner.addr)?;
            Ok(sock)
        });
        *self
            .inner
            .port_hold
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = hold.ok();
    }

    /// Binds the same port again and serves. Retries briefly while the port is still busy.
    /// Like a restarted hub, the limiter starts with full buckets (the real one keeps them in
    /// memory); the task table survives.
    pub async fn restart(&self) -> std::io::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.inner.lock().buckets.clear();
        let mut attempt = 0;
        let listener = loop {
            match bind(self.inner.addr) {
                Ok(l) => break l,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && attempt < 50 => {
                    attempt += 1;
                    // The kernel gives no event for "port freed"; a short retry is the only way.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        };
        // Listening now: the placeholder that kept the port ours can go.
        self.inner
            .port_hold
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        *self.inner.run.lock().unwrap_or_else(|p| p.into_inner()) = self.inner.root.child_token();
        self.inner.launch(listener);
        Ok(())
    }

    /// Whether the listener is up.
    pub fn is_running(&self) -> bool {
        self.inner.running.load(Ordering::SeqCst)
    }

    /// WebSocket connections accepted since start (across restarts).
    pub fn connections_total(&self) -> u64 {
        self.inner.connections_total.load(Ordering::SeqCst)
    }

    /// Whether an identified socket is open now.
    pub fn connected(&self) -> bool {
        self.inner.lock().conns.values().any(|c| c.agent.is_some())
    }

    /// Whether `agent` has an identified socket open now.
    pub fn agent_connected(&self, agent: &str) -> bool {
        self.inner
            .lock()
            .conns
            .values()
            .any(|c| c.agent.as_deref() == Some(agent))
    }

    /// Sends a JSON text frame to every identified socket; `false` if there is none.
    pub fn push(&self, frame: Value) -> bool {
        self.inner.push_identified(|| Outbound::Json(frame.clone()))
    }

    /// Sends raw text (garbage tests).
    pub fn push_text(&self, text: &str) -> bool {
        self.inner
            .push_identified(|| Outbound::Text(text.to_string()))
    }

    /// Sends a binary frame.
    pub fn push_binary(&self, bytes: Vec<u8>) -> bool {
        self.inner
            .push_identified(|| Outbound::Binary(bytes.clone()))
    }

    /// Closes the identified socket(s) with a close frame. The hub counts this as a
    /// disconnect, so the agent's in-flight tasks are re-queued.
    pub fn close_current(&self, code: u16, reason: &str) -> bool {
        self.inner
            .push_identified(|| Outbound::Close(code, reason.to_string()))
    }

    /// Registers `task` in the task table (generation from the value, else the table's, else
    /// 1), fills `type` and `assigned_at`, pushes it and returns the frame sent. The task is
    /// assigned to the identified agent (or the first configured one when none is connected).
    /// To re-assign a re-queued task at its new generation, pass a value without
    /// `generation` (or use [`MockTask::generation`]).
    pub fn assign(&self, task: Value) -> Value {
        let agent = {
            let st = self.inner.lock();
            st.conns
                .values()
                .find_map(|c| c.agent.clone())
                .or_else(|| self.inner.opts.agents.first().map(|a| a.0.clone()))
                .unwrap_or_default()
        };
        self.assign_to(&agent, task)
    }

    /// [`MockHub::assign`] to one agent, as the hub's scheduler would: the table records it
    /// as that agent's, the frame goes to the agent's registered connection (none while it is
    /// not connected: the push is lost, as at a hub whose agent is away), and the socket's
    /// cast reaches the agent's state machine (`idle` → `assigned`, acceptance timer armed;
    /// ignored in any other state). The scheduler never gives such a task out again.
    pub fn assign_to(&self, agent: &str, task: Value) -> Value {
        let mut frame = match task {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let mut st = self.inner.lock();
        let task_id = st.task_id_of(frame.get("task_id"));
        let generation = frame
            .get("generation")
            .and_then(Value::as_u64)
            .or_else(|| st.tasks.get(&task_id).map(|t| t.generation))
            .unwrap_or(1);
        let retries = st.tasks.get(&task_id).map_or(0, |t| t.retries);
        st.tasks.insert(
            task_id.clone(),
            MockTask {
                task_id: task_id.clone(),
                generation,
                agent: agent.to_string(),
                state: MockTaskState::Assigned,
                retries,
            },
        );
        frame.insert("type".into(), json!("task_assign"));
        frame.insert("task_id".into(), json!(task_id));
        frame.insert("generation".into(), json!(generation));
        if matches!(frame.get("assigned_at"), None | Some(Value::Null)) {
            frame.insert("assigned_at".into(), json!(now_ms()));
        }
        let frame = Value::Object(frame);
        if st.push_registered(agent, &frame) {
            st.fsm_assigned(agent, &task_id, self.inner.opts.acceptance_timeout);
        }
        drop(st);
        self.inner.inbound.notify_waiters();
        self.inner.schedule.notify_one();
        frame
    }

    /// Hands `task` (a `task_assign` body, e.g. [`sample_shell_task`]) to the hub's own
    /// scheduler, as the hub's HTTP API does: it is queued at generation 0 and assigned to
    /// an idle agent (one that holds no task in flight), generation + 1 per assignment, like
    /// `TaskQueue.assign_task`; re-queued on a disconnect, a `task_failed` or an acceptance
    /// timeout, and assigned again, until it fails `max_retries` times (a `max_retries`
    /// field in the body, taken out before it is pushed, else the option's). Returns its id.
    pub fn submit(&self, mut task: Value) -> String {
        let mut st = self.inner.lock();
        let task_id = st.task_id_of(task.get("task_id"));
        let max = task
            .as_object_mut()
            .and_then(|m| m.remove("max_retries"))
            .and_then(|v| v.as_u64());
        if let Some(max) = max {
            st.max_retries.insert(task_id.clone(), max as u32);
        }
        st.tasks.insert(
            task_id.clone(),
            MockTask {
                task_id: task_id.clone(),
                generation: 0,
                agent: String::new(),
                state: MockTaskState::Queued,
                retries: 0,
            },
        );
        // `task_submitted` is a scheduling trigger.
        st.sched_pending = true;
        st.submitted.push((task_id.clone(), task));
        drop(st);
        self.inner.schedule.notify_one();
        task_id
    }

    /// The double assignment of the hub's scheduler, on demand: the next task the scheduler
    /// gives `agent` reaches its state machine only after one more scheduling pass, which
    /// (seeing the agent idle still) gives it a second queued task if there is one. The
    /// machine then holds the first; the second cast is logged `fsm_invalid_transition`.
    /// In the real hub this takes two triggers inside the socket's cast latency.
    pub fn race_next_assignment(&self, agent: &str) {
        self.inner.lock().race.insert(agent.to_string());
    }

    /// A snapshot of `agent`'s state machine; `None` while it has none (never identified,
    /// its watched connection closed, or the hub restarted since).
    pub fn fsm(&self, agent: &str) -> Option<AgentFsm> {
        self.inner.lock().fsms.get(agent).map(|f| f.view.clone())
    }

    /// Everything the hub logged about tasks and agents so far, in order.
    pub fn hub_log(&self) -> Vec<HubEvent> {
        self.inner.lock().hub_log.clone()
    }

    /// Waits until the hub logged an event matching `pred` (past ones count).
    pub async fn wait_hub_event(
        &self,
        pred: impl Fn(&HubEvent) -> bool,
        timeout: Duration,
    ) -> Option<HubEvent> {
        self.wait_until(timeout, |st| st.hub_log.iter().find(|e| pred(e)).cloned())
            .await
    }

    /// Waits until `check` holds on the task table and the agents' machines (checked
    /// whenever a frame comes in or the hub logs something).
    pub async fn wait_state(&self, timeout: Duration, check: impl Fn(&MockHub) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.inbound.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if check(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return check(self);
            }
        }
    }

    /// Answers the next identify(s) with close 1008 "cooldown active: retry in Ns" until
    /// `secs` have elapsed since this call.
    pub fn set_cooldown(&self, secs: u64) {
        self.inner.lock().cooldown = Some((Instant::now(), Duration::from_secs(secs)));
    }

    /// Forces the answer to `task_recovering` for `task_id`. Default, as the hub (4718a58)
    /// answers: continue, with the table's generation, if the task is in flight with *any*
    /// agent; else reassign.
    pub fn set_recovery_answer(&self, task_id: &str, a: RecoveryAnswer) {
        self.inner.lock().recovery.insert(task_id.to_string(), a);
    }

    /// Sets the `action` of `state_report_ack` for `task_id`. Default, as the hub reconciles:
    /// `continue` if the task is in flight with the reporting agent at the generation
    /// reported, else `abort`.
    pub fn set_state_report_action(&self, task_id: &str, action: &str) {
        self.inner
            .lock()
            .state_report_actions
            .insert(task_id.to_string(), action.to_string());
    }

    /// Stops (or resumes) reading from sockets, like a stuck hub: frames pile up in TCP
    /// buffers and the idle timeout is suspended.
    pub fn set_stall(&self, stalled: bool) {
        self.inner.stall.send_replace(stalled);
    }

    /// `false`: `task_complete` / `task_failed` are swallowed as if lost (recorded, not
    /// processed, no reply). Default `true`.
    pub fn set_ack_terminal(&self, ack: bool) {
        self.inner.lock().ack_terminal_off = !ack;
    }

    /// Swallow `task_complete` / `task_failed` for this one task (recorded, no reply), as a
    /// hub that never answers one frame; other tasks are answered as usual.
    pub fn set_ignore_terminal(&self, task_id: &str) {
        self.inner
            .lock()
            .ignore_terminal
            .insert(task_id.to_string());
    }

    /// Every frame, both directions, in order.
    pub fn frames(&self) -> Vec<Recorded> {
        self.inner.lock().frames.clone()
    }

    /// Frames the sidecar sent.
    pub fn received(&self) -> Vec<Value> {
        let st = self.inner.lock();
        st.frames
            .iter()
            .filter(|r| r.inbound)
            .map(|r| r.frame.clone())
            .collect()
    }

    /// Frames of type `ty` the sidecar sent.
    pub fn received_of(&self, ty: &str) -> Vec<Value> {
        let st = self.inner.lock();
        st.frames
            .iter()
            .filter(|r| r.inbound && type_of(&r.frame) == Some(ty))
            .map(|r| r.frame.clone())
            .collect()
    }

    /// Frames the hub validator rejected.
    pub fn violations(&self) -> Vec<Violation> {
        self.inner.lock().violations.clone()
    }

    /// `rate_limited` answers sent.
    pub fn rate_limited_count(&self) -> u64 {
        self.inner.lock().rate_limited
    }

    /// How many terminal `task_ack`s (complete/retried/dead_letter/failed) were sent for it.
    pub fn acked_terminal(&self, task_id: &str) -> u32 {
        self.inner
            .lock()
            .acked_terminal
            .get(task_id)
            .copied()
            .unwrap_or(0)
    }

    /// A snapshot of the task table.
    pub fn tasks(&self) -> Vec<MockTask> {
        self.inner.lock().tasks.values().cloned().collect()
    }

    /// One row of the task table.
    pub fn task(&self, task_id: &str) -> Option<MockTask> {
        self.inner.lock().tasks.get(task_id).cloned()
    }

    /// Waits for an inbound frame matching `pred` (already-received frames count).
    pub async fn wait_for(
        &self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<Value> {
        self.wait_until(timeout, |st| {
            st.frames
                .iter()
                .find(|r| r.inbound && pred(&r.frame))
                .map(|r| r.frame.clone())
        })
        .await
    }

    /// Inbound frames after the first `seen`, waiting until there is at least one; empty on
    /// timeout. For displays that follow the conversation as it happens.
    pub async fn wait_inbound_after(&self, seen: usize, timeout: Duration) -> Vec<Value> {
        self.wait_until(timeout, |st| {
            let new: Vec<Value> = st
                .frames
                .iter()
                .filter(|r| r.inbound)
                .skip(seen)
                .map(|r| r.frame.clone())
                .collect();
            (!new.is_empty()).then_some(new)
        })
        .await
        .unwrap_or_default()
    }

    /// First inbound frame of type `ty`.
    pub async fn wait_for_type(&self, ty: &str, timeout: Duration) -> Option<Value> {
        self.wait_for_nth(ty, 1, timeout).await
    }

    /// The `n`-th (1-based) inbound frame of type `ty`.
    pub async fn wait_for_nth(&self, ty: &str, n: usize, timeout: Duration) -> Option<Value> {
        self.wait_until(timeout, |st| {
            st.frames
                .iter()
                .filter(|r| r.inbound && type_of(&r.frame) == Some(ty))
                .nth(n.saturating_sub(1))
                .map(|r| r.frame.clone())
        })
        .await
    }

    async fn wait_until<T>(
        &self,
        timeout: Duration,
        find: impl Fn(&State) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register interest before looking, so a frame arriving in between still wakes us.
            let notified = self.inner.inbound.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(found) = find(&self.inner.lock()) {
                return Some(found);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return find(&self.inner.lock());
            }
        }
    }
}
