//! What the hub says about a task this agent held before a restart or a reconnect, and the
//! rule every answer obeys: **a generation this sidecar did not accept is never run.** A
//! generation is accepted only from an assignment addressed to this agent (`task_assign`,
//! on disk before `task_accepted`); the generation a `task_continue` carries is never
//! adopted, and a result carries the generation its run was accepted under.
//!
//! - `task_continue` at the generation on disk: the task is still ours (a hub killed
//!   outright keeps its task table): it runs again.
//! - `task_continue` at any other generation, or none: the hub reclaimed the task on the
//!   disconnect and gave it out again. Its recovery check (4718a58) asks only whether the
//!   task is still assigned, not to whom (PROTOCOL.md §8), so this is usually another
//!   agent's assignment. The task is dropped as on `task_reassign`: nothing runs, no result
//!   is sent, the slot is free for the next assignment at once. One `state_report` at the
//!   hub's generation then asks whose the task is. The hub's reconciliation answers
//!   `continue` only when its table holds the task for *this* agent at that generation (it
//!   gave it to us and the `task_assign` was lost in a crash or is still on its way): then,
//!   and only then, it is taken as that assignment, so the hub's AgentFSM, waiting in
//!   `assigned`, gets its `task_accepted`. `abort` (another agent has it) needs nothing
//!   more: this agent's AgentFSM started idle, since the hub holds no task for it.
//! - `state_report_ack` answers the report of one generation: `abort` stops the task only
//!   while it still runs at that generation; an assignment since then (a newer one) stands.

use tokio::time::Instant;

use super::Daemon;
use crate::hub::proto::{Outbound, ReportAction};
use crate::state::Phase;
use crate::task::Task;

/// A `state_report` sent on this connection and not answered yet.
#[derive(Debug)]
pub(super) struct Asked {
    task_id: String,
    /// The generation reported: what the answer is about.
    generation: u64,
    /// Set when the report asks whether the hub holds a task for this agent after a
    /// `task_continue` at a generation this sidecar never accepted: the task at the hub's
    /// generation, taken as an assignment if the answer is `continue`.
    offer: Option<Task>,
}

/// Whether a `task_continue` carrying `carried` is about the task as held on disk at
/// `held`: only the very same generation is (a hub killed outright keeps it). A missing
/// generation proves nothing.
pub(super) fn continue_is_ours(held: u64, carried: Option<u64>) -> bool {
    carried == Some(held)
}

impl Daemon {
    /// Send `state_report` for `task` and remember what it asked.
    pub(super) fn report(&mut self, task: &Task, status: &str, offer: bool) {
        self.link.send(Outbound::StateReport {
            task_id: task.task_id.clone(),
            status: status.into(),
            generation: task.generation,
            assigned_at: task.assigned_at,
        });
        self.asked.retain(|a| a.task_id != task.task_id);
        self.asked.push(Asked {
            task_id: task.task_id.clone(),
            generation: task.generation,
            offer: offer.then(|| task.clone()),
        });
    }

    /// `task_recovering` for the task found on disk, with the deadline for its answer.
    pub(super) fn ask_recovering(&mut self, task: &Task) {
        self.link.send(Outbound::TaskRecovering {
            task_id: task.task_id.clone(),
            generation: task.generation,
        });
        self.recovery_deadline = Some(Instant::now() + super::RECOVERY_ANSWER);
    }

    /// `task_continue`: run the recovering task again only at the generation on disk.
    pub(super) async fn on_continue(&mut self, task_id: &str, generation: Option<u64>) {
        let Some(active) = &mut self.active else {
            return;
        };
        if active.task.task_id != task_id
            || active.phase != Phase::Recovering
            || self.running.is_some()
        {
            return;
        }
        let held = active.task.generation;
        if !continue_is_ours(held, generation) {
            tracing::warn!(
                task_id = %task_id,
                held_generation = held,
                hub_generation = ?generation,
                "task_continue carries a generation this sidecar never accepted: the hub reclaimed the task and gave it out again (PROTOCOL.md §8); dropping it without running it, and asking the hub whose it is"
            );
            let mut task = active.task.clone();
            self.drop_task(task_id).await;
            task.generation = generation.unwrap_or(held);
            self.report(&task, "dropped", true);
            return;
        }
        active.phase = Phase::Running;
        self.recovery_deadline = None;
        let task = active.task.clone();
        tracing::info!(task_id = %task_id, generation = held, "hub says continue at the generation on disk: running the task again");
        self.save().await;
        self.start(task);
        // A restarted hub's AgentFSM waits in `assigned`; `task_continue` does not move it.
        self.link.send(Outbound::TaskAccepted {
            task_id: task_id.to_string(),
        });
    }

    /// `state_report_ack`: the answer to the report of one generation.
    pub(super) async fn on_report_ack(&mut self, task_id: &str, action: &ReportAction) {
        let asked = self
            .asked
            .iter()
            .position(|a| a.task_id == task_id)
            .map(|i| self.asked.swap_remove(i));
        let held = self
            .active
            .as_ref()
            .filter(|a| a.task.task_id == task_id)
            .map(|a| a.task.generation);
        match action {
            ReportAction::Abort => match (held, asked.map(|a| a.generation)) {
                (Some(held), Some(reported)) if held != reported => {
                    tracing::info!(task_id = %task_id, reported_generation = reported, generation = held, "abort answers an older generation; the task was assigned here again since: keeping it");
                }
                (Some(_), _) => {
                    tracing::warn!(task_id = %task_id, "hub says abort the task");
                    self.end_fenced(
                        task_id,
                        "the hub answered the state report with abort (it reclaimed the task on the disconnect)",
                    );
                    self.drop_task(task_id).await;
                }
                (None, _) => {
                    tracing::info!(task_id = %task_id, "hub says the task is not this agent's: nothing to run");
                }
            },
            ReportAction::Continue => {
                let reported = asked.as_ref().map(|a| a.generation);
                if let Some((paused, generation)) = self.paused_task() {
                    if paused == task_id && reported == Some(generation) {
                        self.resume_fenced(
                            "the hub still holds the task for this agent at its generation",
                        );
                        // A restarted hub's AgentFSM waits in `assigned` for this.
                        self.link.send(Outbound::TaskAccepted {
                            task_id: task_id.to_string(),
                        });
                        return;
                    }
                }
                let Some(task) = asked.and_then(|a| a.offer) else {
                    return;
                };
                if held.is_some() {
                    // Its `task_assign` came first and was taken.
                    return;
                }
                tracing::info!(task_id = %task_id, generation = task.generation, "the hub holds the task for this agent at its generation: taking it as that assignment");
                self.on_assign(task).await;
            }
            ReportAction::Other(other) => {
                tracing::warn!(task_id = %task_id, action = %other, "state_report_ack with an unknown action: ignored");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::continue_is_ours;

    #[test]
    fn only_the_generation_on_disk_is_ours() {
        assert!(continue_is_ours(1, Some(1)));
        // The hub reclaimed it (generation + 1) and gave it to another agent (+ 1 again).
        assert!(!continue_is_ours(1, Some(3)));
        assert!(!continue_is_ours(3, Some(1)));
        assert!(!continue_is_ours(1, None));
    }
}
