//! The abort word: how the host ends device-side waits that a dead or aborted peer will never
//! satisfy.
//!
//! Device code waits by spinning on memory a peer writes (a semaphore token, a packet flag).
//! When the peer dies or the communicator is aborted, nothing will ever write it, and the
//! kernel would spin until its spin bound traps, holding the stream, the
//! launch queue and the process's exit. The abort word is one 32-bit word of host memory that
//! every module's waits poll:
//!
//! - CUDA: pinned host memory mapped for the device (`cuMemHostAlloc(PORTABLE | DEVICEMAP)`,
//!   one allocation per process); each loaded module that defines the device global
//!   `mscclppAbortWord` (a `volatile int*`, declared by `mscclpp/device.hpp`) gets its address
//!   written at load. `MSCCLPP_SPIN_UNTIL` reads it every 1024 spins and, once it is non-zero,
//!   leaves the wait (no trap: a trap would end the context for every process sharing it
//!   under MPS). The kernel then runs on with whatever the memory held; the host reports the
//!   work as aborted ([`check_since`]).
//! - Host backend: the same word in plain memory; the emulated device waits
//!   (`mscclpp::device_emu`) poll it ([`abort_raised`], [`poll_abort`]).
//! - ROCm: as on CUDA: `hipHostMalloc(Mapped | Portable)` memory, its device address written
//!   into each loaded module's `mscclppAbortWord` (`hipModuleGetGlobal`), read with a
//!   system-scope `__hip_atomic_load`. (Debian's hipcc 15 crashed, "failed to annotate CFG", on
//!   wait loops that leave on the word while a failed check ends in `__builtin_trap()`; the
//!   check traps with inline `s_trap 2` instead.) Compiled for gfx90a; not yet run on an AMD
//!   GPU.
//!
//! Scope: the word is per process (all devices, all communicators). While it is raised every
//! device wait of this process ends early, also those of a communicator that did not fail;
//! stream and event synchronisation that saw a raise returns [`Error::Aborted`] naming the
//! peer. Raising returns a [`Hold`]: the word stays up while any hold lives, and is lowered
//! after the last one is dropped and the devices drained (their queued work finished, so no
//! kernel of the aborted communicator starts spinning again after the word went down).

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How many spins a device wait makes between two reads of the word (the header's
/// `MSCCLPP_ABORT_POLL_SPINS`; emulated waits use the same period).
pub const POLL_SPINS: u64 = 1024;

/// How long lowering the word waits for one device to drain before it lowers it anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Why the word went up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raised {
    /// The rank whose death raised it, when a peer died (`None`: an abort).
    pub peer: Option<usize>,
    /// What raised it (an abort call, a peer's death as the bootstrap saw it).
    pub why: String,
}

/// A device drain run before the word is lowered: waits (bounded) until the device's queued
/// work is done.
type Drain = std::sync::Arc<dyn Fn() + Send + Sync>;

struct State {
    /// Live [`Hold`]s.
    holders: usize,
    /// The first reason since the word last went up (`None` while it is down).
    raised: Option<Raised>,
    /// The last reason it was raised for (kept after lowering, for [`check_since`]).
    last: Option<Raised>,
    /// Raises so far.
    epoch: u64,
    /// One per device whose modules poll the word.
    drains: Vec<(usize, Drain)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    holders: 0,
    raised: None,
    last: None,
    epoch: 0,
    drains: Vec::new(),
});

/// The word itself when no mapped word exists (host backend, or before a GPU module loaded).
static PLAIN_WORD: AtomicU32 = AtomicU32::new(0);
/// The mapped word's host address once a GPU backend allocated it (null before).
static MAPPED_WORD: AtomicPtr<u32> = AtomicPtr::new(std::ptr::null_mut());

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

fn store_word(v: u32) {
    PLAIN_WORD.store(v, Ordering::Release);
    let p = MAPPED_WORD.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a mapped word, once set, is a live 4-byte aligned allocation never freed
        // (see `set_mapped_word`); the device reads it concurrently, hence the atomic store.
        unsafe { AtomicU32::from_ptr(p) }.store(v, Ordering::Release);
    }
}

/// Raises the word (ending every device wait of this process at its next read of the word)
/// for as long as the returned [`Hold`] lives; `peer` names the rank whose death raised it.
pub fn raise(peer: Option<usize>, why: impl Into<String>) -> Hold {
    let why = why.into();
    let mut st = state();
    st.holders += 1;
    st.epoch += 1;
    let r = Raised { peer, why };
    if st.raised.is_none() {
        st.raised = Some(r.clone());
    }
    st.last = Some(r);
    store_word(1);
    drop(st);
    Hold { _private: () }
}

/// Keeps the word raised; dropping the last one drains the devices (on a background thread,
/// at most 10 s per device) and lowers it.
#[derive(Debug)]
#[must_use = "the word is lowered again when the hold is dropped"]
pub struct Hold {
    _private: (),
}

impl Drop for Hold {
    fn drop(&mut self) {
        let has_drains = !state().drains.is_empty();
        if !has_drains {
            release();
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("mscclpp-abort-drain".into())
            .spawn(|| {
                // Each drain waits for its device, without the lock.
                let drains: Vec<Drain> = state().drains.iter().map(|(_, d)| d.clone()).collect();
                for d in drains {
                    d();
                }
                release();
            });
        if spawned.is_err() {
            // No thread: lower at once rather than never.
            release();
        }
    }
}

fn release() {
    let mut st = state();
    st.holders = st.holders.saturating_sub(1);
    if st.holders == 0 {
        st.raised = None;
        store_word(0);
    }
}

/// Why the word is up now, `None` while it is down.
pub fn raised() -> Option<Raised> {
    state().raised.clone()
}

/// Whether the word is up (one atomic load: what an emulated device wait polls).
pub fn abort_raised() -> bool {
    PLAIN_WORD.load(Ordering::Acquire) != 0
}

/// The emulated device's poll: every [`POLL_SPINS`]-th spin (`polls` counts them), whether
/// the word is up; `false` on the others (as `pollAbort` in `mscclpp/device.hpp`).
pub fn poll_abort(polls: u64) -> bool {
    polls.is_multiple_of(POLL_SPINS) && abort_raised()
}

/// How many times the word was raised so far (take it before waiting, give it to
/// [`check_since`] after).
pub fn epoch() -> u64 {
    state().epoch
}

/// `Err(Aborted)` when the word is up now or was raised since `epoch` (the work `op` waited
/// for may have left its waits early), naming the peer that raised it.
pub fn check_since(op: &'static str, epoch: u64) -> Result<()> {
    let st = state();
    let r = match (&st.raised, st.epoch != epoch) {
        (Some(r), _) => r.clone(),
        (None, true) => st.last.clone().unwrap_or(Raised {
            peer: None,
            why: "an abort".into(),
        }),
        (None, false) => return Ok(()),
    };
    Err(Error::Aborted {
        op,
        peer: r.peer,
        why: r.why,
    })
}

/// Waits until the word is down (after the last [`Hold`] was dropped and the devices
/// drained), at most `timeout`; whether it is down.
pub fn wait_lowered(timeout: Duration) -> bool {
    let start = Instant::now();
    loop {
        if !abort_raised() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The mapped word (a GPU backend's, allocated once per process): from now on raises and
/// lowers write it too, starting with the current state.
///
/// # Safety
/// `p` is a 4-byte aligned, live allocation the device can read, never freed.
#[cfg_attr(not(hal_cuda), allow(dead_code))]
pub(crate) unsafe fn set_mapped_word(p: *mut u32) {
    let st = state();
    MAPPED_WORD.store(p, Ordering::Release);
    store_word(u32::from(st.raised.is_some()));
}

/// Registers the drain of device `ordinal` (once per device; later calls for it are ignored).
#[cfg_attr(not(hal_cuda), allow(dead_code))]
pub(crate) fn add_drain(ordinal: usize, drain: impl Fn() + Send + Sync + 'static) {
    let mut st = state();
    if st.drains.iter().any(|(o, _)| *o == ordinal) {
        return;
    }
    st.drains.push((ordinal, std::sync::Arc::new(drain)));
}

/// How long one device drain may take.
#[cfg_attr(not(hal_cuda), allow(dead_code))]
pub(crate) fn drain_limit() -> Duration {
    DRAIN_LIMIT
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the word is process-wide, and tests of this binary run in parallel.
    #[test]
    fn a_hold_raises_the_word_names_the_peer_and_lowers_it_when_dropped() {
        assert!(!abort_raised());
        let e0 = epoch();
        check_since("sync", e0).unwrap();
        let a = raise(Some(3), "rank 3 died");
        let b = raise(None, "an abort");
        assert!(abort_raised());
        assert!(poll_abort(0) && poll_abort(POLL_SPINS) && !poll_abort(1));
        let r = raised().unwrap();
        assert_eq!((r.peer, r.why.as_str()), (Some(3), "rank 3 died"));
        match check_since("cuStreamSynchronize", e0).unwrap_err() {
            Error::Aborted { op, peer, why } => {
                assert_eq!((op, peer), ("cuStreamSynchronize", Some(3)));
                assert!(why.contains("rank 3"), "{why}");
            }
            e => panic!("expected Aborted, got {e}"),
        }
        drop(a);
        assert!(abort_raised(), "one hold is left");
        drop(b);
        assert!(wait_lowered(Duration::from_secs(5)));
        assert!(raised().is_none());
        // Work that waited across the raise is still reported; later work is not.
        let e = check_since("sync", e0).unwrap_err();
        assert!(e.to_string().contains("an abort"), "{e}");
        check_since("sync", epoch()).unwrap();
    }
}
