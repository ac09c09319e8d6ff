//! A task runs only while this agent holds it: the running task is paused the moment the
//! hub link drops, and the hub's answer after the reconnect decides whether it resumes or
//! is killed and dropped; and the hub's picture of this agent is kept true after an
//! assignment this agent could not take.
//!
//! **Fencing.** The hub reclaims a task on any disconnect (generation + 1) and may give it
//! to another agent within milliseconds (PROTOCOL.md §8). So on `Disconnected` the running
//! task's [`Fence`] closes: its processes are stopped, no new one starts (nothing is
//! committed, pushed or proposed), its clocks stop, its progress is held back. After the
//! reconnect the daemon asks with `state_report` at the generation it runs; the answer:
//! - `continue` at that generation (the hub's table still holds the task for this agent:
//!   a hub killed outright), or the task assigned here again: the fence opens, the task
//!   goes on where it stopped, and `task_accepted` moves a restarted hub's AgentFSM to
//!   `working`;
//! - `abort`, `task_cancelled`, `task_reassign`, or an assignment of another task (the hub
//!   assigns only to an agent it believes idle, so it no longer holds ours): the task is
//!   killed where it stands (never continued first) and dropped without a report;
//! - nothing within `fence_timeout_secs`: killed and dropped the same way.
//!
//! **The hub's view.** The hub's AgentFSM holds one task and applies a `task_failed` to it
//! whatever task id the frame names (4718a58): refusing a duplicate assignment with
//! `task_failed` while a task runs makes the hub believe the running task ended. So an
//! assignment that arrives while a task runs is not answered at all: it is held back here,
//! and once this agent is idle (no task, no result waiting) it reconnects. A new connection
//! makes the hub re-create the agent's AgentFSM from its task table (`AgentFSM.init`, from
//! `TaskQueue.tasks_assigned_to`), and the socket that closes reclaims only what the old
//! state machine held (nothing, idle). Each held task is then asked about with a
//! `state_report`: `continue` (still assigned here at that generation) takes it as its
//! assignment, so the task the hub believes this agent has is the one it runs; `abort` (the
//! hub gave it out again meanwhile) forgets it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Daemon;
use crate::hub::proto::Outbound;
use crate::process::Fence;
use crate::progress::{FrameSender, ProgressEvent};
use crate::task::Task;

/// Progress of a fenced task is held back: frames sent while the task is paused would reach
/// the hub after the reconnect about a task it may have given to another agent (and touch
/// that assignment's progress timestamp).
pub(super) struct FencedSender {
    pub(super) inner: Arc<dyn FrameSender>,
    pub(super) fence: Fence,
}

impl FrameSender for FencedSender {
    fn send_progress(&self, frame: Outbound) {
        if !self.fence.is_paused() {
            self.inner.send_progress(frame);
        }
    }
}

impl Daemon {
    /// The link dropped: pause the running task until the hub says it is still ours.
    pub(super) fn fence_running(&mut self, why: &str) {
        let Some(r) = self.running.as_mut().filter(|r| !r.dropped) else {
            return;
        };
        if !r.fence.pause() {
            return;
        }
        r.paused_at = Some(Instant::now());
        r.sink.emit(ProgressEvent::status(format!(
            "paused: {why}; the task waits for the hub to say it is still this agent's (nothing runs, nothing is published)"
        )));
        tracing::warn!(task_id = %r.task_id, reason = %why, fence_timeout_secs = self.cfg.fence_timeout_secs, "hub link down: task paused until the hub says it is still ours");
        self.fence_deadline =
            Some(Instant::now() + Duration::from_secs(self.cfg.fence_timeout_secs));
        self.link.hurry(true);
    }

    /// The running task, when it is paused: its id and the generation it runs at.
    pub(super) fn paused_task(&self) -> Option<(String, u64)> {
        let r = self
            .running
            .as_ref()
            .filter(|r| !r.dropped && r.fence.is_paused())?;
        let a = self
            .active
            .as_ref()
            .filter(|a| a.task.task_id == r.task_id)?;
        Some((r.task_id.clone(), a.task.generation))
    }

    /// The hub says the paused task is still ours: let it go on where it stopped.
    pub(super) fn resume_fenced(&mut self, why: &str) {
        let Some(r) = self.running.as_mut().filter(|r| !r.dropped) else {
            return;
        };
        let paused_for = r.paused_at.take().map(|t| t.elapsed()).unwrap_or_default();
        if !r.fence.resume() {
            return;
        }
        self.fence_deadline = None;
        self.link.hurry(false);
        r.sink.emit(ProgressEvent::status(format!(
            "resumed after {:.1} s paused: {why}",
            paused_for.as_secs_f64()
        )));
        tracing::info!(task_id = %r.task_id, paused_ms = paused_for.as_millis() as u64, reason = %why, "task resumed");
        self.ops
            .status(&format!("connected, running task {}", r.task_id));
    }

    /// The paused task is not ours any more: say so in its record before it is killed.
    pub(super) fn end_fenced(&mut self, task_id: &str, why: &str) {
        let Some(r) = self
            .running
            .as_mut()
            .filter(|r| r.task_id == task_id && !r.dropped && r.paused_at.is_some())
        else {
            return;
        };
        let paused_for = r.paused_at.take().map(|t| t.elapsed()).unwrap_or_default();
        r.sink.emit(ProgressEvent::status(format!(
            "killed after {:.1} s paused, dropped unreported: {why}",
            paused_for.as_secs_f64()
        )));
        tracing::warn!(task_id = %task_id, paused_ms = paused_for.as_millis() as u64, reason = %why, "paused task killed and dropped");
        self.fence_deadline = None;
        self.link.hurry(false);
    }

    /// `fence_timeout_secs` passed without an answer: kill and drop the paused task.
    pub(super) async fn fence_expired(&mut self) {
        self.fence_deadline = None;
        if let Some((task_id, _)) = self.paused_task() {
            self.end_fenced(
                &task_id,
                &format!(
                    "no word from the hub within fence_timeout_secs ({} s)",
                    self.cfg.fence_timeout_secs
                ),
            );
            self.drop_task(&task_id).await;
        }
    }

    /// An assignment this agent will not answer now (a task runs): kept until it is idle.
    pub(super) fn hold_back(&mut self, task: Task) {
        tracing::warn!(task_id = %task.task_id, generation = task.generation, "assigned while another task runs: not answered (a task_failed would end the running task in the hub's state machine); asking about it once idle");
        self.held_back.retain(|t| t.task_id != task.task_id);
        self.held_back.push(task);
    }

    /// Idle with assignments held back: reconnect, so the hub re-creates this agent's state
    /// machine from its task table (see the module docs).
    pub(super) fn resync_if_idle(&mut self) {
        let idle = self.running.is_none()
            && self.active.is_none()
            && self.queued.is_none()
            && self.outbox.is_empty()
            && self.inflight.is_none();
        if self.held_back.is_empty() || !idle || !self.identified || self.resyncing {
            return;
        }
        tracing::info!(held = self.held_back.len(), "idle with assignments held back: reconnecting so the hub's view of this agent is rebuilt from its task table");
        self.resyncing = true;
        self.link.reconnect();
    }

    /// After `identified`: ask about every assignment held back, taking one the hub still
    /// holds for this agent as that assignment.
    pub(super) fn ask_held_back(&mut self) {
        self.resyncing = false;
        for task in std::mem::take(&mut self.held_back) {
            self.report(&task, "held", true);
        }
    }
}
