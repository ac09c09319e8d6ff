//! The server side: the accept loop, one task per connection (handshake, read, idle timeout,
//! stop), sending with recording, and the per-connection protocol up to identification.
//! Valid frames from an identified agent go to `Inner::dispatch` in `state`.

use super::*;

impl Inner {
    pub(super) fn launch(self: &Arc<Self>, listener: TcpListener) {
        self.running.store(true, Ordering::SeqCst);
        let run = self.run_token();
        self.launch_scheduler(run.clone());
        let inner = Arc::clone(self);
        self.tracker.spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = run.cancelled() => break,
                    r = listener.accept() => match r {
                        Ok((s, _)) => {
                            // Like the hub (Cowboy/ranch set `nodelay` by default): without
                            // it Nagle holds a small frame back until the peer's delayed ACK,
                            // ~40 ms, and every round trip on loopback measures that instead.
                            let _ = s.set_nodelay(true);
                            s
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "mock hub accept failed");
                            continue;
                        }
                    },
                };
                let conn_inner = Arc::clone(&inner);
                let conn_run = run.clone();
                inner
                    .tracker
                    .spawn(async move { conn_inner.serve(stream, conn_run).await });
            }
        });
    }

    /// One connection: handshake, then read/dispatch until close, idle timeout or stop.
    async fn serve(self: Arc<Self>, stream: TcpStream, run: CancellationToken) {
        let ws = tokio::select! {
            _ = run.cancelled() => return,
            r = tokio_tungstenite::accept_async(stream) => match r {
                Ok(ws) => ws,
                Err(e) => {
                    tracing::debug!(error = %e, "mock hub handshake failed");
                    return;
                }
            },
        };
        let id = self.next_conn.fetch_add(1, Ordering::SeqCst);
        self.connections_total.fetch_add(1, Ordering::SeqCst);
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.lock().conns.insert(id, ConnEntry { tx, agent: None });

        let (mut sink, mut stream) = ws.split();
        let mut conn = Conn {
            id,
            agent: None,
            violations: VecDeque::new(),
        };
        let mut stall = self.stall.subscribe();
        let mut stalled = *stall.borrow_and_update();
        let idle = self.opts.idle_timeout;
        // Far future when disabled; the branch is also guarded.
        let far = Duration::from_secs(86_400 * 365);
        let sleep = tokio::time::sleep(idle.unwrap_or(far));
        tokio::pin!(sleep);

        let stopped = loop {
            let out: Vec<Outbound>;
            let mut end = End::Keep;
            tokio::select! {
                _ = run.cancelled() => break true,
                _ = stall.changed() => {
                    stalled = *stall.borrow_and_update();
                    if !stalled {
                        sleep.as_mut().reset(tokio::time::Instant::now() + idle.unwrap_or(far));
                    }
                    continue;
                }
                _ = &mut sleep, if idle.is_some() && !stalled => {
                    out = vec![Outbound::Close(1002, "idle timeout".into())];
                    end = End::Close;
                }
                o = rx.recv() => match o {
                    Some(o) => {
                        if matches!(o, Outbound::Close(..)) { end = End::Close; }
                        out = vec![o];
                    }
                    // Our entry left the table (stop()): nothing more will come.
                    None => break true,
                },
                m = stream.next(), if !stalled => {
                    sleep.as_mut().reset(tokio::time::Instant::now() + idle.unwrap_or(far));
                    match m {
                        None | Some(Err(_)) => break false,
                        Some(Ok(Message::Close(cf))) => {
                            // Recorded so tests can check the sidecar closes cleanly (1000).
                            let (code, reason) = cf
                                .map(|c| (u16::from(c.code), c.reason.to_string()))
                                .unwrap_or((1005, String::new()));
                            self.record(id, true, json!({"type": "<close>", "code": code, "reason": reason}));
                            // Flush tungstenite's queued close reply: a clean handshake.
                            let _ = sink.flush().await;
                            break false;
                        }
                        Some(Ok(Message::Text(t))) => {
                            let arrived = Instant::now();
                            let (o, e) = self.handle_text(&mut conn, t.as_str(), arrived);
                            out = o;
                            end = e;
                        }
                        Some(Ok(Message::Binary(b))) => {
                            let frame = json!(format!("<binary {} bytes>", b.len()));
                            self.record(id, true, frame.clone());
                            self.violation(id, frame, vec!["binary frame: the hub's socket process crashes".into()]);
                            break false;
                        }
                        // Ping/pong/raw frames: tungstenite answers pings itself.
                        Some(Ok(_)) => continue,
                    }
                }
            }
            let mut failed = false;
            for o in out {
                if self.send(&mut sink, id, o).await.is_err() {
                    failed = true;
                    break;
                }
            }
            if failed {
                break false;
            }
            match end {
                End::Keep => {}
                End::Close => {
                    let _ = sink.flush().await;
                    break false;
                }
                // The real hub crashes here: no close frame, just a dropped TCP stream.
                End::Drop => break false,
            }
        };

        let mut st = self.lock();
        st.conns.remove(&id);
        // The agent's state machine watches the connection that identified: its close makes
        // the hub reclaim the task the machine holds. A crash (stop) keeps its on-disk table
        // as is.
        if !stopped && !self.root.is_cancelled() {
            if let Some(agent) = conn.agent {
                st.fsm_conn_down(&agent, id);
            }
        }
        drop(st);
        self.inbound.notify_waiters();
        self.schedule.notify_one();
    }

    async fn send<S>(&self, sink: &mut S, conn: u64, o: Outbound) -> Result<(), ()>
    where
        S: futures_util::Sink<Message> + Unpin,
    {
        let msg = match o {
            Outbound::Json(v) => {
                let text = v.to_string();
                self.record(conn, false, v);
                Message::text(text)
            }
            Outbound::Text(t) => {
                self.record(conn, false, Value::String(t.clone()));
                Message::text(t)
            }
            Outbound::Binary(b) => {
                self.record(conn, false, json!(format!("<binary {} bytes>", b.len())));
                Message::binary(b)
            }
            Outbound::Close(code, reason) => {
                self.record(
                    conn,
                    false,
                    json!({"type": "<close>", "code": code, "reason": reason}),
                );
                Message::Close(Some(CloseFrame {
                    code: CloseCode::from(code),
                    reason: reason.into(),
                }))
            }
        };
        sink.send(msg).await.map_err(|_| ())
    }

    /// Handles one text frame: returns the frames to send and what to do with the socket.
    ///
    /// The frame is recorded (and waiters woken) only *after* it was handled, so a test that
    /// saw `identify` arrive can push to the now-identified socket, and one that saw
    /// `task_complete` arrive sees the task table already updated.
    fn handle_text(&self, conn: &mut Conn, text: &str, arrived: Instant) -> (Vec<Outbound>, End) {
        let id = conn.id;
        let Ok(frame) = serde_json::from_str::<Value>(text) else {
            let raw = Value::String(text.to_string());
            self.violation(id, raw.clone(), vec!["invalid_json".into()]);
            self.record_at(id, true, raw, arrived);
            return (vec![error("invalid_json")], End::Keep);
        };
        let handled = self.handle_json(conn, frame.clone());
        self.record_at(id, true, frame, arrived);
        handled
    }

    fn handle_json(&self, conn: &mut Conn, frame: Value) -> (Vec<Outbound>, End) {
        let id = conn.id;
        if !frame.is_object() {
            self.violation(
                id,
                frame,
                vec!["message: not a JSON object (the hub's socket process crashes)".into()],
            );
            return (vec![], End::Drop);
        }
        let ty = match schema::validate(&frame) {
            Ok(ty) => ty.to_string(),
            Err(errs) => {
                self.violation(
                    id,
                    frame.clone(),
                    errs.iter().map(|e| e.to_string()).collect(),
                );
                let reply = Outbound::Json(json!({
                    "type": "error",
                    "error": "validation_failed",
                    "message_type": frame.get("type"),
                    "errors": errs.iter().map(schema::FieldError::to_json).collect::<Vec<_>>(),
                }));
                let now = Instant::now();
                conn.violations.push_back(now);
                while conn
                    .violations
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > VIOLATION_WINDOW)
                {
                    conn.violations.pop_front();
                }
                if conn.violations.len() >= MAX_VIOLATIONS {
                    return (
                        vec![
                            reply,
                            Outbound::Close(1008, "too many validation errors".into()),
                        ],
                        End::Close,
                    );
                }
                return (vec![reply], End::Keep);
            }
        };

        let Some(agent) = conn.agent.clone() else {
            // Like the hub: no limiter before identify (there is no agent to key it on).
            if ty == "identify" {
                return self.identify(conn, &frame);
            }
            return (vec![error("not_identified")], End::Keep);
        };

        let mut out = Vec::new();
        if self.opts.rate_limit {
            match self.check_rate(&agent, Tier::of(&ty)) {
                Verdict::Allow => {}
                Verdict::Warn {
                    remaining,
                    capacity,
                } => out.push(Outbound::Json(json!({
                    "type": "rate_limit_warning", "tier": Tier::of(&ty).name(),
                    "remaining": remaining, "capacity": capacity,
                }))),
                Verdict::Deny { retry_after_ms } => {
                    // The frame is dropped unprocessed: the sender must re-send it.
                    return (
                        vec![Outbound::Json(json!({
                            "type": "rate_limited", "retry_after_ms": retry_after_ms,
                            "tier": Tier::of(&ty).name(),
                        }))],
                        End::Keep,
                    );
                }
            }
        }
        if ty == "identify" {
            let (mut o, end) = self.identify(conn, &frame);
            out.append(&mut o);
            return (out, end);
        }
        if let Some(reply) = self.dispatch(&agent, &ty, &frame) {
            out.push(Outbound::Json(reply));
        }
        (out, End::Keep)
    }

    fn identify(&self, conn: &mut Conn, frame: &Value) -> (Vec<Outbound>, End) {
        let agent_id = frame["agent_id"].as_str().unwrap_or_default();
        let token = frame["token"].as_str().unwrap_or_default();
        let mut st = self.lock();
        if let Some((since, len)) = st.cooldown {
            let left = len.saturating_sub(since.elapsed());
            if !left.is_zero() {
                let secs = left.as_millis().div_ceil(1000);
                return (
                    vec![Outbound::Close(
                        1008,
                        format!("cooldown active: retry in {secs}s"),
                    )],
                    End::Close,
                );
            }
            st.cooldown = None;
        }
        match self.opts.agents.iter().find(|(_, t)| t == token) {
            Some((owner, _)) if owner == agent_id => {
                conn.agent = Some(agent_id.to_string());
                if let Some(c) = st.conns.get_mut(&conn.id) {
                    c.agent = Some(agent_id.to_string());
                }
                // `do_identify`: a new AgentFSM from the task table, replacing any other.
                st.fsm_start(agent_id, conn.id, self.opts.acceptance_timeout);
                drop(st);
                self.schedule.notify_one();
                (
                    vec![Outbound::Json(
                        json!({"type": "identified", "agent_id": agent_id}),
                    )],
                    End::Keep,
                )
            }
            Some(_) => (vec![error("token_agent_mismatch")], End::Keep),
            None => (vec![error("invalid_token")], End::Keep),
        }
    }
}

/// Per-connection state owned by its task.
struct Conn {
    id: u64,
    agent: Option<String>,
    /// Times of recent violations, for the 10-in-60-s cut-off.
    violations: VecDeque<Instant>,
}

/// What happens to the socket after a frame's replies are sent.
enum End {
    Keep,
    /// Replies included a close frame; drop the socket afterwards.
    Close,
    /// Drop without a close frame (the hub's process crashed).
    Drop,
}

fn error(e: &str) -> Outbound {
    Outbound::Json(json!({"type": "error", "error": e}))
}

pub(super) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = TcpSocket::new_v4()?;
    // Lets restart() rebind the port while old sockets linger in TIME_WAIT.
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(128)
}
