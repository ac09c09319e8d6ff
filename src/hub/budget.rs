//! A mirror of the hub's per-agent "normal" token bucket (PROTOCOL.md §2).
//!
//! `task_progress` and the lifecycle frames (`task_accepted`, `task_complete`, `task_failed`,
//! `task_recovering`, `state_report`, `resource_report`) share one budget at the hub, and the
//! hub *drops* a frame over budget. Progress may only spend down to `reserve`, so a terminal
//! frame always finds a token. The hub's own hints (`rate_limit_warning.remaining`,
//! `rate_limited.retry_after_ms`) pull our view down to the hub's.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Longest pause a `rate_limited` answer can impose. The hub's buckets refill at least one
/// token a minute per tier, so an honest `retry_after_ms` is below this.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// Shared by the link (lifecycle frames) and the progress pumps.
#[derive(Debug)]
pub struct RateBudget {
    capacity: f64,
    per_sec: f64,
    reserve: f64,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    paused_until: Option<Instant>,
}

impl Bucket {
    /// The one refill formula: tokens at `now`, `per_sec` added since `last`, at most
    /// `capacity`. Takes nothing and moves nothing.
    fn level(&self, now: Instant, per_sec: f64, capacity: f64) -> f64 {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        (self.tokens + elapsed * per_sec).min(capacity)
    }

    /// How long a pause still holds at `now`, if one does.
    fn paused(&self, now: Instant) -> Option<Duration> {
        self.paused_until
            .filter(|until| now < *until)
            .map(|until| until - now)
    }
}

impl RateBudget {
    /// A full bucket of `capacity` tokens refilled at `refill_per_minute`, of which progress
    /// leaves `reserve` to lifecycle frames.
    pub fn new(capacity: u32, refill_per_minute: u32, reserve: u32) -> RateBudget {
        RateBudget {
            capacity: capacity as f64,
            per_sec: refill_per_minute as f64 / 60.0,
            reserve: reserve as f64,
            bucket: Mutex::new(Bucket {
                tokens: capacity as f64,
                last: Instant::now(),
                paused_until: None,
            }),
        }
    }

    /// The budget the config's `[progress]` section describes.
    pub fn from_config(c: &crate::config::ProgressConfig) -> RateBudget {
        RateBudget::new(c.capacity, c.refill_per_minute, c.reserve)
    }

    /// Take a token for a progress frame, never below the reserve. `Err(wait)` says how long
    /// until one would be available.
    pub fn try_progress(&self) -> Result<(), Duration> {
        self.try_take(self.reserve + 1.0)
    }

    /// Take a token for a lifecycle frame. `Err(wait)` when the bucket is empty or paused.
    pub fn try_lifecycle(&self) -> Result<(), Duration> {
        self.try_take(1.0)
    }

    fn try_take(&self, need: f64) -> Result<(), Duration> {
        let now = Instant::now();
        let mut b = self.bucket.lock().expect("budget lock poisoned");
        if let Some(wait) = b.paused(now) {
            return Err(wait);
        }
        b.paused_until = None;
        b.tokens = b.level(now, self.per_sec, self.capacity);
        b.last = now;
        if b.tokens >= need {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(self.wait_for(need - b.tokens))
        }
    }

    /// How long the refill takes to add `missing` tokens (a minute when it never would).
    fn wait_for(&self, missing: f64) -> Duration {
        if self.per_sec > 0.0 {
            Duration::from_secs_f64(missing / self.per_sec)
        } else {
            Duration::from_secs(60)
        }
    }

    /// How long until a lifecycle token is available (zero if one is now). Takes nothing.
    pub fn try_lifecycle_wait(&self) -> Duration {
        let now = Instant::now();
        let b = self.bucket.lock().expect("budget lock poisoned");
        if let Some(wait) = b.paused(now) {
            return wait;
        }
        let tokens = b.level(now, self.per_sec, self.capacity);
        if tokens >= 1.0 || self.per_sec <= 0.0 {
            Duration::ZERO
        } else {
            self.wait_for(1.0 - tokens)
        }
    }

    /// The hub says only `remaining` tokens are left: believe it if it is lower than ours.
    pub fn on_warning(&self, remaining: u64) {
        let mut b = self.bucket.lock().expect("budget lock poisoned");
        b.tokens = b.tokens.min(remaining as f64);
    }

    /// The hub dropped a frame: empty the bucket and send nothing for `retry_after`, at most
    /// [`MAX_PAUSE`] (an honest hub never asks for more; if it still limits, it says so again).
    pub fn on_rate_limited(&self, retry_after: Duration) {
        let retry_after = retry_after.min(MAX_PAUSE);
        let mut b = self.bucket.lock().expect("budget lock poisoned");
        b.tokens = 0.0;
        b.last = Instant::now() + retry_after;
        b.paused_until = Some(Instant::now() + retry_after);
    }

    /// Tokens available now (for metrics and tests).
    pub fn available(&self) -> f64 {
        let b = self.bucket.lock().expect("budget lock poisoned");
        b.level(Instant::now(), self.per_sec, self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn progress_never_eats_the_reserve() {
        let b = RateBudget::new(10, 60, 3);
        let mut sent = 0;
        while b.try_progress().is_ok() {
            sent += 1;
        }
        assert_eq!(sent, 7);
        for _ in 0..3 {
            assert!(b.try_lifecycle().is_ok());
        }
        let wait = b.try_lifecycle().unwrap_err();
        assert!(wait <= Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.try_lifecycle().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_pauses_everything() {
        let b = RateBudget::new(60, 60, 10);
        b.on_rate_limited(Duration::from_secs(2));
        assert!(b.try_lifecycle().is_err());
        tokio::time::advance(Duration::from_millis(2100)).await;
        assert!(b.try_progress().is_err(), "refill restarts after the pause");
        assert!(b.try_lifecycle().is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.try_lifecycle().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn every_reading_agrees_on_the_refill() {
        // 2 tokens a second, capacity 4: empty it, then read it half a second later.
        let b = RateBudget::new(4, 120, 0);
        while b.try_lifecycle().is_ok() {}
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!((b.available() - 0.5).abs() < 1e-9, "{}", b.available());
        assert_eq!(b.try_lifecycle_wait(), Duration::from_millis(250));
        assert_eq!(b.try_lifecycle().unwrap_err(), Duration::from_millis(250));
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(b.try_lifecycle_wait(), Duration::ZERO);
        assert!(b.try_lifecycle().is_ok());
        // Never past capacity, however long it rests.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!((b.available() - 4.0).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn warning_pulls_tokens_down() {
        let b = RateBudget::new(60, 60, 10);
        b.on_warning(5);
        assert!(b.try_progress().is_err());
        assert!(b.try_lifecycle().is_ok());
    }
}
