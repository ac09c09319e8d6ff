//! The containment probe run off the runtime ([`Probing`]): started once the daemon's first
//! attempt to `identify` is over, collected when the daemon needs its answer.

use super::{Containment, Policy, Support};

/// The containment probe ([`Policy::probe_blocking`]) for the `configured` level (the
/// config's `containment`), running on the blocking pool from [`Probing::start`]: it forks a
/// namespace holder and a test child, so the daemon starts it only once its first attempt to
/// `identify` is over (`daemon/containment.rs`), and collects it when it needs the answer.
pub struct Probing {
    configured: Option<Containment>,
    handle: tokio::task::JoinHandle<Policy>,
}

impl Probing {
    /// Start probing now.
    pub fn start(configured: Option<Containment>) -> Probing {
        Probing {
            configured,
            handle: tokio::task::spawn_blocking(move || Policy::probe_blocking(configured)),
        }
    }

    /// The probe's answer, logged once. A probe that panicked proved nothing: strict then
    /// refuses work, as on a machine without the layers.
    pub async fn answer(mut self) -> Policy {
        self.wait().await
    }

    /// [`Probing::answer`] without giving the probe up: cancel-safe (for a `select!`); once
    /// it has returned, the probe is spent and must not be waited on again.
    pub async fn wait(&mut self) -> Policy {
        let policy = (&mut self.handle)
            .await
            .unwrap_or_else(|_| Policy::decide(self.configured, Support::none()));
        policy.log();
        policy
    }

    /// A probe whose answer is the policy sent on `answer` (tests: a probe that answers
    /// when the test says so).
    #[doc(hidden)]
    pub fn answered_by(
        configured: Option<Containment>,
        answer: tokio::sync::oneshot::Receiver<Policy>,
    ) -> Probing {
        Probing {
            configured,
            handle: tokio::spawn(async move {
                answer
                    .await
                    .unwrap_or_else(|_| Policy::decide(configured, Support::none()))
            }),
        }
    }
}
