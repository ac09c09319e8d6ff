//! The scripted hub's state: the locked task table and recordings, the per-agent rate
//! limiter, and the answer to each valid frame from an identified agent. Nothing here
//! touches a socket; `server` calls in with parsed frames.

use super::*;

impl State {
    /// A task body's `task_id`, or a fresh one for a body without.
    pub(super) fn task_id_of(&self, id: Option<&Value>) -> String {
        match id.and_then(Value::as_str) {
            Some(id) => id.to_string(),
            None => format!("task-mock-{}", self.tasks.len() + 1),
        }
    }
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not wedge the hub for the others.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn run_token(&self) -> CancellationToken {
        self.run.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn push_identified(&self, make: impl Fn() -> Outbound) -> bool {
        let st = self.lock();
        let mut sent = false;
        for c in st.conns.values().filter(|c| c.agent.is_some()) {
            sent |= c.tx.send(make()).is_ok();
        }
        sent
    }

    pub(super) fn record(&self, conn: u64, inbound: bool, frame: Value) {
        self.record_at(conn, inbound, frame, Instant::now());
    }

    /// [`Self::record`] with the instant the frame arrived: an inbound frame is stamped before
    /// the mock parses and validates it, so its own work is not in the daemon's latency.
    pub(super) fn record_at(&self, conn: u64, inbound: bool, frame: Value, at: Instant) {
        let mut st = self.lock();
        if !inbound {
            // Counters for the observing API are derived from what was really sent.
            match type_of(&frame) {
                Some("rate_limited") => st.rate_limited += 1,
                Some("task_ack")
                    if matches!(
                        frame.get("status").and_then(Value::as_str),
                        Some("complete" | "retried" | "dead_letter" | "failed")
                    ) =>
                {
                    if let Some(id) = frame.get("task_id").and_then(Value::as_str) {
                        *st.acked_terminal.entry(id.to_string()).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        st.frames.push(Recorded {
            conn,
            at,
            inbound,
            frame,
        });
        drop(st);
        if inbound {
            self.inbound.notify_waiters();
            self.schedule.notify_one();
        }
    }

    pub(super) fn violation(&self, conn: u64, frame: Value, errors: Vec<String>) {
        tracing::warn!(conn, ?errors, "mock hub: protocol violation");
        self.lock().violations.push(Violation {
            conn,
            frame,
            errors,
        });
    }

    pub(super) fn check_rate(&self, agent: &str, tier: Tier) -> Verdict {
        let o = &self.opts;
        let (cap, per_min) = match tier {
            Tier::Light => (o.light_capacity, o.light_per_minute),
            Tier::Normal => (o.normal_capacity, o.normal_per_minute),
            Tier::Heavy => (o.heavy_capacity, o.heavy_per_minute),
        };
        let cap = f64::from(cap);
        let per_ms = f64::from(per_min) / 60_000.0;
        let now = Instant::now();
        let mut st = self.lock();
        let b = st
            .buckets
            .entry((agent.to_string(), tier))
            .or_insert(Bucket {
                tokens: cap,
                last: now,
            });
        let elapsed = now.duration_since(b.last).as_secs_f64() * 1000.0;
        b.tokens = (b.tokens + elapsed * per_ms).min(cap);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            if b.tokens < cap * WARN_SHARE {
                Verdict::Warn {
                    remaining: b.tokens.floor() as u64,
                    capacity: cap as u64,
                }
            } else {
                Verdict::Allow
            }
        } else {
            let ms = if per_ms > 0.0 {
                ((1.0 - b.tokens) / per_ms).ceil() as u64
            } else {
                60_000
            };
            Verdict::Deny {
                retry_after_ms: ms.div_ceil(1000).max(1) * 1000,
            }
        }
    }

    /// Answers one valid frame from an identified agent.
    pub(super) fn dispatch(&self, agent: &str, ty: &str, f: &Value) -> Option<Value> {
        let task_id = f.get("task_id").and_then(Value::as_str).unwrap_or_default();
        let mut guard = self.lock();
        let st = &mut *guard;
        match ty {
            "ping" => Some(json!({"type": "pong", "timestamp": now_ms()})),
            "task_accepted" => {
                // The table only refreshes its progress stamp; the marker below is the mock's.
                if let Some(t) = st.tasks.get_mut(task_id) {
                    if t.agent == agent && t.state == MockTaskState::Assigned {
                        t.state = MockTaskState::Accepted;
                    }
                }
                st.fsm_accepted(agent, task_id);
                Some(json!({"type": "task_ack", "task_id": task_id, "status": "accepted"}))
            }
            "task_complete" | "task_failed" => {
                if st.ack_terminal_off || st.ignore_terminal.contains(task_id) {
                    return None;
                }
                let complete = ty == "task_complete";
                // As `TaskQueue.complete_task` / `fail_task` (4718a58): fenced by the
                // generation only, whoever sends it.
                let generation = f["generation"].as_u64().unwrap_or(0);
                let max = st
                    .max_retries
                    .get(task_id)
                    .copied()
                    .unwrap_or(self.opts.max_retries);
                let verdict = match st.tasks.get_mut(task_id) {
                    None => Err("not_found"),
                    Some(t) if t.state == MockTaskState::DeadLetter => Err("not_found"),
                    Some(t) if !t.in_flight() => Err("invalid_state"),
                    Some(t) if generation != t.generation => Err("stale_generation"),
                    Some(t) if complete => {
                        t.state = MockTaskState::Complete;
                        Ok("complete")
                    }
                    Some(t) => {
                        t.retries += 1;
                        if t.retries >= max {
                            t.state = MockTaskState::DeadLetter;
                            Ok("dead_letter")
                        } else {
                            t.generation += 1;
                            t.state = MockTaskState::Queued;
                            Ok("retried")
                        }
                    }
                };
                match verdict {
                    Ok(status) => {
                        // `task_completed` and `task_retried` are scheduling triggers,
                        // `task_dead_letter` is not; then the cast to the *sender's* machine.
                        if status != "dead_letter" {
                            st.sched_pending = true;
                        }
                        if status == "dead_letter" {
                            st.log(agent, "task_dead_letter", Some(task_id));
                        }
                        st.fsm_task_ended(agent, complete, task_id);
                        Some(json!({"type": "task_ack", "task_id": task_id, "status": status}))
                    }
                    Err(r) => {
                        let what = if complete {
                            "task_complete_failed"
                        } else {
                            "task_fail_failed"
                        };
                        Some(json!({"type": "error", "error": format!("{what}: {r}")}))
                    }
                }
            }
            "task_recovering" => {
                let forced = st.recovery.get(task_id).copied();
                // As `TaskQueue.recover_task` (4718a58) decides: whether the task is still
                // assigned, not to whom (PROTOCOL.md §8). A task reclaimed on this agent's
                // disconnect and given to another agent gets `task_continue` here too, with
                // that agent's generation.
                let assigned = st.tasks.get(task_id).is_some_and(MockTask::in_flight);
                let answer = forced.unwrap_or(if assigned {
                    RecoveryAnswer::Continue
                } else {
                    RecoveryAnswer::Reassign
                });
                match (answer, st.tasks.get_mut(task_id)) {
                    (RecoveryAnswer::Continue, Some(t)) => {
                        if !t.in_flight() {
                            // Forced continue of a task that was reclaimed: hand it back.
                            t.agent = agent.to_string();
                            t.state = MockTaskState::Assigned;
                        }
                        Some(json!({"type": "task_continue", "task_id": task_id,
                                    "generation": t.generation}))
                    }
                    (RecoveryAnswer::Continue, None) => {
                        Some(json!({"type": "task_continue", "task_id": task_id, "generation": 1}))
                    }
                    (RecoveryAnswer::Reassign, t) => {
                        if let Some(t) = t.filter(|t| t.in_flight()) {
                            t.generation += 1;
                            t.state = MockTaskState::Queued;
                            st.sched_pending = true;
                        }
                        Some(json!({"type": "task_reassign", "task_id": task_id}))
                    }
                }
            }
            "state_report" => {
                // The hub's reconciliation: `continue` only for a task assigned to this
                // agent at the generation reported (a missing one counts as 0).
                let reported = f.get("generation").and_then(Value::as_u64).unwrap_or(0);
                let ours = st
                    .tasks
                    .get(task_id)
                    .is_some_and(|t| t.in_flight() && t.agent == agent && t.generation == reported);
                let action = st
                    .state_report_actions
                    .get(task_id)
                    .cloned()
                    .unwrap_or_else(|| if ours { "continue" } else { "abort" }.into());
                Some(json!({"type": "state_report_ack", "task_id": task_id, "action": action}))
            }
            "status" => Some(json!({"type": "status_updated"})),
            "list_agents" => Some(json!({"type": "agents", "agents": []})),
            "list_channels" => Some(json!({"type": "channels", "channels": []})),
            "message" => Some(json!({"type": "message_sent", "id": format!("msg-{}", now_ms())})),
            // task_progress, resource_report, ollama_report, wake_result, channel_*: no reply.
            _ => None,
        }
    }
}
