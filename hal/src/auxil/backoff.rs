//! The one host-side back-off for polling loops: spin briefly, then yield, then sleep (CI runs
//! several ranks on two cores, so a waiter must give its core away soon).

use crate::{Error, Result};
use std::time::{Duration, Instant};

/// Spin `spin_limit` rounds, yield until `yield_limit`, then sleep `sleep` per round.
///
/// ```
/// let mut backoff = mscclpp_hal::auxil::Backoff::new();
/// let mut polls = 0;
/// while polls < 10 {
///     polls += 1;
///     backoff.snooze();
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Backoff {
    rounds: u32,
    spin_limit: u32,
    yield_limit: u32,
    sleep: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

impl Backoff {
    /// 64 spins, then yields up to round 1024, then 50 us sleeps.
    pub const fn new() -> Self {
        Backoff::with_limits(64, 1024, Duration::from_micros(50))
    }

    /// A back-off that spins for the first `spin_limit` rounds, yields until round
    /// `yield_limit` and sleeps `sleep` on every round after that.
    pub const fn with_limits(spin_limit: u32, yield_limit: u32, sleep: Duration) -> Self {
        Backoff {
            rounds: 0,
            spin_limit,
            yield_limit,
            sleep,
        }
    }

    /// Waits a little, longer as the rounds go on.
    pub fn snooze(&mut self) {
        if self.rounds < self.spin_limit {
            std::hint::spin_loop();
        } else if self.rounds < self.yield_limit {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
        }
        self.rounds = self.rounds.saturating_add(1);
    }

    /// Starts again with spinning (after progress was made).
    pub fn reset(&mut self) {
        self.rounds = 0;
    }

    /// Rounds snoozed since creation or the last [`Backoff::reset`].
    pub fn rounds(&self) -> u32 {
        self.rounds
    }
}

/// Polls `done` until it returns `Ok(true)`, backing off with [`Backoff::new`] between polls;
/// [`Error::Timeout`] naming `op` after `timeout`. An error from `done` ends the wait.
pub fn poll_until(
    op: &'static str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut backoff = Backoff::new();
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
        let mut b = Backoff::with_limits(2, 4, Duration::from_micros(1));
        for _ in 0..6 {
            b.snooze();
        }
        assert_eq!(b.rounds(), 6);
        b.reset();
        assert_eq!(b.rounds(), 0);
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
