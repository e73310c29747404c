//! The one back-off of the workspace (core re-exports it as `mscclpp::backoff::Backoff`): how a
//! host thread waiting for memory another agent writes (a FIFO slot, a semaphore token, a
//! completion queue, a binding slot, a socket that is not up yet) spins, then yields, then
//! sleeps, so a wait that ends soon stays fast and a long one costs no CPU (CI runs several
//! ranks on two cores, so a waiter must give its core away soon).
//!
//! [`Backoff`] is the step ("snooze") with its phases chosen by the caller; [`poll_until`] is
//! the HAL's condition-with-timeout loop built on it (core's `spin_until` is another).

use crate::{Error, Result};
use std::time::{Duration, Instant};

/// A spin / yield / sleep back-off: `spins` spin-loop hints, then yields (`yields` of them, or
/// for `yield_for` when set), then sleeps starting at `sleep` and doubling up to `max_sleep`.
/// [`Backoff::reset`] starts over (call it when the awaited event happened).
///
/// ```
/// let mut backoff = mscclpp_hal::auxil::Backoff::polling();
/// let mut polls = 0;
/// while polls < 10 {
///     polls += 1;
///     backoff.snooze();
/// }
/// ```
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

impl Default for Backoff {
    fn default() -> Self {
        Backoff::polling()
    }
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

    /// The polling default: 64 spins, then yields up to step 1024, then 50 us sleeps.
    pub const fn polling() -> Backoff {
        let sleep = Duration::from_micros(50);
        Backoff::new(64, 1024 - 64, sleep, sleep)
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

    /// Steps snoozed since creation or the last [`Backoff::reset`].
    pub fn rounds(&self) -> u32 {
        self.step
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

/// Polls `done` until it returns `Ok(true)`, backing off with [`Backoff::polling`] between
/// polls; [`Error::Timeout`] naming `op` after `timeout`. An error from `done` ends the wait.
pub fn poll_until(
    op: &'static str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut backoff = Backoff::polling();
    loop {
        if done()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                op,
                waited: timeout,
            });
        }
        backoff.snooze();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_counts_rounds_and_resets() {
        let mut b = Backoff::new(2, 2, Duration::from_micros(1), Duration::from_micros(1));
        for _ in 0..6 {
            b.snooze();
        }
        assert_eq!(b.rounds(), 6);
        b.reset();
        assert_eq!(b.rounds(), 0);
    }

    #[test]
    fn polling_spins_then_yields_then_sleeps() {
        let mut b = Backoff::polling();
        for _ in 0..1024 {
            b.snooze();
        }
        assert!(!b.is_sleeping(), "64 spins and 960 yields before any sleep");
        b.snooze();
        assert!(b.is_sleeping());
        assert_eq!(
            b.next_sleep,
            Duration::from_micros(50),
            "a fixed 50 us sleep"
        );
    }

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
    fn poll_until_returns_when_done_and_times_out_otherwise() {
        let mut n = 0;
        poll_until("count", Duration::from_secs(5), || {
            n += 1;
            Ok(n == 100)
        })
        .expect("done after 100 polls");
        assert_eq!(n, 100);
        match poll_until("never", Duration::from_millis(20), || Ok(false)) {
            Err(Error::Timeout { op: "never", .. }) => {}
            other => panic!("expected a timeout naming the op, got {other:?}"),
        }
        let failed = poll_until("fails", Duration::from_secs(5), || {
            Err(Error::invalid("fails", "x", "y"))
        });
        assert!(matches!(failed, Err(Error::InvalidArgument { .. })));
    }
}
