//! Delivering terminal frames: the daemon's side of the outbox. A frame is stored before it
//! is sent, sent one at a time with a barrier ping behind it, and forgotten only when the
//! hub answers it (`task_ack`, or a final `task_*_failed` error) or it falls past the
//! outbox's bound or age. Which entry goes next is [`crate::outbox`]'s rule; this module
//! moves entries between that rule, the store and the link.

use std::time::Duration;

use tokio::time::Instant;

use super::Daemon;
use crate::hub::proto::{AckStatus, HubErrorCode, HubErrorKind};
use crate::outbox::Next;
use crate::state::OutboxMeta;
use crate::util::now_ms;

impl Daemon {
    /// Track a stored entry for delivery, dropping (and saying so) what falls past the bound.
    pub(super) async fn add_to_outbox(&mut self, meta: OutboxMeta) {
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

    /// The barrier ping after the in-flight frame came back without an answer to the frame.
    pub(super) async fn on_barrier(&mut self, task_id: &str) {
        if let Some(m) = self.inflight.take_if(|m| m.task_id == task_id) {
            // The hub answered the ping after our frame but not the frame: it was
            // dropped (rate limit). It waits (longer each time) while others go.
            self.outbox.missed(m.seq, Instant::now());
            tracing::warn!(task_id = %task_id, "terminal frame went unanswered; will re-send it");
            self.pump_outbox().await;
        }
    }

    /// `task_ack`: the hub has the task's result; `accepted` only acknowledges `task_accepted`.
    pub(super) async fn on_ack(&mut self, task_id: &str, status: Option<&AckStatus>) {
        if status == Some(&AckStatus::Accepted) {
            return;
        }
        let gone = self.outbox.remove_task(task_id);
        self.inflight.take_if(|m| m.task_id == task_id);
        if !gone.is_empty() {
            // The protocol's word (`dead_letter`), as the hub sent it, not a Rust debug form.
            let status_word = status.map_or("(none)", AckStatus::as_str);
            tracing::info!(task_id = %task_id, status = %status_word, "result acknowledged by the hub");
            self.deps
                .recorder
                .acked(task_id, status.map(AckStatus::as_str));
            self.deps
                .telemetry
                .acked(task_id, status.map(AckStatus::as_str));
            self.forget(gone).await;
        }
        self.pump_outbox().await;
    }

    /// A hub `error`: a final refusal of the in-flight result drops it; others are logged.
    pub(super) async fn on_hub_error(&mut self, error: &HubErrorCode, message_type: Option<&str>) {
        if error.kind() == HubErrorKind::ResultRefused {
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

    /// Send the next outbox entry if nothing is in flight.
    pub(super) async fn pump_outbox(&mut self) {
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
            // The result just stored goes out as it is: reading it back would cost a trip
            // through the blocking pool on every task's critical path.
            let fresh = self.just_stored.take().filter(|(seq, _)| *seq == meta.seq);
            let frame = match fresh {
                Some((_, frame)) => Ok(Some(frame)),
                None => self
                    .store
                    .entry(meta.seq)
                    .await
                    .map(|e| e.map(|entry| entry.frame)),
            };
            let frame = match frame {
                Ok(Some(frame)) => frame,
                res => {
                    let error = res.err().map(|e| e.to_string()).unwrap_or_default();
                    tracing::error!(task_id = %meta.task_id, error = %error, "cannot read the stored result back; dropping it");
                    self.outbox.remove_seq(meta.seq);
                    self.forget(vec![meta.seq]).await;
                    continue;
                }
            };
            if self.link.send_with_barrier(frame, &meta.task_id) {
                self.inflight = Some(meta);
            } else {
                // The link's queue is full or closed: look again shortly.
                self.outbox_retry_at = Some(Instant::now() + Duration::from_secs(1));
            }
            return;
        }
    }
}

/// Which tasks get `task_accepted` right after `identified` (PROTOCOL.md § 8): the task still
/// running here and every task whose terminal frame waits in the outbox, once each, running
/// task first. A hub that restarted puts its AgentFSM in `assigned` for such a task with a
/// 60 s acceptance timer, and only `task_accepted` moves it to `working`: without it the hub
/// reclaims a task that is still running (generation + 1) or leaves the agent unusable. A hub
/// that did not restart merely logs `fsm_unexpected_task_accepted`; it never rejects it.
pub(super) fn accepted_after_identify<'a>(
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
