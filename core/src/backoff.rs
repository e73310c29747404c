//! Core's condition-with-timeout wait, [`spin_until`], over the workspace's one back-off
//! ([`Backoff`], the HAL's, re-exported here so `crate::backoff::Backoff` keeps working): how a
//! thread waiting for memory another agent writes (a FIFO slot, a semaphore token, a
//! completion queue, a socket that is not up yet) spins, then yields, then sleeps.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub use mscclpp_hal::auxil::Backoff;

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
