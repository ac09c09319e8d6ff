//! The daemon's containment decision: the probe, run only once the link's first `identify`
//! is done (nothing but reading the config and connecting is on the way to `identify`),
//! what its answer means for taking work, and the re-probe while a strict daemon cannot
//! confine.
//!
//! Until the probe has answered the daemon handles no frame from the hub: an assignment
//! that arrives meanwhile waits in the link's channel (a millisecond or two), then is taken
//! or refused by the answer — never refused for want of one, which would cost the hub a
//! retry of the task (its `task_failed` handler re-queues or dead-letters it). The hub's
//! view stays true: its agent state machine holds the task `assigned` until `task_accepted`
//! or `task_failed` arrives (PROTOCOL.md §8).

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Daemon, REPROBE_FIRST, REPROBE_MAX};
use crate::config::Containment;
use crate::hub::proto::Outbound;
use crate::sandbox::{Policy, Probing};

/// Where the containment probe is.
pub(crate) enum ProbeStage {
    /// Waiting for the link's first attempt to identify (or to fail) before starting.
    Waiting(oneshot::Receiver<()>),
    /// Running on the blocking pool.
    Running(Probing),
    /// Answered: the daemon's `deps.containment` is the answer.
    Answered,
}

impl ProbeStage {
    pub(super) fn answered(&self) -> bool {
        matches!(self, ProbeStage::Answered)
    }

    /// The next step: start the probe once the link's first attempt is over, then its
    /// answer. Cancel-safe (a branch of the daemon's `select!`); pending forever once
    /// answered.
    pub(super) async fn step(&mut self, configured: Option<Containment>) -> Option<Policy> {
        match self {
            ProbeStage::Waiting(first_attempt) => {
                // A link gone before its first attempt is a daemon on its way out: probe
                // anyway, the answer is still what `status` and the metrics show.
                let _ = first_attempt.await;
                *self = ProbeStage::Running(Probing::start(configured));
                None
            }
            ProbeStage::Running(probing) => {
                let policy = probing.wait().await;
                *self = ProbeStage::Answered;
                Some(policy)
            }
            ProbeStage::Answered => std::future::pending().await,
        }
    }
}

impl Daemon {
    /// The probe's first answer: take work by it from now on.
    pub(super) fn probe_answered(&mut self, policy: Policy) {
        self.deps.containment = Arc::new(policy);
        self.containment_decided();
        self.prepare_views();
    }

    /// Make the next tasks' views while idle (see `sandbox::premade`), and the next task's
    /// whole sandbox (see `runner::ahead`), in the background: a task assigned meanwhile
    /// makes its own.
    pub(super) fn prepare_views(&mut self) {
        self.make_ahead(false);
    }

    /// An idle daemon's next task's directories and sandbox, made anew before they are too
    /// old to serve (`runner::ahead`), in the background.
    pub(super) fn renew_ahead(&mut self) {
        self.make_ahead(true);
    }

    /// [`Daemon::prepare_views`], the sandbox made ahead first made anew when `renew`; and
    /// the next renewal planned. Nothing while a task runs.
    fn make_ahead(&mut self, renew: bool) {
        if self.running.is_some() {
            return;
        }
        self.renew_ahead_at = Some(tokio::time::Instant::now() + crate::runner::RENEW_EVERY);
        let (policy, cfg, env, ahead) = (
            self.deps.containment.clone(),
            self.cfg.clone(),
            self.deps.env.clone(),
            self.ahead.clone(),
        );
        drop(tokio::task::spawn_blocking(move || {
            // The next task's whole sandbox first (it takes a view made on the spot when the
            // pool is empty), then the views of tasks that build their own (a repository).
            if renew {
                ahead.renew(&cfg, &policy, &env);
            } else {
                ahead.refill(&cfg, &policy, &env);
            }
            policy.prepare_views(&cfg, env.vars())
        }));
    }

    /// Tell everyone what the containment decision means for taking work: the status and
    /// metrics, the next `identify`, and when to look again while tasks cannot be confined.
    pub(super) fn containment_decided(&mut self) {
        let policy = &self.deps.containment;
        let refusal = policy.refusal();
        let support = &policy.support;
        let missing: Vec<&str> = [
            (support.landlock_abi < 1).then_some("landlock"),
            support.namespaces.is_err().then_some("namespaces"),
        ]
        .into_iter()
        .flatten()
        .collect();
        self.ops
            .set_containment(policy.level_name(), refusal.clone(), &missing.join(","));
        self.announce
            .send_replace(Some(announcement(refusal.as_deref())));
        self.reprobe_at = refusal
            .is_some()
            .then(|| Instant::now() + self.reprobe_delay);
    }

    /// After `identified`: the hub was told `announced`; when the daemon has learnt better
    /// since (the probe answers after the first `identify`), say so with a `status` frame.
    pub(super) fn correct_announcement(&self, announced: &str) {
        let now = announcement(self.deps.containment.refusal().as_deref());
        if now != announced {
            self.link.send(Outbound::Status {
                status: crate::util::truncate_chars(&now, 256),
            });
        }
    }

    /// Probe containment again (strict and unavailable until now); on success, take work.
    pub(super) async fn reprobe(&mut self) {
        let configured = self.cfg.containment;
        let Ok(policy) =
            tokio::task::spawn_blocking(move || Policy::probe_blocking(configured)).await
        else {
            self.reprobe_at = Some(Instant::now() + self.reprobe_delay);
            return;
        };
        if policy.refusal().is_none() {
            tracing::info!(layers = %policy.support.describe(), "containment is available now: accepting tasks");
            self.reprobe_delay = REPROBE_FIRST;
        } else {
            tracing::debug!(next_in = ?self.reprobe_delay, "containment still unavailable");
            self.reprobe_delay = (self.reprobe_delay * 2).min(REPROBE_MAX);
        }
        let was = self.deps.containment.refusal();
        self.deps.containment = Arc::new(policy);
        self.containment_decided();
        self.prepare_views();
        if self.identified {
            self.status_line();
            if was != self.deps.containment.refusal() {
                self.correct_announcement(&announcement(was.as_deref()));
            }
        }
    }
}

/// The agent status `identify` announces: `idle`, or why no task is taken.
pub(super) fn announcement(refusal: Option<&str>) -> String {
    match refusal {
        Some(why) => format!("not accepting tasks: {why}"),
        None => "idle".to_string(),
    }
}
