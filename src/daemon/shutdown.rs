//! Stopping: the shutdown tokens the daemon's caller holds, why [`super::run`] returned,
//! and the forced stop that cancels the task and keeps it on disk for recovery.
//!
//! Two stages, each a token so the caller (signal handling in `cli`, a test, the demo)
//! decides when and the daemon only observes:
//! - `drain`: take no new task, finish the current one, deliver its result, exit;
//! - `abort`: cancel the current task, keep it on disk for recovery, exit.

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
}

impl Shutdown {
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
}

/// How long a drain waits for the outbox to empty after the task finished.
pub(super) const OUTBOX_FLUSH: Duration = Duration::from_secs(10);

impl Daemon {
    /// What a stop that has nothing left to do reports.
    pub(super) fn idle_exit_reason(&self) -> ExitReason {
        if self.draining {
            ExitReason::Drained
        } else {
            ExitReason::RestartRequested
        }
    }

    /// Forced stop: cancel the task, keep it on disk as recovering.
    pub(super) async fn abort(&mut self) -> ExitReason {
        if let Some(mut r) = self.running.take() {
            tracing::warn!(task_id = %r.task_id, "forced stop: cancelling the running task; it will be reported with task_recovering on the next start");
            r.cancel.cancel();
            let grace =
                Duration::from_millis(self.cfg.executor.kill_grace_ms) + Duration::from_secs(2);
            if tokio::time::timeout(grace, &mut r.handle).await.is_err() {
                r.handle.abort();
            }
        }
        // Whatever is still active (the running task, or one queued behind a dropped task)
        // was not finished: the next start asks the hub about it.
        self.queued = None;
        if let Some(a) = &mut self.active {
            a.phase = Phase::Recovering;
        }
        self.save().await;
        ExitReason::Aborted
    }
}
