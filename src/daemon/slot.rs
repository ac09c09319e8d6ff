//! The task slot: which task this agent works on, whether a new assignment is taken,
//! refused or adopted, starting the runner, and what happens when it ends.
//!
//! The rule for an assignment is the pure [`decide_assign`], so it can be tested without a
//! hub; [`Daemon::on_assign`] carries the decision out (persist, answer, start).

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::fencing::FencedSender;
use super::Daemon;
use crate::hub::proto::Outbound;
use crate::process::Fence;
use crate::progress::{ProgressEvent, ProgressSink};
use crate::runner::{self, Finished, TaskOutcome};
use crate::state::{ActiveTask, OutboxEntry, Phase};
use crate::task::Task;
use crate::util::now_ms;

/// The task being worked on now.
pub(super) struct Running {
    pub(super) task_id: String,
    pub(super) cancel: CancellationToken,
    pub(super) handle: JoinHandle<Finished>,
    /// The hub took the task back (cancelled, reassigned, aborted): send nothing for it.
    pub(super) dropped: bool,
    /// Closed while the link is down: the task's processes stopped, its clocks paused.
    pub(super) fence: Fence,
    /// The task's progress (and, through its tap, its flight record).
    pub(super) sink: ProgressSink,
    /// Since when the fence is closed.
    pub(super) paused_at: Option<Instant>,
}

/// Wait for the running task's runner to end; pending forever when nothing runs.
pub(super) async fn join_running(
    r: &mut Option<Running>,
) -> Result<Finished, tokio::task::JoinError> {
    match r {
        Some(r) => (&mut r.handle).await,
        None => std::future::pending().await,
    }
}

/// What [`decide_assign`] looks at: the slot as it is when a `task_assign` arrives.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlotView<'a> {
    /// The runner still working: its task and whether the hub already took that task back
    /// (a dropped runner is only winding down).
    pub(super) running: Option<(&'a str, bool)>,
    /// The task this agent owns, as on disk: its id, phase and generation.
    pub(super) active: Option<(&'a str, Phase, u64)>,
    /// Draining, or the hub asked for a restart.
    pub(super) stopping: bool,
    /// Tasks can be confined as the containment level demands.
    pub(super) can_confine: bool,
}

/// Why an assignment is refused; [`Refusal::reason`] is the `task_failed` reason the hub sees.
/// Only ever sent while no task runs here: the hub's AgentFSM applies a `task_failed` to the
/// task it holds, whatever its id (see `fencing.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Draining or restarting: the hub should not expect this agent back soon.
    ShuttingDown,
    /// The slot could not be written to disk, so the task would be lost on a crash.
    StateNotPersistable,
    /// Containment is strict and this machine cannot enforce it now: the task is handed
    /// back before anything runs or is spent, so the hub can give it to an agent that can.
    ContainmentUnavailable,
}

impl Refusal {
    pub(super) fn reason(self) -> &'static str {
        match self {
            Refusal::ShuttingDown => "sidecar_shutting_down",
            Refusal::StateNotPersistable => {
                "state_not_persistable: the sidecar cannot write its state file"
            }
            Refusal::ContainmentUnavailable => "containment_unavailable",
        }
    }
}

/// What to do with a `task_assign`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Assign {
    /// An assignment of the task held here at an older generation than the one held: the
    /// hub has given it out again since, so this one is stale. Never run, not answered.
    Stale {
        /// The generation held here.
        held: u64,
    },
    /// The hub re-assigned the task already running here (after a reconnect): keep the
    /// work, adopt the new generation, accept again.
    Readopt,
    /// Answer `task_failed` with this reason; nothing changes here.
    Refuse(Refusal),
    /// Another task runs here: not answered now (a `task_failed` would end the running
    /// task in the hub's state machine); asked about once idle (see `fencing.rs`).
    Hold,
    /// Take the task.
    Take {
        /// A task was waiting for the answer to `task_recovering`: the hub handing it back,
        /// or handing out any other work (which it gives only to an agent it believes
        /// idle), is the answer, so that recovering slot is given up for this run.
        replaces_recovering: bool,
        /// A dropped task's runner is still winding down: start right after it ends, so
        /// two tasks never share the workspace.
        after_runner: bool,
    },
}

/// The assignment rule. In order: an assignment of the task held here at an older
/// generation is stale; the task already running here is re-adopted (even while stopping:
/// the hub merely reconnected); any other task while one runs is held back, unanswered
/// (even while stopping: a refusal would end the running one at the hub); stopping refuses
/// everything else; a daemon that cannot confine takes nothing; otherwise the task is
/// taken, replacing a task that waited for the answer to `task_recovering`. (A paused task
/// is dropped before this rule is asked: see [`Daemon::on_assign`].)
pub(super) fn decide_assign(task_id: &str, generation: u64, slot: SlotView<'_>) -> Assign {
    if let Some((_, _, held)) = slot
        .active
        .filter(|(id, _, held)| *id == task_id && *held > generation)
    {
        return Assign::Stale { held };
    }
    let running_live = slot
        .running
        .filter(|(_, dropped)| !dropped)
        .map(|(id, _)| id);
    let active_id = slot.active.map(|(id, _, _)| id);
    if running_live == Some(task_id) && active_id == Some(task_id) {
        return Assign::Readopt;
    }
    if running_live.is_some() && running_live == active_id {
        return Assign::Hold;
    }
    if slot.stopping {
        return Assign::Refuse(Refusal::ShuttingDown);
    }
    if !slot.can_confine {
        return Assign::Refuse(Refusal::ContainmentUnavailable);
    }
    let replaces_recovering = slot
        .active
        .is_some_and(|(_, phase, _)| phase == Phase::Recovering);
    if slot.active.is_some() && !replaces_recovering {
        // Owned but not running live (its runner ending as the slot is handed on): wait.
        return Assign::Hold;
    }
    Assign::Take {
        replaces_recovering,
        after_runner: slot.running.is_some(),
    }
}

impl Daemon {
    fn slot_view(&self) -> SlotView<'_> {
        SlotView {
            running: self
                .running
                .as_ref()
                .map(|r| (r.task_id.as_str(), r.dropped)),
            active: self
                .active
                .as_ref()
                .map(|a| (a.task.task_id.as_str(), a.phase, a.task.generation)),
            stopping: self.draining || self.restart_requested,
            can_confine: self.deps.containment.refusal().is_none(),
        }
    }

    pub(super) async fn on_assign(&mut self, task: Task) {
        let task_id = task.task_id.clone();
        tracing::info!(task_id = %task_id, generation = task.generation, "task assigned");
        // The hub assigns other work only to an agent it believes idle: the paused task is
        // not ours any more.
        if let Some((paused, _)) = self.paused_task().filter(|(id, _)| *id != task_id) {
            self.end_fenced(
                &paused,
                &format!("the hub assigned other work ({task_id}): it no longer holds this task for this agent"),
            );
            self.drop_task(&paused).await;
        }
        let after_runner = match decide_assign(&task_id, task.generation, self.slot_view()) {
            Assign::Stale { held } => {
                tracing::warn!(task_id = %task_id, generation = task.generation, held_generation = held, "assignment older than the generation held here: stale, not run");
                return;
            }
            Assign::Readopt => {
                if let Some(active) = &mut self.active {
                    active.task.generation = task.generation;
                }
                self.save().await;
                self.resume_fenced("the hub assigned the task to this agent again");
                self.link.send(Outbound::TaskAccepted { task_id });
                return;
            }
            Assign::Hold => return self.hold_back(task),
            Assign::Refuse(refusal) => {
                if refusal == Refusal::ContainmentUnavailable {
                    tracing::warn!(task_id = %task_id, "cannot confine tasks here: handing the task back");
                }
                return self.refuse(&task, refusal).await;
            }
            Assign::Take {
                replaces_recovering,
                after_runner,
            } => {
                if replaces_recovering {
                    tracing::info!(task_id = %task_id, generation = task.generation, "assigned while a task waited for the answer to task_recovering: the hub no longer holds that one here; running this");
                    self.active = None;
                    self.recovery_deadline = None;
                }
                after_runner
            }
        };
        // A fresh assignment starts a fresh attempt count and task budget (only
        // `task_continue` resumes them); the day's spend stays.
        self.deps.ledger.finish_task(&task_id).await;
        // A task in a directory of its own takes the directories and sandbox made ahead
        // (`runner::ahead`); their name goes to disk with it.
        let ahead = (!after_runner && crate::workspace::temp_shaped(&self.cfg, &task))
            .then(|| self.ahead.take())
            .flatten();
        self.active = Some(ActiveTask {
            task: task.clone(),
            phase: Phase::Running,
            accepted_at: now_ms(),
            trace: self.deps.telemetry.new_trace(),
            dirs: ahead.as_ref().map(|a| a.name.clone()),
        });
        // The runner starts now behind a closed fence: its workspace and sandbox (files and
        // namespaces, no child: a spawn waits on the fence) are prepared while the
        // assignment is written durably, and nothing of the task runs, nothing is cloned,
        // and no progress leaves before `task_accepted` is on the wire (BENCHMARKS.md,
        // issue 45: the write was a third of "→ prepared" on disk).
        let gate = (!after_runner).then(|| self.start_gated(task.clone(), ahead));
        if !self.save().await {
            self.active = None;
            if gate.is_some() {
                self.abandon_unaccepted(&task_id);
            }
            tracing::error!(task_id = %task_id, state_file = %self.store.path().display(), "cannot persist the task, so not accepting it");
            return self.refuse(&task, Refusal::StateNotPersistable).await;
        }
        self.link.send(Outbound::TaskAccepted {
            task_id: task_id.clone(),
        });
        match gate {
            Some(fence) => {
                // The link task writes the frame first: with its sandbox made ahead the
                // runner is ready at once, and its set-up and first fork (a copy of the
                // daemon's memory map) would hold the one thread (BENCHMARKS.md, issue 45:
                // the accept's p90 fell from ~2 ms to ~0.7 ms).
                tokio::task::yield_now().await;
                fence.resume();
                // Accepted with the link down (an assignment held back and taken now):
                // paused at once, as the link's fence would have it.
                if !self.identified {
                    self.fence_running("the link to the hub is down");
                }
            }
            None => self.queued = Some(task),
        }
    }

    /// The runner of an assignment that could not be persisted, started behind its closed
    /// fence: nothing of it ran. Cancelled and dropped (its files are removed as it ends),
    /// never reported: the refusal says why.
    fn abandon_unaccepted(&mut self, task_id: &str) {
        if let Some(r) = self.running.as_mut().filter(|r| r.task_id == task_id) {
            r.dropped = true;
            r.cancel.cancel();
        }
        self.ops.set_active_task(None);
    }

    /// Answer an assignment we will not run with `task_failed` (via the outbox).
    async fn refuse(&mut self, task: &Task, refusal: Refusal) {
        // The containment refusal carries the layers missing and the fix.
        let reason = match (refusal, self.deps.containment.refusal()) {
            (Refusal::ContainmentUnavailable, Some(why)) => why,
            _ => refusal.reason().to_string(),
        };
        let entry = OutboxEntry {
            task_id: task.task_id.clone(),
            frame: Outbound::task_failed(&task.task_id, task.generation, &reason),
            created_at: now_ms(),
        };
        let (meta, res) = self.store.push(entry, None).await;
        if let Err(e) = res {
            tracing::error!(error = %e, task_id = %task.task_id, "refusal not persisted; sending it from memory");
        }
        self.add_to_outbox(meta).await;
        self.pump_outbox().await;
    }

    /// Stop and forget a task the hub no longer wants us to run.
    pub(super) async fn drop_task(&mut self, task_id: &str) {
        // A paused task's record says how its pause ended (unless the caller said why).
        self.end_fenced(task_id, "the hub took the task back");
        if let Some(r) = self.running.as_mut().filter(|r| r.task_id == task_id) {
            // Its processes are killed as the runner unwinds; nothing is reported for it.
            r.dropped = true;
            r.cancel.cancel();
        }
        // The slot is free now, on disk too: the hub considers this agent idle and may assign
        // the next task before a cancelled runner has finished unwinding.
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.task.task_id == task_id)
        {
            self.active = None;
            self.recovery_deadline = None;
            self.ops.set_active_task(None);
            self.save().await;
            self.status_line();
        }
    }

    /// Start the runner of an accepted task.
    pub(super) fn start(&mut self, task: Task) {
        self.start_runner(task, false, None);
    }

    /// Start the runner of a task not yet accepted, behind its closed fence; the caller
    /// opens the returned fence once `task_accepted` is sent. `ahead`: its directories and
    /// sandbox, made ahead of it.
    fn start_gated(&mut self, task: Task, ahead: Option<runner::Ahead>) -> Fence {
        self.start_runner(task, true, ahead)
    }

    fn start_runner(&mut self, task: Task, gated: bool, ahead: Option<runner::Ahead>) -> Fence {
        let task = Arc::new(task);
        let cancel = CancellationToken::new();
        self.trim_at = None;
        self.renew_ahead_at = None;
        let sink = ProgressSink::new(self.cfg.progress.max_text_bytes);
        sink.emit(ProgressEvent::status("task accepted"));
        self.ops.set_active_task(Some(&task.task_id));
        // The previous task's leftovers go first: a re-assigned task id gets the same
        // TMPDIR, a task on the same repository the same managed clone.
        let before = self.leftovers.take();
        if let Some(a) = self
            .active
            .as_ref()
            .filter(|a| a.task.task_id == task.task_id)
        {
            // The trace kept with the task on disk: a restarted daemon continues it.
            self.deps
                .telemetry
                .resume(&task.task_id, a.trace.as_deref(), a.accepted_at);
        }
        // Every child of the task obeys its fence, and its progress waits behind it.
        let fence = Fence::new();
        if gated {
            fence.pause();
        }
        let mut deps = self.deps.clone();
        deps.env = deps.env.with_fence(fence.clone());
        deps.out = Arc::new(FencedSender {
            inner: deps.out.clone(),
            fence: fence.clone(),
        });
        // Its directories: made ahead, else as recorded with it (a restarted daemon), else
        // named after it.
        let dirs = match ahead {
            Some(ahead) => runner::TaskDirs::made_ahead(ahead),
            None => {
                let recorded = self
                    .active
                    .as_ref()
                    .filter(|a| a.task.task_id == task.task_id)
                    .and_then(|a| a.dirs.as_deref());
                runner::TaskDirs::of(&task, recorded)
            }
        };
        let run = runner::run_task(task.clone(), deps, sink.clone(), cancel.clone(), dirs);
        let handle = tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            run.await
        });
        self.running = Some(Running {
            task_id: task.task_id.clone(),
            cancel,
            handle,
            dropped: false,
            fence: fence.clone(),
            sink,
            paused_at: None,
        });
        // Started after a dropped task's runner ended, with the link down: paused at once.
        if !gated && !self.identified {
            self.fence_running("the link to the hub is down");
        }
        self.status_line();
        fence
    }

    pub(super) async fn task_finished(
        &mut self,
        r: Running,
        res: Result<Finished, tokio::task::JoinError>,
    ) {
        self.ops.set_active_task(None);
        // A dropped task already gave up its slot (maybe to a queued task): leave that alone.
        let owned = self
            .active
            .as_ref()
            .filter(|a| a.task.task_id == r.task_id && !r.dropped)
            .map(|a| a.task.generation);
        let generation = owned.unwrap_or(0);
        if owned.is_some() {
            self.active = None;
        }
        let (outcome, leftovers) = match res {
            Ok(Finished { outcome, leftovers }) => (outcome, Some(leftovers)),
            Err(e) => {
                tracing::error!(task_id = %r.task_id, error = %e, "task runner crashed");
                let failed = Outbound::task_failed(
                    &r.task_id,
                    generation,
                    &format!("sidecar internal error while running the task: {e}"),
                );
                (TaskOutcome::Terminal(failed), None)
            }
        };
        let mut stored = false;
        match outcome {
            _ if r.dropped => {
                tracing::info!(task_id = %r.task_id, "task stopped and dropped as the hub asked");
            }
            TaskOutcome::Cancelled => {
                tracing::info!(task_id = %r.task_id, "task cancelled");
            }
            TaskOutcome::Terminal(mut frame) => {
                // The hub may have moved the generation on while we worked (re-assign).
                match &mut frame {
                    Outbound::TaskComplete { generation: g, .. }
                    | Outbound::TaskFailed { generation: g, .. } => *g = generation,
                    _ => {}
                }
                tracing::info!(task_id = %r.task_id, frame = frame.kind(), "task finished; result stored in the outbox");
                let entry = OutboxEntry {
                    task_id: r.task_id.clone(),
                    frame: frame.clone(),
                    created_at: now_ms(),
                };
                // One durable write for both: the result and the slot it frees.
                let (meta, res) = self.store.push(entry, Some(self.active.clone())).await;
                if let Err(e) = res {
                    tracing::error!(error = %e, task_id = %r.task_id, "result not persisted; sending it from memory");
                }
                self.just_stored = Some((meta.seq, frame));
                self.add_to_outbox(meta).await;
                runner::phase(&r.task_id, "stored");
                stored = true;
            }
        }
        if !stored {
            // Dropped or cancelled: no result, but the freed slot must reach the disk.
            self.save().await;
        }
        // The result on its way first, then the task's files: see [`runner::Leftovers`].
        self.pump_outbox().await;
        if let Some(leftovers) = leftovers {
            self.leftovers = Some(tokio::spawn(leftovers.remove()));
        }
        if let Some(next) = self.queued.take() {
            self.start(next);
        }
        self.status_line();
        // The result is queued on the link: let the link task write it before the next
        // views' holders are forked. A fork copies the daemon's memory map under its lock,
        // and the runtime thread writing the frame waits on it (BENCHMARKS.md, issue 45).
        tokio::task::yield_now().await;
        self.idle_from_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle() -> SlotView<'static> {
        SlotView {
            running: None,
            active: None,
            stopping: false,
            can_confine: true,
        }
    }

    const TAKE_NOW: Assign = Assign::Take {
        replaces_recovering: false,
        after_runner: false,
    };

    #[test]
    fn an_idle_slot_takes_the_task_and_starts_it_now() {
        assert_eq!(decide_assign("t1", 1, idle()), TAKE_NOW);
    }

    #[test]
    fn another_task_while_one_runs_is_held_back_unanswered_even_while_stopping() {
        let running = SlotView {
            running: Some(("t1", false)),
            active: Some(("t1", Phase::Running, 1)),
            ..idle()
        };
        assert_eq!(decide_assign("t2", 1, running), Assign::Hold);
        let stopping = SlotView {
            stopping: true,
            ..running
        };
        assert_eq!(decide_assign("t2", 1, stopping), Assign::Hold);
    }

    #[test]
    fn any_assignment_while_a_task_waits_for_its_recovery_answer_replaces_it() {
        // The hub assigns only to an agent it believes idle: it holds no task here.
        let recovering = SlotView {
            active: Some(("t1", Phase::Recovering, 1)),
            ..idle()
        };
        assert_eq!(
            decide_assign("t2", 1, recovering),
            Assign::Take {
                replaces_recovering: true,
                after_runner: false,
            }
        );
    }

    #[test]
    fn stopping_refuses_even_an_idle_slot_and_wins_over_busy() {
        let stopping = SlotView {
            stopping: true,
            ..idle()
        };
        assert_eq!(
            decide_assign("t1", 1, stopping),
            Assign::Refuse(Refusal::ShuttingDown)
        );
        let recovering_and_stopping = SlotView {
            active: Some(("t1", Phase::Recovering, 1)),
            stopping: true,
            ..idle()
        };
        assert_eq!(
            decide_assign("t2", 1, recovering_and_stopping),
            Assign::Refuse(Refusal::ShuttingDown)
        );
    }

    #[test]
    fn a_daemon_that_cannot_confine_takes_nothing_but_keeps_what_runs() {
        let cannot = SlotView {
            can_confine: false,
            ..idle()
        };
        assert_eq!(
            decide_assign("t1", 1, cannot),
            Assign::Refuse(Refusal::ContainmentUnavailable)
        );
        // The task already running here (re-sent after a reconnect) is not given up.
        let running = SlotView {
            running: Some(("t1", false)),
            active: Some(("t1", Phase::Running, 1)),
            ..cannot
        };
        assert_eq!(decide_assign("t1", 1, running), Assign::Readopt);
    }

    #[test]
    fn the_running_task_assigned_again_is_readopted_even_while_stopping() {
        let running = SlotView {
            running: Some(("t1", false)),
            active: Some(("t1", Phase::Running, 1)),
            ..idle()
        };
        assert_eq!(decide_assign("t1", 1, running), Assign::Readopt);
        let stopping = SlotView {
            stopping: true,
            ..running
        };
        assert_eq!(decide_assign("t1", 1, stopping), Assign::Readopt);
    }

    #[test]
    fn a_dropped_task_assigned_again_waits_for_its_runner_to_end() {
        // The hub cancelled t1 (the slot is free, its runner winds down) and sends it again.
        let winding_down = SlotView {
            running: Some(("t1", true)),
            ..idle()
        };
        let queued = Assign::Take {
            replaces_recovering: false,
            after_runner: true,
        };
        assert_eq!(decide_assign("t1", 1, winding_down), queued);
        assert_eq!(decide_assign("t2", 1, winding_down), queued);
    }

    #[test]
    fn the_recovering_task_handed_back_is_taken_after_any_runner_left() {
        let recovering = SlotView {
            active: Some(("t1", Phase::Recovering, 1)),
            ..idle()
        };
        assert_eq!(
            decide_assign("t1", 1, recovering),
            Assign::Take {
                replaces_recovering: true,
                after_runner: false,
            }
        );
        let still_winding_down = SlotView {
            running: Some(("t0", true)),
            ..recovering
        };
        assert_eq!(
            decide_assign("t1", 1, still_winding_down),
            Assign::Take {
                replaces_recovering: true,
                after_runner: true,
            }
        );
    }

    #[test]
    fn an_assignment_older_than_the_generation_held_is_stale_running_or_recovering() {
        for phase in [Phase::Recovering, Phase::Running] {
            let held = SlotView {
                running: (phase == Phase::Running).then_some(("t1", false)),
                active: Some(("t1", phase, 5)),
                ..idle()
            };
            assert_eq!(decide_assign("t1", 3, held), Assign::Stale { held: 5 });
            // Even while stopping: it is not run, and not answered either.
            let stopping = SlotView {
                stopping: true,
                ..held
            };
            assert_eq!(decide_assign("t1", 4, stopping), Assign::Stale { held: 5 });
        }
        // The same generation or a newer one is an assignment as before.
        let recovering = SlotView {
            active: Some(("t1", Phase::Recovering, 5)),
            ..idle()
        };
        for g in [5, 7] {
            assert_eq!(
                decide_assign("t1", g, recovering),
                Assign::Take {
                    replaces_recovering: true,
                    after_runner: false,
                }
            );
        }
        let running = SlotView {
            running: Some(("t1", false)),
            active: Some(("t1", Phase::Running, 5)),
            ..idle()
        };
        assert_eq!(decide_assign("t1", 7, running), Assign::Readopt);
        // Another task's generation says nothing about this one.
        assert_eq!(decide_assign("t2", 1, running), Assign::Hold);
    }

    #[test]
    fn refusal_reasons_are_the_wire_strings_the_hub_knows() {
        assert_eq!(Refusal::ShuttingDown.reason(), "sidecar_shutting_down");
        assert!(Refusal::StateNotPersistable
            .reason()
            .starts_with("state_not_persistable"));
    }
}
