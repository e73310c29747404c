//! FIFO push on the host backend (`fifo_device.hpp`'s `push`/`sync`).
//!
//! push: `fetch_add(head, 1)` (relaxed) hands out a position; if the cached tail says the slot
//! may still be in use, spin-acquire on the host tail until `pos - tail < size` and raise the
//! cache; then publish: `fst` relaxed, then `snd` with the lap-parity commit bit, `Release`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backoff::spin_until_device as spin_until;
use crate::error::Result;
use crate::fifo::{parity_bit, FifoDeviceHandle, ProxyTrigger, TRIGGER_COMMIT_BIT};

impl FifoDeviceHandle {
    /// # Safety
    /// `p` is one of this handle's live, aligned u64 words.
    unsafe fn word<'a>(p: *mut u64) -> &'a AtomicU64 {
        // SAFETY: forwarded from the caller.
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// Pushes `trigger` (its commit bit is replaced) and returns its position. Any thread may
    /// call it concurrently; waits at most `timeout` for space.
    ///
    /// # Safety
    /// The handle comes from a live [`crate::fifo::Fifo`] whose memory this process can touch
    /// (host backend).
    pub unsafe fn push(&self, trigger: ProxyTrigger, timeout: Duration) -> Result<u64> {
        let size = u64::from(self.size);
        // SAFETY: the caller's contract: head, tail and tail_cache are live words of the FIFO.
        let (head, tail, cache) = unsafe {
            (
                Self::word(self.head),
                Self::word(self.tail),
                Self::word(self.tail_cache),
            )
        };
        let pos = head.fetch_add(1, Ordering::Relaxed);
        if pos.wrapping_sub(cache.load(Ordering::Relaxed)) >= size {
            let mut seen = 0;
            spin_until("FIFO space (host tail)", timeout, || {
                seen = tail.load(Ordering::Acquire);
                pos.wrapping_sub(seen) < size
            })?;
            cache.fetch_max(seen, Ordering::Relaxed);
        }
        // SAFETY: the slot index is < size and the trigger array holds `size` aligned slots.
        let slot = unsafe { self.triggers.add((pos & (size - 1)) as usize).cast::<u64>() };
        let snd = (trigger.snd & !TRIGGER_COMMIT_BIT) | parity_bit(pos, self.size);
        // SAFETY: slot words are live and aligned; only this pusher owns the slot until the host
        // pops it.
        unsafe {
            Self::word(slot).store(trigger.fst, Ordering::Relaxed);
            Self::word(slot.add(1)).store(snd, Ordering::Release);
        }
        Ok(pos)
    }

    /// Triggers the host failed to carry out so far (the word after the tail; see
    /// [`crate::fifo`]).
    ///
    /// # Safety
    /// As [`FifoDeviceHandle::push`].
    pub unsafe fn failed_triggers(&self) -> u64 {
        // SAFETY: the caller's contract; the tail allocation holds two words.
        unsafe { Self::word(self.tail.add(1)) }.load(Ordering::Acquire)
    }

    /// Waits (at most `timeout`) until the host has handled position `pos` (`tail > pos`).
    ///
    /// # Safety
    /// As [`FifoDeviceHandle::push`].
    pub unsafe fn sync(&self, pos: u64, timeout: Duration) -> Result<()> {
        // SAFETY: the caller's contract.
        let (tail, cache) = unsafe { (Self::word(self.tail), Self::word(self.tail_cache)) };
        let mut seen = 0;
        spin_until("FIFO sync (host tail)", timeout, || {
            seen = tail.load(Ordering::Acquire);
            seen > pos
        })?;
        cache.fetch_max(seen, Ordering::Relaxed);
        Ok(())
    }
}
