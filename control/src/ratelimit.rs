//! Token buckets per key (a MAC, a node's or job server's identity), with
//! an optional bucket for everything: the one rate limiter of the service
//! (`/ipxe/` per MAC, boot events and renewals per identity, and the
//! warnings that say a limit was hit). Pure: the caller passes the time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most keys a limiter remembers; beyond it, full buckets are dropped,
/// and if none is full, new keys are refused.
const MAX_KEYS: usize = 65_536;

/// `count` per `per`, bursting to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Tokens a window adds.
    pub count: f64,
    /// The window.
    pub per: Duration,
    /// The most tokens a bucket holds.
    pub burst: f64,
}

impl Rate {
    /// `count` a minute, bursting to the whole minute (at least 1).
    pub fn per_minute(count: u32) -> Rate {
        let count = f64::from(count.max(1));
        Rate {
            count,
            per: Duration::from_secs(60),
            burst: count,
        }
    }

    /// `count` an hour, bursting to the whole hour (at least 1).
    pub fn per_hour(count: u32) -> Rate {
        let count = f64::from(count.max(1));
        Rate {
            count,
            per: Duration::from_secs(3600),
            burst: count,
        }
    }

    /// The same rate, bursting to `burst` (at least 1).
    #[must_use]
    pub fn burst(self, burst: f64) -> Rate {
        Rate {
            burst: burst.max(1.0),
            ..self
        }
    }

    fn per_sec(&self) -> f64 {
        self.count / self.per.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: &Rate, now: Instant) -> Bucket {
        Bucket {
            tokens: rate.burst,
            at: now,
        }
    }

    fn refill(&mut self, rate: &Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_sec()).min(rate.burst);
        self.at = now;
    }

    /// How long until `cost` tokens are there (zero: now).
    fn wait(&self, rate: &Rate, cost: f64) -> Duration {
        if self.tokens >= cost {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64((cost - self.tokens) / rate.per_sec()).unwrap_or(rate.per)
    }
}

/// Token buckets: one per key, and optionally one for all keys together.
#[derive(Debug)]
pub struct Limiter {
    per_key: Rate,
    total: Option<Rate>,
    state: Mutex<(Option<Bucket>, HashMap<String, Bucket>)>,
}

impl Limiter {
    /// A limit of `per_key` for each key and, if given, `total` for all.
    pub fn new(per_key: Rate, total: Option<Rate>) -> Limiter {
        let now = Instant::now();
        Limiter {
            per_key,
            total,
            state: Mutex::new((total.map(|t| Bucket::full(&t, now)), HashMap::new())),
        }
    }

    /// Whether a request for `key` may go on at `now`.
    pub fn allow(&self, key: &str, now: Instant) -> bool {
        self.check(key, now).is_ok()
    }

    /// Takes a token for `key` at `now`, or says how long until one is
    /// there (at least a second).
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        self.check_n(key, 1, now)
    }

    /// Takes `cost` tokens for `key` at `now` (a batch of that many), all or
    /// none, or says how long until they are there (at least a second). A
    /// cost above the burst is charged as the whole burst: it waits for a
    /// full bucket, never forever.
    pub fn check_n(&self, key: &str, cost: u32, now: Instant) -> Result<(), Duration> {
        let Ok(mut s) = self.state.lock() else {
            return Err(self.per_key.per);
        };
        let (all, keys) = &mut *s;
        let rate = self.per_key;
        if keys.len() >= MAX_KEYS && !keys.contains_key(key) {
            keys.retain(|_, b| {
                let mut probe = *b;
                probe.refill(&rate, now);
                probe.tokens < rate.burst
            });
            if keys.len() >= MAX_KEYS {
                return Err(Duration::from_secs(1));
            }
        }
        let bucket = keys
            .entry(key.to_owned())
            .or_insert_with(|| Bucket::full(&rate, now));
        bucket.refill(&rate, now);
        let own = f64::from(cost.max(1)).min(rate.burst);
        // The key's own limit first: one client retrying fast must not use
        // up everyone's budget.
        if bucket.tokens < own {
            return Err(bucket.wait(&rate, own).max(Duration::from_secs(1)));
        }
        if let (Some(all), Some(total)) = (all.as_mut(), &self.total) {
            all.refill(total, now);
            let shared = f64::from(cost.max(1)).min(total.burst);
            if all.tokens < shared {
                return Err(all.wait(total, shared).max(Duration::from_secs(1)));
            }
            all.tokens -= shared;
        }
        bucket.tokens -= own;
        Ok(())
    }
}

/// Seconds for a `Retry-After` header: `wait` rounded up.
pub fn retry_after_secs(wait: Duration) -> u32 {
    u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_bursts_to_its_budget_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let l = Limiter::new(Rate::per_minute(3), Some(Rate::per_minute(100).burst(10.0)));
        let allowed = (0..10).filter(|_| l.allow("aa", t0)).count();
        assert_eq!(allowed, 3, "one key bursts to its minute");
        // 20 s later: a third of a minute, one more.
        assert!(l.allow("aa", t0 + Duration::from_secs(20)));
        assert_eq!(
            l.check("aa", t0 + Duration::from_secs(20)),
            Err(Duration::from_secs(20))
        );
        // Another key is not held back by the first.
        assert!(l.allow("bb", t0 + Duration::from_secs(20)));
    }

    #[test]
    fn a_batch_takes_a_token_per_item_all_or_none() {
        let t0 = Instant::now();
        let l = Limiter::new(Rate::per_minute(60), None);
        assert_eq!(l.check_n("js", 50, t0), Ok(()));
        // 10 left: a batch of 20 takes none of them, and is told when 20
        // are there (10 more at one a second).
        assert_eq!(l.check_n("js", 20, t0), Err(Duration::from_secs(10)));
        assert_eq!(l.check_n("js", 10, t0), Ok(()));
        assert!(!l.allow("js", t0));
        // A batch above the burst waits for a full bucket, then passes.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(l.check_n("js", 500, later), Ok(()));
        assert!(!l.allow("js", later));
    }

    #[test]
    fn the_total_holds_across_keys() {
        let t0 = Instant::now();
        let l = Limiter::new(
            Rate::per_minute(1000),
            Some(Rate::per_minute(100).burst(10.0)),
        );
        let allowed = (0..50).filter(|i| l.allow(&format!("m{i}"), t0)).count();
        assert_eq!(allowed, 10);
        // A refused total takes no token from the key.
        let l = Limiter::new(Rate::per_minute(2), Some(Rate::per_minute(1).burst(1.0)));
        assert!(l.allow("a", t0));
        assert!(!l.allow("a", t0));
        assert!(l.allow("a", t0 + Duration::from_secs(60)));
    }

    #[test]
    fn an_hourly_budget_says_how_long_to_wait() {
        let t0 = Instant::now();
        let l = Limiter::new(Rate::per_hour(6), None);
        assert_eq!((0..20).filter(|_| l.allow("node:c01", t0)).count(), 6);
        let wait = l.check("node:c01", t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(600));
        assert_eq!(retry_after_secs(wait), 600);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert!(l.allow("node:c01", t0 + Duration::from_secs(600)));
    }
}
