//! Stopping: the shutdown tokens the daemon's caller holds, why [`super::run`] returned,
//! and the forced stop that cancels the task and keeps it on disk for recovery.
//!
//! Three stages, each a token so the caller (signal handling in `cli`, a test, the demo)
//! decides when and the daemon only observes:
//! - `drain`: take no new task, finish the current one, deliver its result, exit;
//! - `abort`: cancel the current task, keep it on disk for recovery, exit;
//! - `immediate`: like `abort`, but without waiting out the task's kill grace or the link's
//!   goodbye: the task's processes are killed at once and [`super::run`] returns
//!   [`ExitReason::Interrupted`] (the binary exits 130 for it).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Daemon;
use crate::state::Phase;

/// The stages of stopping, as tokens the daemon observes (see the module docs).
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Take no new task, finish the current one, deliver its result, exit.
    pub drain: CancellationToken,
    /// Cancel the current task (SIGTERM, then SIGKILL after the kill grace), keep it on
    /// disk for `task_recovering`, exit.
    pub abort: CancellationToken,
    /// Exit now: kill the task's processes without a grace period and wait for nothing
    /// else. The task stays on disk for recovery.
    pub immediate: CancellationToken,
}

impl Shutdown {
    /// No stage requested yet: the signal handler cancels the tokens in order.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }
}

/// Why [`super::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// Drained after a stop request.
    Drained,
    /// Forced stop: the task (if any) is kept for `task_recovering`.
    Aborted,
    /// The hub asked for a restart (`restart_sidecar`); systemd starts us again.
    RestartRequested,
    /// Stopped at once ([`Shutdown::immediate`]): the task's processes were killed without
    /// a grace period; the task (if any) is kept for `task_recovering`.
    Interrupted,
}

/// How long a drain waits for the outbox to empty after the task finished.
pub(super) const OUTBOX_FLUSH: Duration = Duration::from_secs(10);

/// Wait for `fut` at most `limit`, and not at all once `immediate` is cancelled: its
/// output when it finished, `None` when it did not.
pub(super) async fn wait_unless_immediate<F: Future>(
    immediate: &CancellationToken,
    limit: Duration,
    fut: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = immediate.cancelled() => None,
        r = tokio::time::timeout(limit, fut) => r.ok(),
    }
}

impl Daemon {
    /// What a stop that has nothing left to do reports.
    pub(super) fn idle_exit_reason(&self) -> ExitReason {
        if self.draining {
            ExitReason::Drained
        } else {
            ExitReason::RestartRequested
        }
    }

    /// Forced stop: cancel the task, keep it on disk as recovering. The task gets its kill
    /// grace unless [`Shutdown::immediate`] is (or becomes) cancelled: then its runner is
    /// aborted, which kills each of its process groups at once (dropping a run in
    /// [`crate::process`] SIGKILLs its group), and the result is [`ExitReason::Interrupted`].
    pub(super) async fn abort(&mut self) -> ExitReason {
        let immediate = self.shutdown.immediate.clone();
        if let Some(mut r) = self.running.take() {
            tracing::warn!(task_id = %r.task_id, "forced stop: cancelling the running task; it will be reported with task_recovering on the next start");
            r.cancel.cancel();
            let grace =
                Duration::from_millis(self.cfg.executor.kill_grace_ms) + Duration::from_secs(2);
            match wait_unless_immediate(&immediate, grace, &mut r.handle).await {
                // Removed before the daemon exits (see `run_with`).
                Some(Ok(finished)) => {
                    self.leftovers = Some(tokio::spawn(finished.leftovers.remove()));
                }
                Some(Err(_)) => {}
                None => {
                    r.handle.abort();
                    // Resolves once the runner's future is dropped, its process groups with it.
                    let _ = (&mut r.handle).await;
                }
            }
        }
        // Whatever is still active (the running task, or one queued behind a dropped task)
        // was not finished: the next start asks the hub about it.
        self.queued = None;
        if let Some(a) = &mut self.active {
            a.phase = Phase::Recovering;
        }
        self.save().await;
        if immediate.is_cancelled() {
            ExitReason::Interrupted
        } else {
            ExitReason::Aborted
        }
    }
}
