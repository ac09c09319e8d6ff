//! The hub's per-agent state machine (`AgentFSM` at 4718a58) and the two task-table moves it
//! makes (`TaskQueue.reclaim_task`), plus the socket registry the scheduler pushes through.
//!
//! What the real one does, and this one with it:
//!
//! - One machine per agent, created at every `identify` (the old one is stopped without
//!   reclaiming anything). It starts `assigned` on the first task the table shows assigned to
//!   the agent, with a fresh acceptance timer, else `idle`. It watches the connection that
//!   identified; when *that* connection closes it reclaims the task it holds and goes away.
//!   A close of any other connection of the agent changes nothing.
//! - It holds one task and is not keyed by task id: `task_completed` / `task_failed` (cast
//!   after the table accepted a result, whatever task the result named) end whatever it holds,
//!   but only from `working`; in any other state they are logged and ignored.
//! - `task_assigned` (cast by the socket when it pushes an assignment) moves `idle` →
//!   `assigned` and arms the acceptance timer; in any other state it is ignored.
//!   `task_accepted` moves `assigned` → `working` only for the task it holds.
//! - The acceptance timer reclaims the task it names from whoever holds it now (the table
//!   does not check the agent), then goes `idle`, flagged `unresponsive`. Nothing tells the
//!   scheduler: only a reclaim that succeeded is a scheduling trigger.
//! - The registry (`AgentRegistry`, unique keys) maps an agent to the first of its
//!   connections that identified and is still open; pushes from the scheduler go there only.
//!
//! Every step the real hub logs is kept in [`State::hub_log`] under the real log message.

use super::*;

/// A state of the hub's per-agent machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsmState {
    /// No task: the scheduler may assign one.
    Idle,
    /// A task was pushed; waiting for `task_accepted` (the acceptance timer runs).
    Assigned,
    /// `task_accepted` came for the task it holds.
    Working,
}

/// A snapshot of one agent's state machine ([`MockHub::fsm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFsm {
    /// Where it stands.
    pub state: FsmState,
    /// The one task it holds (`current_task_id`).
    pub task_id: Option<String>,
    /// Set by an acceptance timeout; never cleared (as in the real hub, it does not keep the
    /// scheduler away).
    pub unresponsive: bool,
    /// The connection it watches.
    pub conn: u64,
}

/// One line of the hub's log about tasks and agents, named as the real hub logs it
/// (`fsm_acceptance_timeout`, `fsm_reclaim_failed`, `fsm_unexpected_event`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEvent {
    /// The agent it is about.
    pub agent: String,
    /// The real hub's log message.
    pub event: &'static str,
    /// The task it names, if any (for the machine's events: the task it held).
    pub task_id: Option<String>,
    /// For a result's cast to the machine: the task the result named (the machine is not
    /// told; kept so tests can see a result for one task end another).
    pub cause: Option<String>,
}

/// The live machine: the snapshot plus its timer.
#[derive(Debug)]
pub(super) struct Fsm {
    pub(super) view: AgentFsm,
    /// `(task, deadline)` of the acceptance timer.
    pub(super) timer: Option<(String, Instant)>,
}

impl State {
    /// Logs `event` (whoever changed the state wakes the waiters).
    pub(super) fn log(&mut self, agent: &str, event: &'static str, task_id: Option<&str>) {
        tracing::debug!(agent, event, task_id, "mock hub");
        self.hub_log.push(HubEvent {
            agent: agent.to_string(),
            event,
            task_id: task_id.map(str::to_string),
            cause: None,
        });
    }

    /// `TaskQueue.reclaim_task`: a task assigned (to anyone) goes back to the queue at
    /// generation + 1, which is a scheduling trigger; anything else is refused.
    pub(super) fn reclaim(&mut self, task_id: &str) -> bool {
        match self.tasks.get_mut(task_id) {
            Some(t) if t.in_flight() => {
                t.generation += 1;
                t.state = MockTaskState::Queued;
                self.sched_pending = true;
                true
            }
            _ => false,
        }
    }

    /// `identify` on `conn`: a new machine for `agent`, built from the task table.
    pub(super) fn fsm_start(&mut self, agent: &str, conn: u64, timeout: Duration) {
        if self.fsms.remove(agent).is_some() {
            // `AgentSupervisor.stop_agent`: no terminate callback, so nothing is reclaimed.
            self.log(agent, "fsm_replaced", None);
        }
        // The hub folds its DETS table (no defined order); sorted here, to be reproducible.
        let mut held: Vec<&MockTask> = self
            .tasks
            .values()
            .filter(|t| t.in_flight() && t.agent == agent)
            .collect();
        held.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        let first = held.first().map(|t| t.task_id.clone());
        let (state, timer) = match &first {
            Some(id) => (
                FsmState::Assigned,
                Some((id.clone(), Instant::now() + timeout)),
            ),
            None => (FsmState::Idle, None),
        };
        if let Some(id) = &first {
            self.log(agent, "fsm_existing_assignment", Some(id));
        }
        self.fsms.insert(
            agent.to_string(),
            Fsm {
                view: AgentFsm {
                    state,
                    task_id: first,
                    unresponsive: false,
                    conn,
                },
                timer,
            },
        );
        // `Registry.register` with unique keys: a second connection is not registered.
        self.registry.entry(agent.to_string()).or_insert(conn);
        // `Presence.register` broadcasts `agent_joined`, a scheduling trigger.
        self.sched_pending = true;
    }

    /// Connection `conn` of `agent` closed while the hub runs.
    pub(super) fn fsm_conn_down(&mut self, agent: &str, conn: u64) {
        if self.registry.get(agent) == Some(&conn) {
            self.registry.remove(agent);
        }
        if self.fsms.get(agent).is_none_or(|f| f.view.conn != conn) {
            return;
        }
        let Some(fsm) = self.fsms.remove(agent) else {
            return;
        };
        self.log(agent, "fsm_websocket_down", fsm.view.task_id.as_deref());
        if let Some(id) = fsm.view.task_id {
            self.reclaim_for(agent, &id);
        }
    }

    fn reclaim_for(&mut self, agent: &str, task_id: &str) {
        if self.reclaim(task_id) {
            self.log(agent, "fsm_task_reclaimed", Some(task_id));
        } else {
            self.log(agent, "fsm_reclaim_failed", Some(task_id));
        }
    }

    /// The socket pushed `task_id` to `agent` and casts `task_assigned`.
    pub(super) fn fsm_assigned(&mut self, agent: &str, task_id: &str, timeout: Duration) {
        let Some(f) = self.fsms.get_mut(agent) else {
            return;
        };
        if f.view.state == FsmState::Idle {
            f.view.state = FsmState::Assigned;
            f.view.task_id = Some(task_id.to_string());
            f.timer = Some((task_id.to_string(), Instant::now() + timeout));
            self.log(agent, "fsm_task_assigned", Some(task_id));
        } else {
            self.log(agent, "fsm_invalid_transition", Some(task_id));
        }
    }

    pub(super) fn fsm_accepted(&mut self, agent: &str, task_id: &str) {
        let Some(f) = self.fsms.get_mut(agent) else {
            return;
        };
        if f.view.state == FsmState::Assigned && f.view.task_id.as_deref() == Some(task_id) {
            f.view.state = FsmState::Working;
            f.timer = None;
            self.log(agent, "fsm_task_accepted", Some(task_id));
        } else {
            self.log(agent, "fsm_unexpected_task_accepted", Some(task_id));
        }
    }

    /// `task_completed` / `task_failed` cast after the table took a result: ends whatever the
    /// machine holds, from `working` only, and broadcasts `agent_idle` (a trigger).
    pub(super) fn fsm_task_ended(&mut self, agent: &str, completed: bool, named: &str) {
        let Some(f) = self.fsms.get_mut(agent) else {
            return;
        };
        if f.view.state == FsmState::Working {
            let held = f.view.task_id.take();
            f.view.state = FsmState::Idle;
            f.timer = None;
            let event = if completed {
                "fsm_task_completed"
            } else {
                "fsm_task_failed"
            };
            self.log(agent, event, held.as_deref());
            self.sched_pending = true;
        } else {
            let held = f.view.task_id.clone();
            self.log(agent, "fsm_unexpected_event", held.as_deref());
        }
        if let Some(e) = self.hub_log.last_mut() {
            e.cause = Some(named.to_string());
        }
    }

    /// Fires the acceptance timers due at `now`.
    pub(super) fn fsm_fire_timers(&mut self, now: Instant) {
        let mut due: Vec<(String, String)> = self
            .fsms
            .iter()
            .filter_map(|(a, f)| match &f.timer {
                Some((id, by)) if *by <= now => Some((a.clone(), id.clone())),
                _ => None,
            })
            .collect();
        due.sort();
        for (agent, task_id) in due {
            let Some(f) = self.fsms.get_mut(&agent) else {
                continue;
            };
            f.timer = None;
            if f.view.task_id.as_deref() != Some(task_id.as_str()) {
                continue;
            }
            f.view.state = FsmState::Idle;
            f.view.task_id = None;
            f.view.unresponsive = true;
            self.log(&agent, "fsm_acceptance_timeout", Some(&task_id));
            self.reclaim_for(&agent, &task_id);
        }
    }

    /// The earliest acceptance deadline.
    pub(super) fn fsm_next_deadline(&self) -> Option<Instant> {
        self.fsms
            .values()
            .filter_map(|f| f.timer.as_ref().map(|(_, by)| *by))
            .min()
    }

    /// Agents whose machine is `idle`, in a fixed order (the hub's `Registry.select` has none).
    pub(super) fn idle_agents(&self) -> Vec<String> {
        let mut idle: Vec<String> = self
            .fsms
            .iter()
            .filter(|(_, f)| f.view.state == FsmState::Idle)
            .map(|(a, _)| a.clone())
            .collect();
        idle.sort();
        idle
    }

    /// Push `frame` to `agent`'s registered connection; `false` when it has none (the
    /// hub's `scheduler_ws_not_found`: the task stays assigned, unpushed).
    pub(super) fn push_registered(&self, agent: &str, frame: &Value) -> bool {
        let Some(c) = self.registry.get(agent).and_then(|id| self.conns.get(id)) else {
            return false;
        };
        c.tx.send(Outbound::Json(frame.clone())).is_ok()
    }
}
