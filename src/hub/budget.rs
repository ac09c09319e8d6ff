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

impl RateBudget {
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
        if let Some(until) = b.paused_until {
            if now < until {
                return Err(until - now);
            }
            b.paused_until = None;
        }
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_sec).min(self.capacity);
        b.last = now;
        if b.tokens >= need {
            b.tokens -= 1.0;
            Ok(())
        } else if self.per_sec > 0.0 {
            Err(Duration::from_secs_f64((need - b.tokens) / self.per_sec))
        } else {
            Err(Duration::from_secs(60))
        }
    }

    /// How long until a lifecycle token is available (zero if one is now). Takes nothing.
    pub fn try_lifecycle_wait(&self) -> Duration {
        let now = Instant::now();
        let b = self.bucket.lock().expect("budget lock poisoned");
        if let Some(until) = b.paused_until {
            if now < until {
                return until - now;
            }
        }
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        let tokens = (b.tokens + elapsed * self.per_sec).min(self.capacity);
        if tokens >= 1.0 || self.per_sec <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - tokens) / self.per_sec)
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
        let now = Instant::now();
        let b = self.bucket.lock().expect("budget lock poisoned");
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        (b.tokens + elapsed * self.per_sec).min(self.capacity)
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
    async fn warning_pulls_tokens_down() {
        let b = RateBudget::new(60, 60, 10);
        b.on_warning(5);
        assert!(b.try_progress().is_err());
        assert!(b.try_lifecycle().is_ok());
    }
}
