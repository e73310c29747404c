//! The one back-off of core: how a thread waiting for memory another agent writes (a FIFO
//! slot, a semaphore token, a completion queue, a socket that is not up yet) spins, then
//! yields, then sleeps, so a wait that ends soon stays fast and a long one costs no CPU (CI
//! runs 4 ranks on 2 cores).
//!
//! [`Backoff`] is the step ("snooze") with its phases chosen by the caller; [`spin_until`] is
//! the condition-with-timeout loop built on it that the device stand-in and the host-side
//! waits use. (The HAL has its own `poll_until` below this crate.)

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A spin / yield / sleep back-off: `spins` spin-loop hints, then yields (`yields` of them, or
/// for `yield_for` when set), then sleeps starting at `sleep` and doubling up to `max_sleep`.
/// [`Backoff::reset`] starts over (call it when the awaited event happened).
#[derive(Debug, Clone)]
pub struct Backoff {
    spins: u32,
    yields: u32,
    yield_for: Option<Duration>,
    first_sleep: Duration,
    max_sleep: Duration,
    step: u32,
    yield_start: Option<Instant>,
    next_sleep: Duration,
    sleeping: bool,
}

impl Backoff {
    /// Spins `spins` times, yields `yields` times, then sleeps `sleep` doubling to `max_sleep`.
    pub const fn new(spins: u32, yields: u32, sleep: Duration, max_sleep: Duration) -> Backoff {
        Backoff {
            spins,
            yields,
            yield_for: None,
            first_sleep: sleep,
            max_sleep,
            step: 0,
            yield_start: None,
            next_sleep: sleep,
            sleeping: false,
        }
    }

    /// Only sleeps: `first` doubling to `max` (retries of connects, accepts and binds).
    pub const fn sleeping(first: Duration, max: Duration) -> Backoff {
        Backoff::new(0, 0, first, max)
    }

    /// Bounds the yield phase by time instead of a count: yields until `d` has passed since the
    /// spinning ended (the clock is read only once spinning is over).
    pub const fn yielding_for(mut self, d: Duration) -> Backoff {
        self.yield_for = Some(d);
        self
    }

    /// Starts over with spinning.
    pub fn reset(&mut self) {
        self.step = 0;
        self.yield_start = None;
        self.next_sleep = self.first_sleep;
        self.sleeping = false;
    }

    /// Whether the back-off has reached its sleeping phase (the last step slept).
    pub fn is_sleeping(&self) -> bool {
        self.sleeping
    }

    /// Waits one step.
    pub fn snooze(&mut self) {
        self.snooze_at_most(None);
    }

    /// Waits one step; a sleep is cut to `cap` when given.
    pub fn snooze_at_most(&mut self, cap: Option<Duration>) {
        self.step = self.step.saturating_add(1);
        if self.step <= self.spins {
            std::hint::spin_loop();
            return;
        }
        let yielding = match self.yield_for {
            Some(d) => self.yield_start.get_or_insert_with(Instant::now).elapsed() < d,
            None => self.step <= self.spins.saturating_add(self.yields),
        };
        if yielding {
            std::thread::yield_now();
            return;
        }
        let mut d = self.next_sleep;
        if let Some(c) = cap {
            d = d.min(c);
        }
        self.sleeping = true;
        std::thread::sleep(d);
        self.next_sleep = (self.next_sleep * 2).min(self.max_sleep);
    }
}

/// Polls `cond` until it holds or `timeout` passes: 256 spins, then yields for 50 ms, then
/// 50 us sleeps; the clock is read every 64 polls. The error names `what`.
pub fn spin_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let mut backoff = Backoff::new(256, 0, Duration::from_micros(50), Duration::from_micros(50))
        .yielding_for(Duration::from_millis(50));
    let mut start: Option<Instant> = None;
    let mut polls: u64 = 0;
    loop {
        if cond() {
            return Ok(());
        }
        polls += 1;
        if polls > 256 && polls.is_multiple_of(64) {
            let waited = start.get_or_insert_with(Instant::now).elapsed();
            if waited >= timeout {
                return Err(Error::timeout(format!("waiting for {what}"), timeout));
            }
        }
        backoff.snooze();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_follow_the_counts() {
        let mut b = Backoff::new(2, 2, Duration::from_micros(1), Duration::from_micros(4));
        for _ in 0..4 {
            assert!(!b.is_sleeping());
            b.snooze();
        }
        b.snooze();
        assert!(b.is_sleeping());
        assert_eq!(b.next_sleep, Duration::from_micros(2));
        b.snooze();
        b.snooze();
        assert_eq!(
            b.next_sleep,
            Duration::from_micros(4),
            "sleeps cap at max_sleep"
        );
        b.reset();
        assert!(!b.is_sleeping());
        assert_eq!(b.next_sleep, Duration::from_micros(1));
    }

    #[test]
    fn sleeping_backoff_doubles_and_respects_the_cap() {
        let mut b = Backoff::sleeping(Duration::from_millis(1), Duration::from_millis(4));
        let t = Instant::now();
        b.snooze_at_most(Some(Duration::ZERO));
        assert!(t.elapsed() < Duration::from_millis(1) * 50);
        assert_eq!(b.next_sleep, Duration::from_millis(2));
    }

    #[test]
    fn spin_until_times_out_and_succeeds() {
        let e = spin_until("nothing", Duration::from_millis(20), || false).unwrap_err();
        assert!(e.to_string().contains("nothing"), "{e}");
        let mut n = 0;
        spin_until("a count", Duration::from_secs(5), || {
            n += 1;
            n > 1000
        })
        .unwrap();
    }
}
