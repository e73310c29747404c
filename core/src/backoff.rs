//! Core's condition-with-timeout wait, [`spin_until`], over the workspace's one back-off
//! ([`Backoff`], the HAL's, re-exported here so `crate::backoff::Backoff` keeps working): how a
//! thread waiting for memory another agent writes (a FIFO slot, a semaphore token, a
//! completion queue, a socket that is not up yet) spins, then yields, then sleeps.
//!
//! A wait also ends early when one of the calling thread's *watches* fails ([`watching`]): a
//! check the caller installs around a blocking call (the NCCL library's abort flag, the
//! liveness of the communicator's peers as its bootstrap sees them). Every wait of the host
//! backend (device emulation, semaphores, executor threads) runs [`check_watches`] about once
//! a millisecond once it sleeps, so an abort or a dead peer ends it within milliseconds
//! instead of its timeout.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub use mscclpp_hal::auxil::Backoff;

/// A check that ends the calling thread's waits when it fails: `Err` says why (an abort, a
/// dead peer naming its rank). It must not block; it runs about once a millisecond.
pub type Watch = Arc<dyn Fn() -> Result<()> + Send + Sync>;

thread_local! {
    static WATCHES: RefCell<Vec<Watch>> = const { RefCell::new(Vec::new()) };
}

/// How often a sleeping wait runs the thread's watches.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(1);

/// Runs `f` with `watch` added to this thread's watches (removed again when `f` returns or
/// unwinds). Watches nest: every installed one is checked.
pub fn watching<R>(watch: Watch, f: impl FnOnce() -> R) -> R {
    watching_all(std::slice::from_ref(&watch), f)
}

/// [`watching`] for several watches at once (e.g. those of [`current_watches`], handed to a
/// worker thread).
pub fn watching_all<R>(watches: &[Watch], f: impl FnOnce() -> R) -> R {
    struct Pop(usize);
    impl Drop for Pop {
        fn drop(&mut self) {
            WATCHES.with(|w| {
                let mut w = w.borrow_mut();
                let keep = w.len().saturating_sub(self.0);
                w.truncate(keep);
            });
        }
    }
    WATCHES.with(|w| w.borrow_mut().extend(watches.iter().cloned()));
    let _pop = Pop(watches.len());
    f()
}

/// This thread's watches, to install on threads that work for it ([`watching_all`]).
pub fn current_watches() -> Vec<Watch> {
    WATCHES.with(|w| w.borrow().clone())
}

/// The first failing watch of this thread, if any (`Ok` when none is installed).
pub fn check_watches() -> Result<()> {
    let watches = current_watches();
    watches.iter().try_for_each(|w| w())
}

/// Ends a wait on `what` because a watch failed, unless `cond` holds now (a signal that
/// landed just before the peer went still counts).
fn watched_out(what: &str, e: Error, cond: &mut impl FnMut() -> bool) -> Result<()> {
    if cond() {
        return Ok(());
    }
    Err(match e {
        Error::Remote { peer, what: why } => {
            Error::remote(peer, format!("{why} (while waiting for {what})"))
        }
        Error::Aborted(why) => Error::Aborted(format!("{why} (while waiting for {what})")),
        other => other,
    })
}

/// A wait's error as its caller reports it: a timeout becomes `Timeout` with the caller's
/// description (`what` of the original error); an abort or a dead peer (a watch's error)
/// keeps its kind and gets the description appended, so it is not reported as a timeout.
pub fn describe_wait_error(
    e: Error,
    what: impl FnOnce(&Error) -> String,
    after: Duration,
) -> Error {
    match e {
        Error::Timeout { .. } => Error::timeout(what(&e), after),
        other => other,
    }
}

/// Polls `cond` until it holds or `timeout` passes: 256 spins, then yields for 50 ms, then
/// 50 us sleeps; the clock is read every 64 polls, and then (at most every
/// [`WATCH_INTERVAL`]) the thread's watches run: a failing one ends the wait with its error.
/// The error names `what`.
pub fn spin_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let mut backoff = Backoff::new(256, 0, Duration::from_micros(50), Duration::from_micros(50))
        .yielding_for(Duration::from_millis(50));
    let mut start: Option<Instant> = None;
    let mut last_watch = Duration::ZERO;
    let mut polls: u64 = 0;
    loop {
        if cond() {
            return Ok(());
        }
        polls += 1;
        if polls > 256 && polls.is_multiple_of(64) {
            let waited = start.get_or_insert_with(Instant::now).elapsed();
            if waited >= last_watch + WATCH_INTERVAL || waited.is_zero() {
                last_watch = waited;
                if let Err(e) = check_watches() {
                    return watched_out(what, e, &mut cond);
                }
            }
            if waited >= timeout {
                return Err(Error::timeout(format!("waiting for {what}"), timeout));
            }
        }
        backoff.snooze();
    }
}

/// [`spin_until`] for an emulated device wait (`crate::device_emu`): it also ends, with an
/// error naming the peer when a peer's death raised it, once the process's abort word is up
/// ([`mscclpp_hal::abort`]; what `MSCCLPP_SPIN_UNTIL` polls on a GPU).
pub fn spin_until_device(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
) -> Result<()> {
    let mut aborted = false;
    spin_until(what, timeout, || {
        if cond() {
            return true;
        }
        aborted = mscclpp_hal::abort::abort_raised();
        aborted
    })?;
    if aborted {
        return Err(abort_word_error(what));
    }
    Ok(())
}

/// The error of a wait the abort word ended: naming the peer whose death raised it.
pub fn abort_word_error(what: &str) -> Error {
    match mscclpp_hal::abort::raised() {
        Some(mscclpp_hal::abort::Raised { peer: Some(p), why }) => Error::remote(
            p,
            format!("{why} (the abort word ended the wait for {what})"),
        ),
        Some(r) => Error::Aborted(format!(
            "{} (the abort word ended the wait for {what})",
            r.why
        )),
        None => Error::Aborted(format!(
            "the abort word was raised while waiting for {what}"
        )),
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

    #[test]
    fn a_failing_watch_ends_a_wait_at_once_and_only_inside_its_scope() {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = flag.clone();
        let watch: Watch = Arc::new(move || {
            if f.load(std::sync::atomic::Ordering::Acquire) {
                Err(Error::remote(3, "rank 3 is gone"))
            } else {
                Ok(())
            }
        });
        let t = Instant::now();
        let e = watching(watch.clone(), || {
            let f = flag.clone();
            let setter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                f.store(true, std::sync::atomic::Ordering::Release);
            });
            let r = spin_until("a token", Duration::from_secs(30), || false);
            setter.join().unwrap();
            r
        })
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(e.code(), crate::error::ErrorCode::RemoteError, "{e}");
        assert!(
            e.to_string().contains("rank 3") && e.to_string().contains("a token"),
            "{e}"
        );
        // Outside the scope the watch is gone: the wait runs to its own timeout.
        assert!(current_watches().is_empty());
        let e = spin_until("x", Duration::from_millis(20), || false).unwrap_err();
        assert_eq!(e.code(), crate::error::ErrorCode::Timeout);
        // A condition that holds when the watch fails still wins: this watch makes the
        // condition true as it fails (a count of polls raced the 1 ms watch interval on a
        // loaded machine).
        let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let h = held.clone();
        let failing: Watch = Arc::new(move || {
            h.store(true, std::sync::atomic::Ordering::Release);
            Err(Error::remote(3, "rank 3 is gone"))
        });
        watching(failing, || {
            spin_until("late", Duration::from_secs(5), || {
                held.load(std::sync::atomic::Ordering::Acquire)
            })
        })
        .expect("the condition held when the watch failed");
        drop(watch);
    }
}
