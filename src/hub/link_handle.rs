//! The daemon's side of the hub link: the events the link reports ([`LinkEvent`]), the
//! frames it is given ([`OutFrame`]) through a [`LinkHandle`], and how the daemon steers it
//! otherwise ([`Steering`]: the status `identify` announces, a fresh connection, hurry).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};

use crate::hub::proto::{Inbound, Outbound};

/// What the link tells the daemon.
#[derive(Debug)]
pub enum LinkEvent {
    /// `identified` received on a new connection.
    Identified {
        /// The connection's number; frames carry it to reach only this connection.
        epoch: u64,
        /// The status its `identify` announced (the daemon corrects it with a `status`
        /// frame when it has learnt otherwise since).
        announced: String,
    },
    /// The connection ended; the daemon must consider every unanswered frame unanswered.
    Disconnected {
        /// Why, for the log.
        reason: String,
    },
    /// A frame for the daemon (tasks, acks, errors, rate limits).
    Frame(Inbound),
    /// The pong to the ping sent right after a barrier frame arrived: the hub has answered
    /// that frame already, or dropped it.
    Barrier {
        /// The task whose frame the barrier followed.
        task_id: String,
    },
}

/// A frame for the link to send.
#[derive(Debug)]
pub struct OutFrame {
    /// The frame.
    pub frame: Outbound,
    /// The connection this frame was meant for.
    pub epoch: u64,
    /// Follow the frame with a ping and report its pong as [`LinkEvent::Barrier`].
    pub barrier: Option<String>,
}

/// The daemon's side of the link: send frames, track the epoch.
#[derive(Clone)]
pub struct LinkHandle {
    tx: mpsc::Sender<OutFrame>,
    epoch: Arc<AtomicU64>,
    /// Asks the link to close the connection and identify again at once.
    resync: Arc<Notify>,
    /// Set while a task waits, paused, for the link to come back: reconnect without backoff.
    hurry: Arc<AtomicBool>,
}

/// How the daemon steers the link besides its frames: what `identify` announces, a fresh
/// connection asked for, and whether a paused task waits for the link.
pub struct Steering {
    /// The agent status `identify` announces (see [`super::link::run`]).
    pub status: watch::Receiver<Option<String>>,
    pub(super) resync: Arc<Notify>,
    pub(super) hurry: Arc<AtomicBool>,
}

/// The reconnect delay while a paused task waits for the link (see [`LinkHandle::hurry`]):
/// a refused connect costs nothing at the hub (an `identify`, its scarce tier, is only sent
/// once it answers), and every moment of the wait is a moment the task stands still.
pub(super) const HURRIED_RECONNECT: Duration = Duration::from_millis(100);

impl LinkHandle {
    /// Queue a frame for the current connection. Never blocks: if the link is wedged the
    /// frame is dropped (terminal frames live in the outbox and are re-sent on reconnect).
    pub fn send(&self, frame: Outbound) -> bool {
        self.send_frame(frame, None)
    }

    /// Queue a terminal frame followed by a barrier ping.
    pub fn send_with_barrier(&self, frame: Outbound, task_id: &str) -> bool {
        self.send_frame(frame, Some(task_id.to_string()))
    }

    fn send_frame(&self, frame: Outbound, barrier: Option<String>) -> bool {
        let kind = frame.kind();
        let of = OutFrame {
            frame,
            epoch: self.epoch.load(Ordering::Acquire),
            barrier,
        };
        match self.tx.try_send(of) {
            Ok(()) => true,
            Err(_) => {
                tracing::warn!(
                    frame = kind,
                    "hub link send queue full or closed; frame dropped"
                );
                false
            }
        }
    }

    /// Close the current connection (1000) and identify again at once: the hub re-creates
    /// the agent's state machine from its task table on each identify.
    pub fn reconnect(&self) {
        self.resync.notify_one();
    }

    /// Whether a task waits, paused, for the link: then it reconnects every
    /// [`HURRIED_RECONNECT`] instead of backing off, so a short blip costs the blip and a
    /// round trip, not a backoff on top.
    pub fn hurry(&self, on: bool) {
        self.hurry.store(on, Ordering::Release);
    }

    /// What [`super::link::run`] needs from the daemon besides frames: the status `identify` announces
    /// and the signals of this handle.
    pub fn steering(&self, status: watch::Receiver<Option<String>>) -> Steering {
        Steering {
            status,
            resync: self.resync.clone(),
            hurry: self.hurry.clone(),
        }
    }

    /// The daemon saw `Identified { epoch }`.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
    }
}

/// Capacity of the daemon → link queue. Progress is rate-limited upstream, so a full queue
/// means a wedged socket, not a burst.
const OUT_QUEUE: usize = 256;

/// Create the channel pair. The receiver goes to [`super::link::run`].
pub fn channel() -> (LinkHandle, mpsc::Receiver<OutFrame>) {
    let (tx, rx) = mpsc::channel(OUT_QUEUE);
    (
        LinkHandle {
            tx,
            epoch: Arc::new(AtomicU64::new(0)),
            resync: Arc::new(Notify::new()),
            hurry: Arc::new(AtomicBool::new(false)),
        },
        rx,
    )
}
