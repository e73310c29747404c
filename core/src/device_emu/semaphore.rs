//! Semaphore device operations on the host backend: the same token protocol as
//! `semaphore_device.hpp`, on raw token addresses (the fields of the semaphore device handles).
//!
//! signal = ONE `fetch_add(1, Release)` on the peer's inbound token; wait = advance the expected
//! value, then spin on an `Acquire` load of the own inbound token; poll = one `Acquire` load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backoff::spin_until_device as spin_until;
use crate::error::Result;

/// # Safety
/// `p` must be a live, 8-byte aligned u64 that is only accessed atomically while in use.
unsafe fn atomic<'a>(p: *mut u64) -> &'a AtomicU64 {
    // SAFETY: forwarded from the caller.
    unsafe { AtomicU64::from_ptr(p) }
}

/// Signals the peer: one release fetch-add on `remote_inbound_token`.
///
/// # Safety
/// `remote_inbound_token` must point at a live, aligned u64 accessed only atomically.
pub unsafe fn signal(remote_inbound_token: *mut u64) {
    // SAFETY: forwarded from the caller.
    unsafe { atomic(remote_inbound_token) }.fetch_add(1, Ordering::Release);
}

/// Signals without ordering earlier memory operations.
///
/// # Safety
/// As [`signal`].
pub unsafe fn relaxed_signal(remote_inbound_token: *mut u64) {
    // SAFETY: forwarded from the caller.
    unsafe { atomic(remote_inbound_token) }.fetch_add(1, Ordering::Relaxed);
}

/// Non-blocking: true (and `*expected` advanced) if a signal not yet consumed has arrived.
///
/// # Safety
/// Both pointers live and aligned; `expected` is owned by the calling "thread" (one waiter per
/// handle, as on the GPU).
pub unsafe fn poll(inbound_token: *mut u64, expected: *mut u64) -> bool {
    // SAFETY: forwarded from the caller (expected is private to this waiter).
    let next = unsafe { expected.read_volatile() } + 1;
    // SAFETY: forwarded from the caller.
    if unsafe { atomic(inbound_token) }.load(Ordering::Acquire) >= next {
        // SAFETY: as above.
        unsafe { expected.write_volatile(next) };
        true
    } else {
        false
    }
}

/// Waits for the next signal (at most `timeout`): `++*expected`, then spin-acquire.
///
/// # Safety
/// As [`poll`].
pub unsafe fn wait(inbound_token: *mut u64, expected: *mut u64, timeout: Duration) -> Result<()> {
    wait_with(inbound_token, expected, timeout, Ordering::Acquire)
}

/// [`wait`] with relaxed loads: the caller fences before reading signalled data.
///
/// # Safety
/// As [`poll`].
pub unsafe fn relaxed_wait(
    inbound_token: *mut u64,
    expected: *mut u64,
    timeout: Duration,
) -> Result<()> {
    wait_with(inbound_token, expected, timeout, Ordering::Relaxed)
}

fn wait_with(
    inbound_token: *mut u64,
    expected: *mut u64,
    timeout: Duration,
    order: Ordering,
) -> Result<()> {
    // SAFETY: the public callers' contracts: expected is live and private to this waiter.
    let want = unsafe { expected.read_volatile() } + 1;
    // SAFETY: as above.
    unsafe { expected.write_volatile(want) };
    // SAFETY: as above: the token is live, aligned, atomically accessed.
    let token = unsafe { atomic(inbound_token) };
    spin_until("semaphore inbound token", timeout, || {
        token.load(order) >= want
    })
    .map_err(|e| {
        crate::backoff::describe_wait_error(
            e,
            |e| {
                format!(
                    "semaphore wait: inbound token {} never reached {want} ({e})",
                    token.load(Ordering::Relaxed)
                )
            },
            timeout,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_signals() {
        let mut inbound = 0u64;
        let mut expected = 0u64;
        let pi: *mut u64 = &mut inbound;
        let pe: *mut u64 = &mut expected;
        // SAFETY: both locals outlive the calls and are only used through these pointers.
        unsafe {
            assert!(!poll(pi, pe));
            signal(pi);
            signal(pi);
            assert!(poll(pi, pe));
            wait(pi, pe, Duration::from_secs(1)).expect("second signal is there");
            assert!(!poll(pi, pe));
            assert!(
                wait(pi, pe, Duration::from_millis(20)).is_err(),
                "no third signal"
            );
            relaxed_signal(pi);
            // expected already advanced to 3 by the failed wait, so the third signal satisfies it.
            assert!(!poll(pi, pe));
            assert_eq!(*pe, 3);
            assert_eq!(*pi, 3);
        }
    }
}
