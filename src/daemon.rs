//! The daemon: one actor that owns the task state and reacts to the hub link, the runner
//! and shutdown signals.
//!
//! Invariants it keeps:
//! - at most one task is active; it is on disk before `task_accepted` is sent;
//! - a terminal frame is in the on-disk outbox before it is sent, and leaves the outbox only
//!   when the hub answers it (`task_ack`, or a final `task_*_failed` error);
//! - outbox frames are sent one at a time, each followed by a barrier ping, so an answer can
//!   be matched to its frame even though the hub's error replies carry no task id; which
//!   entry goes next (newest first, a miss waits, bound, expiry) is [`crate::outbox`]'s rule;
//! - shutdown drains (finish the task, deliver its result) before it stops, unless forced.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::hub::budget::RateBudget;
use crate::hub::link::{self, LinkEvent, LinkHandle};
use crate::hub::proto::{Inbound, Outbound};
use crate::ops::Ops;
use crate::outbox::{Next, Outbox};
use crate::process::ChildEnv;
use crate::progress::{ProgressEvent, ProgressSink};
use crate::recorder::Recorder;
use crate::redact::Redactor;
use crate::runner::{self, RunnerDeps, TaskOutcome};
use crate::state::{ActiveTask, OutboxEntry, OutboxMeta, Phase, StateStore};
use crate::task::Task;
use crate::util::now_ms;

/// The two stages of stopping. `drain`: take no new task, finish the current one, deliver
/// its result, exit. `abort`: cancel the current task, keep it on disk for recovery, exit.
#[derive(Clone, Default)]
pub struct Shutdown {
    pub drain: CancellationToken,
    pub abort: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown::default()
    }
}

/// Why [`run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// Drained after a stop request.
    Drained,
    /// Forced stop: the task (if any) is kept for `task_recovering`.
    Aborted,
    /// The hub asked for a restart (`restart_sidecar`); systemd starts us again.
    RestartRequested,
}

/// How long a drain waits for the outbox to empty after the task finished.
const OUTBOX_FLUSH: Duration = Duration::from_secs(10);
/// How long `task_recovering` may go unanswered before the task is dropped. The hub
/// re-queues a task on any disconnect anyway; waiting forever would refuse every new
/// assignment as `sidecar_busy`.
const RECOVERY_ANSWER: Duration = Duration::from_secs(60);

/// Run the daemon until shutdown. `ops` receives metrics and health.
pub async fn run(cfg: Config, shutdown: Shutdown, ops: Ops) -> anyhow::Result<ExitReason> {
    let cfg = Arc::new(cfg);
    let store = StateStore::new(cfg.state_file());
    let loaded = store.load().await.with_context(|| {
        format!(
            "loading state from {}; fix its permissions or move it away",
            store.path().display()
        )
    })?;
    if let Some((aside, error)) = &loaded.corrupt {
        tracing::error!(
            file = %store.path().display(),
            moved_to = %aside.display(),
            error = %error,
            "state file was corrupt: moved aside and starting with empty state; inspect the saved copy"
        );
    }
    if let Some((aside, bytes)) = &loaded.torn {
        tracing::warn!(
            file = %store.path().display(),
            kept_in = %aside.display(),
            bytes,
            "state file ended in a half-written change (a crash mid-write): kept those bytes aside; the state is what the complete changes say"
        );
    }
    if loaded.upgraded {
        tracing::info!(file = %store.path().display(), "state file converted to the journal format");
    }
    let mut active = loaded.active;
    if let Some(active) = &mut active {
        tracing::warn!(task_id = %active.task.task_id, "found an unfinished task from a previous run; will ask the hub with task_recovering");
        active.phase = Phase::Recovering;
    }
    if let Err(e) = store.set_active(active.clone()).await {
        tracing::error!(error = %e, "state directory is not writable: tasks will be refused until it is");
    }
    let outbox = Outbox::new(
        cfg.outbox_max_entries,
        Duration::from_secs(cfg.outbox_expiry_secs),
    );

    let budget = Arc::new(RateBudget::from_config(&cfg.progress));
    let (handle, out_rx) = link::channel();
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    let link_cancel = CancellationToken::new();
    let link_task = tokio::spawn(link::run(
        cfg.clone(),
        budget.clone(),
        ev_tx,
        out_rx,
        ops.clone(),
        link_cancel.clone(),
    ));
    let redactor = Arc::new(Redactor::from_config(&cfg));
    let containment = Arc::new(crate::sandbox::Policy::probe_and_decide(&cfg).await);
    let (recorder, recorder_writer) =
        Recorder::start(crate::recorder::root(&cfg.state_dir), cfg.recorder.clone());
    let ledger = Arc::new(crate::spend::SpendLedger::open(cfg.state_dir.join("spend.json")).await);
    ops.set_daily_spend(ledger.clone(), cfg.verification.max_cost_usd_per_day);
    let deps = RunnerDeps {
        config: cfg.clone(),
        env: ChildEnv::from_config(&cfg),
        redactor,
        budget,
        out: Arc::new(handle.clone()),
        ops: ops.clone(),
        recorder,
        containment,
        ledger,
    };
    let mut d = Daemon {
        cfg,
        store,
        active,
        outbox,
        link: handle,
        deps,
        ops,
        events: ev_rx,
        running: None,
        identified: false,
        inflight: None,
        outbox_retry_at: None,
        draining: false,
        drain_deadline: None,
        flush_deadline: None,
        restart_requested: false,
        recovery_deadline: None,
        queued: None,
    };
    for meta in loaded.outbox {
        d.add_to_outbox(meta).await;
    }
    if !d.outbox.is_empty() {
        tracing::info!(
            pending = d.outbox.len(),
            "results from a previous run wait for the hub's acknowledgement"
        );
    }
    let reason = d.run(&shutdown).await;
    d.ops.stopping();
    link_cancel.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), link_task).await;
    // The recorder's writer ends once its last handle is gone: let it write its last lines.
    drop(d);
    let _ = tokio::time::timeout(Duration::from_secs(5), recorder_writer).await;
    Ok(reason)
}

/// The task being worked on now.
struct Running {
    task_id: String,
    cancel: CancellationToken,
    handle: JoinHandle<TaskOutcome>,
    /// The hub took the task back (cancelled, reassigned, aborted): send nothing for it.
    dropped: bool,
}

struct Daemon {
    cfg: Arc<Config>,
    store: StateStore,
    /// The task this daemon works on, as on disk.
    active: Option<ActiveTask>,
    /// Terminal frames waiting for the hub's answer (frames stay on disk in the store).
    outbox: Outbox,
    link: LinkHandle,
    deps: RunnerDeps,
    ops: Ops,
    events: mpsc::Receiver<LinkEvent>,
    running: Option<Running>,
    identified: bool,
    /// The outbox entry sent on this connection and not yet answered.
    inflight: Option<OutboxMeta>,
    /// When to look at the outbox again (an entry waits after a miss).
    outbox_retry_at: Option<Instant>,
    draining: bool,
    drain_deadline: Option<Instant>,
    /// Set once a drain has nothing left to run: how long the outbox may take.
    flush_deadline: Option<Instant>,
    restart_requested: bool,
    /// When an unanswered `task_recovering` gives up.
    recovery_deadline: Option<Instant>,
    /// Accepted while a dropped task's runner was still winding down; starts when it ends,
    /// so two tasks never share the workspace.
    queued: Option<Task>,
}

async fn join_running(r: &mut Option<Running>) -> Result<TaskOutcome, tokio::task::JoinError> {
    match r {
        Some(r) => (&mut r.handle).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl Daemon {
    async fn run(&mut self, shutdown: &Shutdown) -> ExitReason {
        self.ops.status("connecting to the hub");
        loop {
            tokio::select! {
                biased;
                _ = shutdown.abort.cancelled() => {
                    self.abort().await;
                    return ExitReason::Aborted;
                }
                _ = sleep_until_opt(self.drain_deadline) => {
                    tracing::warn!(drain_timeout_secs = self.cfg.drain_timeout_secs, "drain timeout reached; cancelling the task and keeping it for recovery");
                    self.abort().await;
                    return ExitReason::Aborted;
                }
                _ = shutdown.drain.cancelled(), if !self.draining => {
                    tracing::info!(running = self.running.is_some(), "stop requested: draining (no new tasks; the current one may finish)");
                    self.draining = true;
                    self.drain_deadline = Some(Instant::now() + Duration::from_secs(self.cfg.drain_timeout_secs));
                    self.ops.status("draining");
                }
                res = join_running(&mut self.running) => {
                    let r = self.running.take().expect("joined a running task");
                    self.task_finished(r, res).await;
                }
                ev = self.events.recv() => match ev {
                    Some(ev) => self.on_link_event(ev).await,
                    None => {
                        tracing::error!("hub link task ended unexpectedly");
                        self.abort().await;
                        return ExitReason::Aborted;
                    }
                },
                _ = sleep_until_opt(self.outbox_retry_at) => {
                    self.outbox_retry_at = None;
                    self.pump_outbox().await;
                }
                _ = sleep_until_opt(self.recovery_deadline) => {
                    self.recovery_deadline = None;
                    if let Some(a) = self.active.as_ref().filter(|a| a.phase == Phase::Recovering) {
                        let task_id = a.task.task_id.clone();
                        tracing::warn!(task_id = %task_id, "no answer to task_recovering in time; dropping the task (the hub re-queues it)");
                        self.drop_task(&task_id).await;
                    }
                }
                _ = sleep_until_opt(self.flush_deadline) => {
                    tracing::warn!(pending = self.outbox.len(), "outbox not flushed in time; results stay on disk and are re-sent on the next start");
                    return self.idle_exit_reason();
                }
            }
            if (self.draining || self.restart_requested) && self.running.is_none() {
                if self.outbox.is_empty() {
                    return self.idle_exit_reason();
                }
                self.flush_deadline
                    .get_or_insert_with(|| Instant::now() + OUTBOX_FLUSH);
            }
        }
    }

    fn idle_exit_reason(&self) -> ExitReason {
        if self.draining {
            ExitReason::Drained
        } else {
            ExitReason::RestartRequested
        }
    }

    /// Write the active task to disk; `false` (logged) when it could not be.
    async fn save(&self) -> bool {
        match self.store.set_active(self.active.clone()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "state not persisted");
                false
            }
        }
    }

    async fn on_link_event(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Identified { epoch } => {
                self.link.set_epoch(epoch);
                self.identified = true;
                self.inflight = None;
                self.ops.ready();
                self.after_identify().await;
            }
            LinkEvent::Disconnected { reason } => {
                tracing::debug!(reason = %reason, "link down");
                self.identified = false;
                self.inflight = None;
                self.ops.status("reconnecting to the hub");
            }
            LinkEvent::Barrier { task_id } => {
                if let Some(m) = self.inflight.take_if(|m| m.task_id == task_id) {
                    // The hub answered the ping after our frame but not the frame: it was
                    // dropped (rate limit). It waits (longer each time) while others go.
                    self.outbox.missed(m.seq, Instant::now());
                    tracing::warn!(task_id = %task_id, "terminal frame went unanswered; will re-send it");
                    self.pump_outbox().await;
                }
            }
            LinkEvent::Frame(frame) => self.on_frame(frame).await,
        }
    }

    /// After each `identified`: `task_accepted` (see [`accepted_after_identify`]), recovery
    /// question, state report, outbox.
    async fn after_identify(&mut self) {
        let running = self
            .running
            .as_ref()
            .filter(|r| !r.dropped)
            .map(|r| r.task_id.as_str());
        for task_id in
            accepted_after_identify(running, self.outbox.iter().map(|m| m.task_id.as_str()))
        {
            self.link.send(Outbound::TaskAccepted { task_id });
        }
        if let Some(active) = &self.active {
            let task = &active.task;
            match active.phase {
                Phase::Recovering if self.running.is_none() => {
                    self.link.send(Outbound::TaskRecovering {
                        task_id: task.task_id.clone(),
                        generation: task.generation,
                    });
                    self.recovery_deadline = Some(Instant::now() + RECOVERY_ANSWER);
                }
                _ if self.running.is_some() => {
                    self.link.send(Outbound::StateReport {
                        task_id: task.task_id.clone(),
                        status: "working".into(),
                        generation: task.generation,
                        assigned_at: task.assigned_at,
                    });
                }
                _ => {}
            }
        }
        self.status_line();
        self.pump_outbox().await;
    }

    fn status_line(&self) {
        match &self.active {
            Some(a) => self
                .ops
                .status(&format!("connected, running task {}", a.task.task_id)),
            None => self.ops.status("connected, idle"),
        }
    }

    async fn on_frame(&mut self, frame: Inbound) {
        match frame {
            Inbound::TaskAssign(task) => self.on_assign(*task).await,
            Inbound::TaskCancelled { task_id } => {
                tracing::info!(task_id = %task_id, "hub cancelled the task");
                self.drop_task(&task_id).await;
            }
            Inbound::TaskReassign { task_id } => {
                tracing::info!(task_id = %task_id, "hub re-queued the task; dropping it");
                self.drop_task(&task_id).await;
            }
            Inbound::StateReportAck { task_id, action } => {
                if action == "abort" {
                    tracing::warn!(task_id = %task_id, "hub says abort the task");
                    self.drop_task(&task_id).await;
                }
            }
            Inbound::TaskContinue {
                task_id,
                generation,
            } => self.on_continue(&task_id, generation).await,
            Inbound::RestartSidecar { reason } => {
                tracing::info!(reason = ?reason, "hub asked for a restart; exiting once idle");
                self.restart_requested = true;
            }
            Inbound::TaskAck { task_id, status } => {
                if status.as_deref() == Some("accepted") {
                    return;
                }
                let gone = self.outbox.remove_task(&task_id);
                self.inflight.take_if(|m| m.task_id == task_id);
                if !gone.is_empty() {
                    tracing::info!(task_id = %task_id, status = ?status, "result acknowledged by the hub");
                    self.deps.recorder.acked(&task_id, status.as_deref());
                    self.forget(gone).await;
                }
                self.pump_outbox().await;
            }
            Inbound::Error {
                error,
                message_type,
                ..
            } => {
                if error.starts_with("task_complete_failed")
                    || error.starts_with("task_fail_failed")
                {
                    if let Some(m) = self.inflight.take() {
                        tracing::error!(task_id = %m.task_id, error = %error, "hub refused the result for good (stale generation or unknown task); dropping it");
                        self.outbox.remove_seq(m.seq);
                        self.forget(vec![m.seq]).await;
                        self.pump_outbox().await;
                    }
                } else {
                    tracing::warn!(error = %error, message_type = ?message_type, "hub reported an error");
                }
            }
            Inbound::RateLimited { .. } => {}
            other => tracing::debug!(frame = ?other, "hub frame needs no action"),
        }
    }

    async fn on_assign(&mut self, task: Task) {
        let task_id = task.task_id.clone();
        tracing::info!(task_id = %task_id, generation = task.generation, "task assigned");
        if let (Some(r), Some(active)) = (&self.running, &mut self.active) {
            if !r.dropped && r.task_id == task_id && active.task.task_id == task_id {
                // The hub re-assigned the task we are already running (after a reconnect):
                // keep the work, adopt the new generation.
                active.task.generation = task.generation;
                self.save().await;
                self.link.send(Outbound::TaskAccepted { task_id });
                return;
            }
        }
        // Shutting down wins over busy: the hub should not expect this agent back soon.
        if self.draining || self.restart_requested {
            return self.refuse(&task, "sidecar_shutting_down").await;
        }
        if self.running.is_none()
            && self
                .active
                .as_ref()
                .is_some_and(|a| a.task.task_id == task_id && a.phase == Phase::Recovering)
        {
            // The hub re-queued the task we were about to ask about and hands it back: that
            // is its answer. Run it at the new generation (not "busy" with our own task).
            tracing::info!(task_id = %task_id, generation = task.generation, "recovering task assigned again: running it");
            self.active = None;
            self.recovery_deadline = None;
        }
        if self.active.is_some() {
            tracing::warn!(task_id = %task_id, "busy with another task: refusing");
            return self.refuse(&task, "sidecar_busy").await;
        }
        // A fresh assignment starts a fresh attempt count and task budget (only
        // `task_continue` resumes them); the day's spend stays.
        self.deps.ledger.finish_task(&task_id).await;
        self.active = Some(ActiveTask {
            task: task.clone(),
            phase: Phase::Running,
            accepted_at: now_ms(),
        });
        if !self.save().await {
            self.active = None;
            tracing::error!(task_id = %task_id, state_file = %self.store.path().display(), "cannot persist the task, so not accepting it");
            return self
                .refuse(
                    &task,
                    "state_not_persistable: the sidecar cannot write its state file",
                )
                .await;
        }
        self.link.send(Outbound::TaskAccepted {
            task_id: task_id.clone(),
        });
        if self.running.is_some() {
            // A dropped task is still being killed: start right after it is gone.
            self.queued = Some(task);
        } else {
            self.start(task);
        }
    }

    /// Answer an assignment we will not run with `task_failed` (via the outbox).
    async fn refuse(&mut self, task: &Task, reason: &str) {
        let entry = OutboxEntry {
            task_id: task.task_id.clone(),
            frame: Outbound::task_failed(&task.task_id, task.generation, reason),
            created_at: now_ms(),
        };
        let (meta, res) = self.store.push(entry, None).await;
        if let Err(e) = res {
            tracing::error!(error = %e, task_id = %task.task_id, "refusal not persisted; sending it from memory");
        }
        self.add_to_outbox(meta).await;
        self.pump_outbox().await;
    }

    async fn on_continue(&mut self, task_id: &str, generation: Option<u64>) {
        let Some(active) = &mut self.active else {
            return;
        };
        if active.task.task_id != task_id
            || active.phase != Phase::Recovering
            || self.running.is_some()
        {
            return;
        }
        if let Some(g) = generation {
            active.task.generation = g;
        }
        active.phase = Phase::Running;
        self.recovery_deadline = None;
        let task = active.task.clone();
        tracing::info!(task_id = %task_id, generation = task.generation, "hub says continue: running the task again");
        self.save().await;
        self.start(task);
        // A restarted hub's AgentFSM waits in `assigned`; `task_continue` does not move it.
        self.link.send(Outbound::TaskAccepted {
            task_id: task_id.to_string(),
        });
    }

    /// Stop and forget a task the hub no longer wants us to run.
    async fn drop_task(&mut self, task_id: &str) {
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

    fn start(&mut self, task: Task) {
        let task = Arc::new(task);
        let cancel = CancellationToken::new();
        let sink = ProgressSink::new(self.cfg.progress.max_text_bytes);
        sink.emit(ProgressEvent::status("task accepted"));
        self.ops.set_active_task(Some(&task.task_id));
        let handle = tokio::spawn(runner::run_task(
            task.clone(),
            self.deps.clone(),
            sink,
            cancel.clone(),
        ));
        self.running = Some(Running {
            task_id: task.task_id.clone(),
            cancel,
            handle,
            dropped: false,
        });
        self.status_line();
    }

    async fn task_finished(
        &mut self,
        r: Running,
        res: Result<TaskOutcome, tokio::task::JoinError>,
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
        let outcome = match res {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(task_id = %r.task_id, error = %e, "task runner crashed");
                TaskOutcome::Terminal(Outbound::task_failed(
                    &r.task_id,
                    generation,
                    &format!("sidecar internal error while running the task: {e}"),
                ))
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
                    frame,
                    created_at: now_ms(),
                };
                // One durable write for both: the result and the slot it frees.
                let (meta, res) = self.store.push(entry, Some(self.active.clone())).await;
                if let Err(e) = res {
                    tracing::error!(error = %e, task_id = %r.task_id, "result not persisted; sending it from memory");
                }
                self.add_to_outbox(meta).await;
                stored = true;
            }
        }
        if !stored {
            // Dropped or cancelled: no result, but the freed slot must reach the disk.
            self.save().await;
        }
        if let Some(next) = self.queued.take() {
            self.start(next);
        }
        self.status_line();
        self.pump_outbox().await;
    }

    /// Track a stored entry for delivery, dropping (and saying so) what falls past the bound.
    async fn add_to_outbox(&mut self, meta: OutboxMeta) {
        let dropped = self.outbox.push(meta);
        for m in &dropped {
            tracing::error!(
                task_id = %m.task_id,
                age_secs = (now_ms() - m.created_at) / 1000,
                max_entries = self.cfg.outbox_max_entries,
                "outbox full: dropped the oldest undelivered result; the hub has not acknowledged results for a while: check the hub link, or raise outbox_max_entries"
            );
        }
        if !dropped.is_empty() {
            self.forget(dropped.into_iter().map(|m| m.seq).collect())
                .await;
        }
    }

    /// Delete entries from the store (they already left the in-memory outbox).
    async fn forget(&mut self, seqs: Vec<u64>) {
        if let Err(e) = self.store.remove(seqs).await {
            tracing::error!(error = %e, "outbox change not persisted; the result may be sent again after a restart");
        }
    }

    /// Send the next outbox entry if nothing is in flight.
    async fn pump_outbox(&mut self) {
        if !self.identified || self.inflight.is_some() {
            return;
        }
        let expired = self.outbox.take_expired(now_ms());
        for m in &expired {
            tracing::error!(
                task_id = %m.task_id,
                age_secs = (now_ms() - m.created_at) / 1000,
                outbox_expiry_secs = self.cfg.outbox_expiry_secs,
                "result expired undelivered: dropped (the hub re-queued that task long ago); raise outbox_expiry_secs to keep results longer"
            );
        }
        if !expired.is_empty() {
            self.forget(expired.into_iter().map(|m| m.seq).collect())
                .await;
        }
        loop {
            let meta = match self.outbox.next(Instant::now()) {
                Next::Empty => return,
                Next::WaitUntil(t) => {
                    self.outbox_retry_at = Some(t);
                    return;
                }
                Next::Send(meta) => meta,
            };
            let entry = match self.store.entry(meta.seq).await {
                Ok(Some(entry)) => entry,
                res => {
                    let error = res.err().map(|e| e.to_string()).unwrap_or_default();
                    tracing::error!(task_id = %meta.task_id, error = %error, "cannot read the stored result back; dropping it");
                    self.outbox.remove_seq(meta.seq);
                    self.forget(vec![meta.seq]).await;
                    continue;
                }
            };
            if self.link.send_with_barrier(entry.frame, &meta.task_id) {
                self.inflight = Some(meta);
            } else {
                // The link's queue is full or closed: look again shortly.
                self.outbox_retry_at = Some(Instant::now() + Duration::from_secs(1));
            }
            return;
        }
    }

    /// Forced stop: cancel the task, keep it on disk as recovering.
    async fn abort(&mut self) {
        if let Some(mut r) = self.running.take() {
            tracing::warn!(task_id = %r.task_id, "forced stop: cancelling the running task; it will be reported with task_recovering on the next start");
            r.cancel.cancel();
            let grace =
                Duration::from_millis(self.cfg.executor.kill_grace_ms) + Duration::from_secs(2);
            match tokio::time::timeout(grace, &mut r.handle).await {
                Ok(_) => {}
                Err(_) => r.handle.abort(),
            }
        }
        // Whatever is still active (the running task, or one queued behind a dropped task)
        // was not finished: the next start asks the hub about it.
        self.queued = None;
        if let Some(a) = &mut self.active {
            a.phase = Phase::Recovering;
        }
        self.save().await;
    }
}

/// Which tasks get `task_accepted` right after `identified` (PROTOCOL.md § 8): the task still
/// running here and every task whose terminal frame waits in the outbox, once each, running
/// task first. A hub that restarted puts its AgentFSM in `assigned` for such a task with a
/// 60 s acceptance timer, and only `task_accepted` moves it to `working`: without it the hub
/// reclaims a task that is still running (generation + 1) or leaves the agent unusable. A hub
/// that did not restart merely logs `fsm_unexpected_task_accepted`; it never rejects it.
fn accepted_after_identify<'a>(
    running: Option<&str>,
    outboxed: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let mut ids: Vec<String> = running.map(str::to_string).into_iter().collect();
    for id in outboxed {
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_string());
        }
    }
    ids
}
