//! Operations: what an operator sees of the daemon — metrics, health, systemd status.
//!
//! [`Ops`] is a cheap handle every part of the daemon reports into. It holds no task state:
//! only counters, gauges and the few facts `/healthz` and the systemd watchdog need.
//!
//! # Layout
//!
//! - [`metrics`]: the Prometheus registry.
//! - [`systemd`]: sd_notify readiness, status and watchdog.
//! - [`http`]: `/healthz`, `/metrics` and `/status` on `metrics_addr`.
//! - [`socket`]: the same routes on `state_dir/status.sock` (mode 0600), always on.

pub mod http;
pub mod metrics;
pub mod socket;
pub mod systemd;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::spend::SpendLedger;
use metrics::Metrics;

/// A byte count as a gauge's value (saturating: a gauge is an `i64`).
pub(crate) fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Facts for `/healthz` and the watchdog.
#[derive(Debug, Default)]
struct Health {
    identified: bool,
    /// When the link in use now was identified: monotonic for its age, wall clock for
    /// `check` and `status` to print.
    connected_since: Option<(Instant, std::time::SystemTime)>,
    last_pong: Option<Instant>,
    /// When the last frame came in from the hub.
    last_frame_in: Option<Instant>,
    active_task: Option<String>,
    /// When the active task started.
    task_started: Option<Instant>,
    /// The attempt running now and when it started.
    attempt: Option<(u32, Instant)>,
    /// Today's spend across tasks and the daily cap, for `/status`.
    daily_spend: Option<Arc<SpendLedger>>,
    daily_budget_usd: Option<f64>,
    /// The containment level tasks run under (`strict`, `best-effort`, `off`).
    containment: Option<&'static str>,
    /// Why no task is taken now, with the fix; `None` while tasks are taken.
    not_accepting: Option<String>,
}

/// The handle. Clone freely.
#[derive(Clone, Default)]
pub struct Ops {
    metrics: Arc<Metrics>,
    health: Arc<Mutex<Health>>,
    ready_sent: Arc<AtomicBool>,
}

/// A snapshot for `/healthz`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HealthSnapshot {
    /// The hub link is up (the same as `identified`; kept for probes that read this name).
    pub connected: bool,
    /// Identified with the hub now.
    pub identified: bool,
    /// The task being worked on, if any.
    pub active_task: Option<String>,
    /// Age of the last pong; growing past the pong timeout means the link is dying.
    pub last_pong_age_ms: Option<u64>,
    /// Trees tasks left that could not be removed and are set aside in the state
    /// directory (`hub_sidecar_trees_set_aside`): disk an operator must free by hand.
    pub trees_set_aside: u64,
}

/// A snapshot for `/status` (`hub-sidecar status`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StatusSnapshot {
    /// Identified with the hub now.
    pub identified: bool,
    /// Age of the last pong from the hub.
    pub last_pong_age_ms: Option<u64>,
    /// When the link in use now was identified (ms since the epoch); absent while not
    /// identified, and from an older daemon.
    #[serde(default)]
    pub connected_since_ms: Option<i64>,
    /// How long the link in use now has been identified.
    #[serde(default)]
    pub connected_for_ms: Option<u64>,
    /// Age of the last frame from the hub (any type); absent before the first, and from an
    /// older daemon.
    #[serde(default)]
    pub last_frame_age_ms: Option<u64>,
    /// The task being worked on, if any.
    pub active_task: Option<String>,
    /// How long the active task has been running.
    pub task_elapsed_ms: Option<u64>,
    /// The attempt of the active task running now (1-based).
    pub attempt: Option<u32>,
    /// How long that attempt has been running.
    pub attempt_elapsed_ms: Option<u64>,
    /// Spent today (UTC day) across all tasks, USD.
    pub spent_today_usd: f64,
    /// `verification.max_cost_usd_per_day`, when set.
    pub daily_budget_usd: Option<f64>,
    /// The containment level tasks run under (`strict`, `best-effort`, `off`); absent from
    /// an older daemon.
    #[serde(default)]
    pub containment: Option<String>,
    /// Why the daemon takes no task now, and what to do; `None` while it takes tasks.
    #[serde(default)]
    pub not_accepting: Option<String>,
}

impl Ops {
    /// A fresh handle: not identified, no task, zeroed metrics.
    pub fn new() -> Ops {
        Ops::default()
    }

    /// The Prometheus metrics, to count into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().expect("health lock poisoned")
    }

    /// The hub link was identified (true) or lost (false).
    pub fn link_state(&self, identified: bool) {
        let mut h = self.health();
        // The first `true` of a link starts its clock; a repeated `true` keeps it.
        h.connected_since = match (identified, h.connected_since) {
            (true, Some(since)) => Some(since),
            (true, None) => Some((Instant::now(), std::time::SystemTime::now())),
            (false, _) => None,
        };
        h.identified = identified;
        drop(h);
        self.metrics.connected.set(i64::from(identified));
    }

    /// A pong arrived now.
    pub fn pong(&self) {
        self.health().last_pong = Some(Instant::now());
    }

    /// A reconnect attempt began.
    pub fn reconnect(&self) {
        self.metrics.reconnects.inc();
    }

    /// A frame came in from the hub.
    pub fn frame_in(&self) {
        self.metrics.frames_in.inc();
        self.health().last_frame_in = Some(Instant::now());
    }

    /// A frame of type `kind` went out to the hub.
    pub fn frame_out(&self, kind: &'static str) {
        self.metrics.frame_out(kind);
    }

    /// The hub answered `rate_limited`.
    pub fn rate_limited(&self) {
        self.metrics.rate_limited.inc();
    }

    /// The task being worked on from now (its clock starts), or none.
    pub fn set_active_task(&self, task_id: Option<&str>) {
        let mut h = self.health();
        h.active_task = task_id.map(str::to_string);
        h.task_started = task_id.map(|_| Instant::now());
        h.attempt = None;
    }

    /// Attempt `n` of the active task started.
    pub fn attempt_started(&self, n: u32) {
        self.health().attempt = Some((n, Instant::now()));
    }

    /// Where `/status` reads today's spend, and the daily cap it is compared with.
    pub fn set_daily_spend(&self, spend: Arc<SpendLedger>, budget_usd: Option<f64>) {
        let mut h = self.health();
        h.daily_spend = Some(spend);
        h.daily_budget_usd = budget_usd;
    }

    /// The containment level tasks run under, and why no task is taken (`None`: tasks are
    /// taken), with the `missing` layers (comma-separated short names). Shown by `/status`,
    /// `/metrics` (`hub_sidecar_accepting_tasks`, labelled with why) and, through the
    /// daemon's status line, systemd.
    pub fn set_containment(
        &self,
        level: &'static str,
        not_accepting: Option<String>,
        missing: &str,
    ) {
        self.metrics
            .set_accepting(level, not_accepting.as_deref(), missing);
        let mut h = self.health();
        h.containment = Some(level);
        h.not_accepting = not_accepting;
    }

    /// The dependency caches take `bytes` of a bound of `max_bytes` (counted when a task
    /// prepared its repository's cache).
    pub fn caches_used(&self, bytes: u64, max_bytes: u64) {
        self.metrics.caches_bytes.set(gauge_value(bytes));
        self.metrics.caches_max_bytes.set(gauge_value(max_bytes));
    }

    /// `n` more trees tasks left are set aside (the start-up sweep's count of what is
    /// there, then one per tree set aside): `/metrics` and `/healthz` show the total.
    pub fn trees_set_aside(&self, n: usize) {
        self.metrics
            .trees_set_aside
            .inc_by(gauge_value(u64::try_from(n).unwrap_or(u64::MAX)));
    }

    /// What `/status` and `hub-sidecar status` show, as of now.
    pub fn status_snapshot(&self) -> StatusSnapshot {
        let h = self.health();
        let ms = |t: Instant| t.elapsed().as_millis() as u64;
        StatusSnapshot {
            identified: h.identified,
            last_pong_age_ms: h.last_pong.map(ms),
            connected_since_ms: h.connected_since.map(|(_, wall)| {
                wall.duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64)
            }),
            connected_for_ms: h.connected_since.map(|(t, _)| ms(t)),
            last_frame_age_ms: h.last_frame_in.map(ms),
            active_task: h.active_task.clone(),
            task_elapsed_ms: h.task_started.map(ms),
            attempt: h.attempt.map(|a| a.0),
            attempt_elapsed_ms: h.attempt.map(|a| ms(a.1)),
            spent_today_usd: h.daily_spend.as_ref().map_or(0.0, |d| d.spent_today_now()),
            daily_budget_usd: h.daily_budget_usd,
            containment: h.containment.map(str::to_string),
            not_accepting: h.not_accepting.clone(),
        }
    }

    /// `READY=1`, once, after the first `identified`.
    pub fn ready(&self) {
        if !self.ready_sent.swap(true, Ordering::AcqRel) {
            systemd::notify(&[sd_notify::NotifyState::Ready]);
        }
    }

    /// A `STATUS=` line for `systemctl status`.
    pub fn status(&self, line: &str) {
        systemd::notify(&[sd_notify::NotifyState::Status(line)]);
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        systemd::notify(&[sd_notify::NotifyState::Stopping]);
    }

    /// What `/healthz` shows, as of now.
    pub fn snapshot(&self) -> HealthSnapshot {
        let h = self.health();
        HealthSnapshot {
            connected: h.identified,
            identified: h.identified,
            active_task: h.active_task.clone(),
            last_pong_age_ms: h.last_pong.map(|t| t.elapsed().as_millis() as u64),
            trees_set_aside: u64::try_from(self.metrics.trees_set_aside.get()).unwrap_or(0),
        }
    }

    /// Healthy for the watchdog: identified and a pong younger than `max_age`.
    pub fn link_healthy(&self, max_age: std::time::Duration) -> bool {
        let h = self.health();
        h.identified && h.last_pong.is_some_and(|t| t.elapsed() <= max_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check` shows the daemon's link from this: its clock starts at the first
    /// `identified` of a link, survives a repeated one, and stops when the link is lost.
    #[tokio::test(start_paused = true)]
    async fn the_link_clock_and_the_last_frame_reach_the_status() {
        let ops = Ops::new();
        let s = ops.status_snapshot();
        assert_eq!(
            (
                s.connected_since_ms,
                s.connected_for_ms,
                s.last_frame_age_ms
            ),
            (None, None, None)
        );
        ops.link_state(true);
        let since = ops.status_snapshot().connected_since_ms.expect("connected");
        tokio::time::advance(std::time::Duration::from_secs(90)).await;
        ops.link_state(true);
        ops.frame_in();
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        let s = ops.status_snapshot();
        assert_eq!(
            s.connected_since_ms,
            Some(since),
            "a repeated true keeps it"
        );
        assert_eq!(s.connected_for_ms, Some(92_000));
        assert_eq!(s.last_frame_age_ms, Some(2_000));
        ops.link_state(false);
        let s = ops.status_snapshot();
        assert_eq!((s.connected_since_ms, s.connected_for_ms), (None, None));
    }
}
