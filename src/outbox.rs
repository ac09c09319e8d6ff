//! Which outbox entry to send next: the delivery policy, in memory, separate from the
//! journal that makes entries durable ([`crate::state`]) and from the daemon that sends them.
//!
//! Rules:
//! - newest first: a fresh result goes out before an old backlog (one result at a time is
//!   in flight, so a backlog of 1,000 would otherwise delay it by 1,000 round trips, or by
//!   minutes under the hub's rate limit); an old entry can only wait while newer ones are
//!   delivered, and at most one new result appears per task;
//! - an entry the hub did not answer (the ping after it came back first) waits before it is
//!   tried again, doubling from 1 s to 5 min, while the others go ahead: one frame the hub
//!   never answers cannot block the rest;
//! - bounded: past `max_entries` the oldest entry is dropped (the caller logs what and why);
//! - an entry older than `expiry` is dropped: the hub re-queued that task long ago.

use std::time::Duration;

use tokio::time::Instant;

use crate::state::OutboxMeta;

/// First wait after an unanswered send; doubles per further miss.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// One entry waiting for the hub's answer.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Which result this is (its journal sequence and task) and when it was stored.
    pub meta: OutboxMeta,
    /// Sends that went unanswered.
    pub misses: u32,
    /// Not sent again before this.
    pub not_before: Option<Instant>,
}

/// What [`Outbox::next`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Send this entry now.
    Send(OutboxMeta),
    /// Everything waits after a miss; try again at this time.
    WaitUntil(Instant),
    /// Nothing is waiting.
    Empty,
}

/// The results waiting for the hub's acknowledgement, and which one to send next.
#[derive(Debug)]
pub struct Outbox {
    /// Oldest first (sequence order).
    entries: Vec<Pending>,
    max_entries: usize,
    expiry: Duration,
}

impl Outbox {
    /// An empty outbox keeping at most `max_entries` (at least 1), each for at most `expiry`.
    pub fn new(max_entries: usize, expiry: Duration) -> Outbox {
        Outbox {
            entries: Vec::new(),
            max_entries: max_entries.max(1),
            expiry,
        }
    }

    /// Results waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The waiting entries, oldest first (e.g. to re-announce their tasks after identify).
    pub fn iter(&self) -> impl Iterator<Item = &OutboxMeta> {
        self.entries.iter().map(|p| &p.meta)
    }

    /// Add an entry; returns those dropped to stay within the bound (oldest first).
    pub fn push(&mut self, meta: OutboxMeta) -> Vec<OutboxMeta> {
        self.entries.push(Pending {
            meta,
            misses: 0,
            not_before: None,
        });
        let over = self.entries.len().saturating_sub(self.max_entries);
        self.entries.drain(..over).map(|p| p.meta).collect()
    }

    /// Remove every entry for `task_id` (the hub acknowledged the task); returns their seqs.
    pub fn remove_task(&mut self, task_id: &str) -> Vec<u64> {
        let mut gone = Vec::new();
        self.entries.retain(|p| {
            let hit = p.meta.task_id == task_id;
            if hit {
                gone.push(p.meta.seq);
            }
            !hit
        });
        gone
    }

    /// Remove one entry (the hub refused it for good).
    pub fn remove_seq(&mut self, seq: u64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|p| p.meta.seq != seq);
        self.entries.len() != before
    }

    /// Remove and return entries created more than `expiry` before `now_ms`.
    pub fn take_expired(&mut self, now_ms: i64) -> Vec<OutboxMeta> {
        let limit = now_ms.saturating_sub(self.expiry.as_millis().min(i64::MAX as u128) as i64);
        let mut gone = Vec::new();
        self.entries.retain(|p| {
            let old = p.meta.created_at < limit;
            if old {
                gone.push(p.meta.clone());
            }
            !old
        });
        gone
    }

    /// The entry with sequence `seq` went unanswered: hold it back, longer each time.
    pub fn missed(&mut self, seq: u64, now: Instant) {
        if let Some(p) = self.entries.iter_mut().find(|p| p.meta.seq == seq) {
            p.misses = p.misses.saturating_add(1);
            let wait = RETRY_FIRST
                .saturating_mul(1u32 << (p.misses - 1).min(16))
                .min(RETRY_MAX);
            p.not_before = Some(now + wait);
        }
    }

    /// The newest entry that may be sent at `now`.
    pub fn next(&self, now: Instant) -> Next {
        let mut earliest: Option<Instant> = None;
        for p in self.entries.iter().rev() {
            match p.not_before {
                Some(t) if t > now => earliest = Some(earliest.map_or(t, |e| e.min(t))),
                _ => return Next::Send(p.meta.clone()),
            }
        }
        earliest.map_or(Next::Empty, Next::WaitUntil)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(seq: u64, task_id: &str, created_at: i64) -> OutboxMeta {
        OutboxMeta {
            seq,
            task_id: task_id.into(),
            created_at,
        }
    }

    fn sends(o: &Outbox, now: Instant) -> Option<String> {
        match o.next(now) {
            Next::Send(m) => Some(m.task_id),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_newest_goes_first_and_an_unanswered_one_does_not_block_the_rest() {
        let mut o = Outbox::new(10, Duration::from_secs(3600));
        o.push(meta(1, "old", 0));
        o.push(meta(2, "fresh", 0));
        let now = Instant::now();
        assert_eq!(sends(&o, now).as_deref(), Some("fresh"));
        // The hub answers the ping after "fresh" but not "fresh" itself.
        o.missed(2, now);
        assert_eq!(sends(&o, now).as_deref(), Some("old"));
        o.missed(1, now);
        assert_eq!(o.next(now), Next::WaitUntil(now + Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(sends(&o, Instant::now()).as_deref(), Some("fresh"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_after_a_miss_doubles_and_is_capped() {
        let mut o = Outbox::new(10, Duration::from_secs(3600));
        o.push(meta(1, "t", 0));
        let now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..12 {
            o.missed(1, now);
            match o.next(now) {
                Next::WaitUntil(t) => waits.push((t - now).as_secs()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(&waits[..5], &[1, 2, 4, 8, 16]);
        assert_eq!(*waits.last().unwrap(), 300);
    }

    #[test]
    fn past_the_bound_the_oldest_is_dropped() {
        let mut o = Outbox::new(2, Duration::from_secs(3600));
        assert!(o.push(meta(1, "a", 0)).is_empty());
        assert!(o.push(meta(2, "b", 0)).is_empty());
        assert_eq!(o.push(meta(3, "c", 0)), vec![meta(1, "a", 0)]);
        assert_eq!(o.len(), 2);
        let ids: Vec<&str> = o.iter().map(|m| m.task_id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
    }

    #[test]
    fn expired_entries_are_taken_out_and_acks_remove_by_task() {
        let mut o = Outbox::new(10, Duration::from_secs(60));
        o.push(meta(1, "old", 1_000));
        o.push(meta(2, "new", 100_000));
        o.push(meta(3, "new", 100_500));
        assert_eq!(o.take_expired(100_000), vec![meta(1, "old", 1_000)]);
        assert_eq!(o.remove_task("new"), vec![2, 3]);
        assert!(o.is_empty());
        assert!(!o.remove_seq(2));
    }
}
