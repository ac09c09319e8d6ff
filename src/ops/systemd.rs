//! systemd integration: `READY=1` after the first `identified`, `STATUS=` lines,
//! `WATCHDOG=1` only while the hub link is healthy, `STOPPING=1` on shutdown.
//! Without `NOTIFY_SOCKET` every call is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use super::Ops;

pub(super) fn notify(state: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    // A local datagram send: it does not block in practice.
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Feed the systemd watchdog while the link is healthy (last pong younger than
/// `max_pong_age`). A daemon that is up but disconnected or wedged stops feeding it and is
/// restarted by systemd. Returns at once when the unit has no `WatchdogSec=`.
pub async fn watchdog(ops: Ops, max_pong_age: Duration, cancel: CancellationToken) {
    let mut usec = 0u64;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let every = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                if ops.link_healthy(max_pong_age) {
                    notify(&[NotifyState::Watchdog]);
                } else {
                    tracing::debug!("hub link unhealthy: not feeding the systemd watchdog");
                }
            }
        }
    }
}
