//! Reconnect delays: exponential with **full jitter**, also at the cap.
//!
//! Hundreds of agents lose their link at the same moment when the hub restarts; a delay of
//! `random(0, min(cap, base·2^n))` spreads their reconnects over the whole window instead of
//! bunching them at the cap (the AWS "full jitter" scheme).

use std::time::Duration;

/// Reconnect delays: a ceiling doubling from `min` up to `max`, each delay drawn below it.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A backoff whose ceiling starts at `min` and never passes `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            attempt: 0,
            rng: fastrand::Rng::new(),
        }
    }

    /// A deterministic generator for tests.
    pub fn with_seed(min: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            rng: fastrand::Rng::with_seed(seed),
            ..Backoff::new(min, max)
        }
    }

    /// The ceiling of the next delay (before jitter).
    pub fn ceiling(&self) -> Duration {
        let factor = 1u64 << self.attempt.min(20);
        self.min.saturating_mul(factor as u32).min(self.max)
    }

    /// The next delay: uniform in `[min/2, ceiling]`. A small floor keeps a fleet from
    /// hammering a hub that refuses connections instantly.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let floor = self.min / 2;
        let span = ceiling.saturating_sub(floor).as_millis() as u64;
        floor + Duration::from_millis(self.rng.u64(0..=span))
    }

    /// The delay after an auth error: retrying fast cannot help, so wait between half the
    /// maximum and the maximum (still jittered, so a fleet with a revoked token spreads out).
    pub fn auth_delay(&mut self) -> Duration {
        self.attempt = 32;
        let half = self.max / 2;
        half + Duration::from_millis(self.rng.u64(0..=half.as_millis() as u64))
    }

    /// After `identified`.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Parse the hub's 1008 cooldown reason: `"cooldown active: retry in 30s"` → 30 s.
pub fn cooldown_from_reason(reason: &str) -> Option<Duration> {
    let rest = reason.split("retry in").nth(1)?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_everywhere() {
        let mut b = Backoff::with_seed(Duration::from_secs(1), Duration::from_secs(60), 7);
        let mut delays = Vec::new();
        for _ in 0..20 {
            delays.push(b.next_delay());
        }
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(60)));
        assert!(delays[0] <= Duration::from_secs(1));
        // At the cap the delays still differ: no fleet-wide lockstep.
        let at_cap = &delays[10..];
        let distinct: std::collections::HashSet<_> = at_cap.iter().collect();
        assert!(distinct.len() > 5, "{at_cap:?}");
        assert!(at_cap.iter().any(|d| *d < Duration::from_secs(45)));
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_secs(1));
        for _ in 0..50 {
            let d = b.auth_delay();
            assert!(
                d >= Duration::from_secs(30) && d <= Duration::from_secs(60),
                "{d:?}"
            );
        }
        assert_eq!(b.ceiling(), Duration::from_secs(60));
    }

    #[test]
    fn parses_cooldown_reason() {
        assert_eq!(
            cooldown_from_reason("cooldown active: retry in 30s"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            cooldown_from_reason("cooldown active: retry in 300 s"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(cooldown_from_reason("too many validation errors"), None);
    }
}
