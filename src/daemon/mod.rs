//! The daemon: one actor that owns the task state and reacts to the hub link, the runner
//! and shutdown signals.
//!
//! Invariants it keeps:
//! - at most one task is active; it is on disk before `task_accepted` is sent;
//! - a task runs only at a generation accepted from an assignment addressed to this agent,
//!   never at one a `task_continue` carries (see `recovery.rs`);
//! - a terminal frame is in the on-disk outbox before it is sent, and leaves the outbox only
//!   when the hub answers it (`task_ack`, or a final `task_*_failed` error);
//! - outbox frames are sent one at a time, each followed by a barrier ping, so an answer can
//!   be matched to its frame even though the hub's error replies carry no task id; which
//!   entry goes next (newest first, a miss waits, bound, expiry) is [`crate::outbox`]'s rule;
//! - shutdown drains (finish the task, deliver its result) before it stops, unless forced.
//!
//! Layout, one job per file:
//! - `mod.rs`: start-up ([`run`]), the select loop and the dispatch of link events and frames;
//! - `slot.rs`: the task slot: the assignment rule (`decide_assign`), start, finish, drop;
//! - `recovery.rs`: the hub's answers about a task held from before (`task_continue`,
//!   `state_report_ack`): a generation this sidecar did not accept is never run;
//! - `delivery.rs`: terminal frames from the outbox to the hub and their answers;
//! - `fencing.rs`: the running task paused while the link is down, and assignments held
//!   back while a task runs (the hub's view of this agent kept true);
//! - `shutdown.rs`: [`Shutdown`], [`ExitReason`] and the forced stop.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::hub::budget::RateBudget;
use crate::hub::link::{self, LinkEvent, LinkHandle};
use crate::hub::proto::{Inbound, Outbound};
use crate::ops::Ops;
use crate::outbox::Outbox;
use crate::process::ChildEnv;
use crate::recorder::Recorder;
use crate::redact::Redactor;
use crate::runner::{self, RunnerDeps};
use crate::sandbox::Policy;
use crate::state::{ActiveTask, OutboxMeta, Phase, StateStore};
use crate::task::Task;

mod containment;
mod delivery;
mod fencing;
mod recovery;
mod shutdown;
mod slot;
#[cfg(test)]
mod tests;

use containment::ProbeStage;
use delivery::accepted_after_identify;
use recovery::Asked;
use shutdown::{wait_unless_immediate, OUTBOX_FLUSH};
pub use shutdown::{ExitReason, Shutdown};
use slot::{join_running, Running};

/// How long `task_recovering` may go unanswered before the task is dropped. The hub
/// re-queues a task on any disconnect anyway; waiting forever would refuse every new
/// assignment as `sidecar_busy`.
const RECOVERY_ANSWER: Duration = Duration::from_secs(60);

/// First and longest wait before the containment probe is run again while a strict daemon
/// cannot confine: an operator's fix (a sysctl, a drop-in relaxed) takes effect within
/// this without a restart, and a broken machine is not probed in a tight loop.
const REPROBE_FIRST: Duration = Duration::from_secs(2);
const REPROBE_MAX: Duration = Duration::from_secs(300);

/// Run the daemon until shutdown. `ops` receives metrics and health.
pub async fn run(cfg: Config, shutdown: Shutdown, ops: Ops) -> anyhow::Result<ExitReason> {
    let redactor = Arc::new(ChildEnv::from_config(&cfg).redactor(&cfg).await);
    run_with(cfg, shutdown, ops, redactor).await
}

/// [`run`] with the redactor of every credential the daemon holds already built (the
/// caller's logs scrub with the same one: the agent's login files are read once).
pub async fn run_with(
    cfg: Config,
    shutdown: Shutdown,
    ops: Ops,
    redactor: Arc<Redactor>,
) -> anyhow::Result<ExitReason> {
    let cfg = Arc::new(cfg);
    // On the way to `identify` only the connection runs (BENCHMARKS.md, figure 1); the
    // state file is read meanwhile (file I/O on the blocking pool, no CPU to speak of). The
    // containment probe (it forks a namespace holder and a test child) starts once the
    // first attempt to identify is over, and the daemon handles no frame until it has
    // answered (see `containment.rs`); the state is written back before that too.
    let budget = Arc::new(RateBudget::from_config(&cfg.progress));
    let (handle, out_rx) = link::channel();
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    // What `identify` announces: `idle` until the probe says otherwise (a status frame then
    // corrects what the first identify said, see `containment.rs`).
    let (announce, announced) = watch::channel(Some(containment::announcement(None)));
    let steering = handle.steering(announced);
    let (first_attempt, after_first) = tokio::sync::oneshot::channel();
    let link_cancel = CancellationToken::new();
    // Boxed: the link's future is large, and built on the stack it would stay there as
    // stack pages touched once and resident for the daemon's life.
    let link_task = tokio::spawn(Box::pin(link::run(
        cfg.clone(),
        budget.clone(),
        ev_tx,
        out_rx,
        ops.clone(),
        steering,
        first_attempt,
        link_cancel.clone(),
    )));
    let state = match load_state(&cfg).await {
        Ok(state) => state,
        Err(e) => {
            link_cancel.cancel();
            wait_unless_immediate(&shutdown.immediate, Duration::from_secs(5), link_task).await;
            return Err(e);
        }
    };
    let link = Link {
        handle,
        events: ev_rx,
        announce,
        budget,
    };
    let probe = ProbeStage::Waiting(after_first);
    let (mut d, recorder_writer) =
        Daemon::new(cfg, shutdown.clone(), ops, link, state, probe, redactor).await;
    d.write_back().await;
    let reason = d.run().await;
    if let Some(leftovers) = d.leftovers.take() {
        wait_unless_immediate(&shutdown.immediate, Duration::from_secs(5), leftovers).await;
    }
    // What was made ahead for a next task that will not come here: gone with the daemon.
    let ahead = d.ahead.clone();
    let unused = tokio::task::spawn_blocking(move || ahead.close());
    wait_unless_immediate(&shutdown.immediate, Duration::from_secs(5), unused).await;
    d.ops.stopping();
    link_cancel.cancel();
    // An immediate stop waits for neither the link's goodbye nor the recorder's last lines.
    wait_unless_immediate(&shutdown.immediate, Duration::from_secs(5), link_task).await;
    // The last spans (the task just finished, its delivery) go out before exit; a
    // collector that hangs holds the exit no longer than the recorder may.
    let telemetry = d.deps.telemetry.clone();
    // The recorder's writer ends once its last handle is gone: let it write its last lines.
    drop(d);
    if telemetry.is_enabled() {
        let flush = tokio::task::spawn_blocking(move || telemetry.shutdown(Duration::from_secs(5)));
        wait_unless_immediate(&shutdown.immediate, Duration::from_secs(6), flush).await;
    }
    wait_unless_immediate(&shutdown.immediate, Duration::from_secs(5), recorder_writer).await;
    Ok(reason)
}

/// What the state file held at start, after [`load_state`] reported on it (not yet written
/// back: see [`Daemon::write_back`]).
struct LoadedState {
    store: StateStore,
    /// The unfinished task of a previous run, already marked [`Phase::Recovering`].
    active: Option<ActiveTask>,
    /// Results that still wait for the hub, oldest first.
    outbox: Vec<OutboxMeta>,
}

/// Load the state file and log what was wrong with it (corrupt, torn, old format). Only an
/// unreadable file is an error.
async fn load_state(cfg: &Config) -> anyhow::Result<LoadedState> {
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
    Ok(LoadedState {
        store,
        active,
        outbox: loaded.outbox,
    })
}

/// The daemon's side of the hub link: frames out, events in, and what `identify` announces.
struct Link {
    handle: LinkHandle,
    events: mpsc::Receiver<LinkEvent>,
    announce: watch::Sender<Option<String>>,
    /// The link's outgoing rate budget, which the runners' progress spends too.
    budget: Arc<RateBudget>,
}

struct Daemon {
    cfg: Arc<Config>,
    /// The caller's stop requests; the select loop and the forced stop observe them.
    shutdown: Shutdown,
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
    /// The last task's TMPDIR and workspace being removed, after its result was sent. The
    /// next runner waits for it; so does the daemon's exit.
    leftovers: Option<JoinHandle<()>>,
    identified: bool,
    /// The outbox entry sent on this connection and not yet answered.
    inflight: Option<OutboxMeta>,
    /// The result stored last, with its outbox sequence number, until its first send:
    /// that send need not read it back from the state file.
    just_stored: Option<(u64, Outbound)>,
    /// When to look at the outbox again (an entry waits after a miss).
    outbox_retry_at: Option<Instant>,
    draining: bool,
    drain_deadline: Option<Instant>,
    /// Set once a drain has nothing left to run: how long the outbox may take.
    flush_deadline: Option<Instant>,
    restart_requested: bool,
    /// When an unanswered `task_recovering` gives up.
    recovery_deadline: Option<Instant>,
    /// When the task paused by a dropped link is killed for want of an answer.
    fence_deadline: Option<Instant>,
    /// Assignments that arrived while a task ran, not answered (see `fencing.rs`).
    held_back: Vec<Task>,
    /// A reconnect asked for (to ask about `held_back`) and not identified yet.
    resyncing: bool,
    /// `state_report`s sent on this connection and not answered yet.
    asked: Vec<Asked>,
    /// Accepted while a dropped task's runner was still winding down; starts when it ends,
    /// so two tasks never share the workspace.
    queued: Option<Task>,
    /// The agent status `identify` announces (`idle`, or why no task is taken).
    announce: watch::Sender<Option<String>>,
    /// The containment probe until it has answered (no frame is handled before).
    probe: ProbeStage,
    /// The next task's directories and sandbox, made while idle (`runner::ahead`).
    ahead: Arc<runner::AheadPool>,
    /// When an idle daemon makes them anew (`runner::RENEW_EVERY`).
    renew_ahead_at: Option<Instant>,
    /// When to probe containment again (only while strict containment is unavailable).
    reprobe_at: Option<Instant>,
    /// When to give free heap pages back (see [`trim_heap`]): set when the daemon goes
    /// idle, cleared when a task starts.
    trim_at: Option<Instant>,
    /// The wait before the probe after that one.
    reprobe_delay: Duration,
}

/// How long the daemon must have been idle before it gives free heap pages back: tasks
/// back to back would only fault the same pages in again.
const TRIM_AFTER_IDLE: Duration = Duration::from_secs(2);

/// Give the allocator's free pages back to the system, once the daemon has been idle for
/// [`TRIM_AFTER_IDLE`]. A task leaves free memory scattered through the heap that glibc
/// keeps mapped (it returns only a free top above 128 KiB by itself); `malloc_trim` releases
/// every free page: after a 1.2 MB output task, 1.7 MB of anonymous memory stays instead of
/// 2.2 MB. Off the runtime: it walks the allocator's arenas.
async fn trim_heap() {
    let _ = tokio::task::spawn_blocking(|| {
        // SAFETY: malloc_trim only walks the allocator's own free lists, under its locks.
        #[allow(unsafe_code)]
        unsafe {
            libc::malloc_trim(0);
        }
    })
    .await;
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl Daemon {
    /// The daemon around a link (`link` to send, `events` to hear), holding what
    /// [`load_state`] found, taking work as the containment `probe` decides once it has
    /// answered (see `containment.rs`), scrubbing what
    /// leaves with `redactor`. Also returns the recorder's writer, which ends once the daemon
    /// (and every runner's handle on the recorder) is dropped.
    async fn new(
        cfg: Arc<Config>,
        shutdown: Shutdown,
        ops: Ops,
        link: Link,
        state: LoadedState,
        probe: ProbeStage,
        redactor: Arc<Redactor>,
    ) -> (Daemon, JoinHandle<()>) {
        let Link {
            handle: link,
            events,
            announce,
            budget,
        } = link;
        let outbox = Outbox::new(
            cfg.outbox_max_entries,
            Duration::from_secs(cfg.outbox_expiry_secs),
        );
        let env = ChildEnv::from_config(&cfg);
        let (recorder, recorder_writer) = Recorder::start_counted(
            crate::recorder::root(&cfg.state_dir),
            cfg.recorder.clone(),
            Some(ops.metrics().recorder_gauges()),
        );
        let ledger =
            Arc::new(crate::spend::SpendLedger::open(cfg.state_dir.join("spend.json")).await);
        // Until the probe answers (no task starts before: see `containment.rs`): what a
        // machine that cannot confine would be, never more.
        let containment = Arc::new(Policy::decide(
            cfg.containment,
            crate::sandbox::Support::none(),
        ));
        let telemetry =
            crate::telemetry::Telemetry::start(&cfg, ops.metrics().otel_spans_dropped.clone())
                .await;
        ops.set_daily_spend(ledger.clone(), cfg.verification.max_cost_usd_per_day);
        let deps = RunnerDeps {
            config: cfg.clone(),
            env,
            redactor,
            budget,
            out: Arc::new(link.clone()),
            ops: ops.clone(),
            recorder,
            containment,
            ledger,
            telemetry,
        };
        // What tasks of an earlier run left: removed in the background, before the first
        // task prepares (the slot hands the removal to it as it does a task's leftovers).
        // This run's directories made ahead are spared (made while the sweep may still run).
        let ahead = Arc::new(runner::AheadPool::default());
        let orphans = tokio::spawn({
            let keep = state
                .active
                .as_ref()
                .map(|a| crate::workspace::dirs_name(&a.task, a.dirs.as_deref()));
            let (cfg, ops, ahead) = (cfg.clone(), ops.clone(), ahead.clone());
            async move {
                let swept = crate::workspace::remove_orphans(&cfg, keep, ahead.prefix()).await;
                ops.trees_set_aside(swept.set_aside);
            }
        });
        let mut d = Daemon {
            cfg,
            shutdown,
            store: state.store,
            active: state.active,
            outbox,
            link,
            deps,
            ops,
            events,
            running: None,
            leftovers: Some(orphans),
            identified: false,
            inflight: None,
            just_stored: None,
            outbox_retry_at: None,
            draining: false,
            drain_deadline: None,
            flush_deadline: None,
            restart_requested: false,
            recovery_deadline: None,
            fence_deadline: None,
            held_back: Vec::new(),
            resyncing: false,
            asked: Vec::new(),
            queued: None,
            announce,
            probe,
            ahead,
            renew_ahead_at: None,
            reprobe_at: None,
            trim_at: None,
            reprobe_delay: REPROBE_FIRST,
        };
        for meta in state.outbox {
            d.add_to_outbox(meta).await;
        }
        if !d.outbox.is_empty() {
            tracing::info!(
                pending = d.outbox.len(),
                "results from a previous run wait for the hub's acknowledgement"
            );
        }
        (d, recorder_writer)
    }

    async fn run(&mut self) -> ExitReason {
        self.ops.status("connecting to the hub");
        let shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                biased;
                // `abort` sees `immediate` itself and skips the kill grace.
                _ = shutdown.immediate.cancelled() => {
                    return self.abort().await;
                }
                _ = shutdown.abort.cancelled() => {
                    return self.abort().await;
                }
                _ = sleep_until_opt(self.drain_deadline) => {
                    tracing::warn!(drain_timeout_secs = self.cfg.drain_timeout_secs, "drain timeout reached; cancelling the task and keeping it for recovery");
                    return self.abort().await;
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
                policy = self.probe.step(self.cfg.containment) => {
                    if let Some(policy) = policy {
                        self.probe_answered(policy);
                    }
                }
                // No frame before the probe's answer: an assignment waits for it here.
                ev = self.events.recv(), if self.probe.answered() => match ev {
                    Some(ev) => self.on_link_event(ev).await,
                    None => {
                        tracing::error!("hub link task ended unexpectedly");
                        return self.abort().await;
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
                _ = sleep_until_opt(self.fence_deadline) => {
                    self.fence_expired().await;
                }
                _ = sleep_until_opt(self.trim_at) => {
                    self.trim_at = None;
                    if self.running.is_none() {
                        trim_heap().await;
                    }
                }
                _ = sleep_until_opt(self.renew_ahead_at) => {
                    self.renew_ahead_at = None;
                    self.renew_ahead();
                }
                _ = sleep_until_opt(self.reprobe_at) => {
                    self.reprobe_at = None;
                    self.reprobe().await;
                }
                _ = sleep_until_opt(self.flush_deadline) => {
                    tracing::warn!(pending = self.outbox.len(), "outbox not flushed in time; results stay on disk and are re-sent on the next start");
                    return self.idle_exit_reason();
                }
            }
            if !self.draining && !self.restart_requested {
                self.resync_if_idle();
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

    /// The state as loaded (an unfinished task now marked recovering), written back once
    /// before any frame is handled, so an unwritable state directory is reported at start
    /// rather than at the first task.
    async fn write_back(&self) {
        if let Err(e) = self.store.set_active(self.active.clone()).await {
            tracing::error!(error = %e, "state directory is not writable: tasks will be refused until it is");
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
            LinkEvent::Identified { epoch, announced } => {
                self.link.set_epoch(epoch);
                self.correct_announcement(&announced);
                self.identified = true;
                self.inflight = None;
                self.asked.clear();
                self.ops.ready();
                self.after_identify().await;
            }
            LinkEvent::Disconnected { reason } => {
                tracing::debug!(reason = %reason, "link down");
                self.fence_running(&format!("the link to the hub dropped ({reason})"));
                self.identified = false;
                self.inflight = None;
                self.asked.clear();
                self.ops.status("reconnecting to the hub");
            }
            LinkEvent::Barrier { task_id } => self.on_barrier(&task_id).await,
            LinkEvent::Frame(frame) => self.on_frame(frame).await,
        }
    }

    /// After each `identified`: `task_accepted` (see [`accepted_after_identify`]), recovery
    /// question, state report, outbox.
    async fn after_identify(&mut self) {
        // A paused task is accepted again only once the hub says it is still ours.
        let running = self
            .running
            .as_ref()
            .filter(|r| !r.dropped && !r.fence.is_paused())
            .map(|r| r.task_id.as_str());
        for task_id in
            accepted_after_identify(running, self.outbox.iter().map(|m| m.task_id.as_str()))
        {
            self.link.send(Outbound::TaskAccepted { task_id });
        }
        if let Some(active) = &self.active {
            let task = active.task.clone();
            let paused = self.paused_task().is_some();
            match active.phase {
                Phase::Recovering if self.running.is_none() => self.ask_recovering(&task),
                _ if paused => self.report(&task, "paused", false),
                _ if self.running.is_some() => self.report(&task, "working", false),
                _ => {}
            }
        }
        // After the running task's question: the hub answers in order, and its answer
        // decides whether a held-back assignment may take the slot.
        self.ask_held_back();
        self.status_line();
        self.pump_outbox().await;
        self.idle_from_now();
    }

    /// The daemon may be idle from now on: free heap pages go back once it has stayed so,
    /// and the next task's views are made now (the last task took them).
    fn idle_from_now(&mut self) {
        if self.running.is_none() {
            self.trim_at = Some(Instant::now() + TRIM_AFTER_IDLE);
            if self.probe.answered() {
                self.prepare_views();
            }
        }
    }

    fn status_line(&self) {
        match (&self.active, self.deps.containment.refusal()) {
            (Some(a), _) => self
                .ops
                .status(&format!("connected, running task {}", a.task.task_id)),
            (None, Some(why)) => self
                .ops
                .status(&format!("connected, NOT accepting tasks: {why}")),
            (None, None) => self.ops.status("connected, idle"),
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
                self.on_report_ack(&task_id, &action).await
            }
            Inbound::TaskContinue {
                task_id,
                generation,
            } => self.on_continue(&task_id, generation).await,
            Inbound::RestartSidecar { reason } => {
                tracing::info!(reason = ?reason, "hub asked for a restart; exiting once idle");
                self.restart_requested = true;
            }
            Inbound::TaskAck { task_id, status } => self.on_ack(&task_id, status.as_ref()).await,
            Inbound::Error {
                error,
                message_type,
                ..
            } => self.on_hub_error(&error, message_type.as_deref()).await,
            Inbound::RateLimited { .. } => {}
            other => tracing::debug!(frame = ?other, "hub frame needs no action"),
        }
    }
}
