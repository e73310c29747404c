//! The proxy FIFO: GPU (or CPU "device") threads push 16-byte [`ProxyTrigger`]s, the host proxy
//! polls and pops them.
//!
//! Memory (as `kernels/cuda/include/mscclpp/fifo_device.hpp` describes):
//! - `triggers`: `size` slots of 16 bytes in host-mapped memory (the device writes, the host
//!   reads); on the host backend a memfd mapping.
//! - `head` and `tail_cache`: device memory (one 16-byte allocation, head @0, tail cache @8).
//! - `tail`: host-mapped memory; the host release-stores `tail + 1` after it handled a trigger,
//!   and the device's `sync(pos)` waits for `tail > pos`: that is the flush-done position.
//! - `tail[1]` (the word after the tail, same allocation): the number of triggers the host
//!   failed to carry out, incremented before the failed trigger is popped. A device that saw
//!   `tail > pos` and reads a count above the one it read before pushing knows that some
//!   request up to `pos` failed (`failedTriggers()` in the C header,
//!   [`FifoDeviceHandle::failed_triggers`] on the host backend).
//!
//! A trigger's commit bit (bit 63 of `snd`) is the lap parity of its position: 1 on lap 0, 0 on
//! lap 1, ..., so slots never need clearing: the host accepts a slot only when its commit bit
//! equals the parity of the position it expects next.

use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_hal::{prelude::*, Buffer, Gpu, MemoryKind};

use crate::error::{Error, Result};
use crate::memory::hal_err as hal_error;

/// Trigger type bits (combinable): copy data.
pub const TRIGGER_DATA: u64 = 0x1;
/// Trigger type bits: signal the semaphore.
pub const TRIGGER_FLAG: u64 = 0x2;
/// Trigger type bits: flush the connection, then pop (the device may wait on it).
pub const TRIGGER_SYNC: u64 = 0x4;

const BITS_SIZE: u32 = 32;
const BITS_OFFSET: u32 = 32;
const BITS_MEMORY_ID: u32 = 9;
const BITS_TYPE: u32 = 3;
const BITS_SEMAPHORE_ID: u32 = 10;
const SHIFT_SRC_OFFSET: u32 = 32;
const SHIFT_SRC_MEMORY_ID: u32 = 32;
const SHIFT_DST_MEMORY_ID: u32 = 41;
const SHIFT_TYPE: u32 = 50;
const SHIFT_SEMAPHORE_ID: u32 = 53;
const SHIFT_COMMIT: u32 = 63;

/// Bit 63 of `snd`: the lap parity of the trigger's position.
pub const TRIGGER_COMMIT_BIT: u64 = 1 << SHIFT_COMMIT;
/// The largest memory id a trigger can carry.
pub const MAX_MEMORY_ID: u32 = (1 << BITS_MEMORY_ID) - 1;
/// The largest semaphore id a trigger can carry.
pub const MAX_SEMAPHORE_ID: u32 = (1 << BITS_SEMAPHORE_ID) - 1;
/// The largest size/offset a trigger can carry.
pub const MAX_TRIGGER_SIZE: u64 = (1 << BITS_SIZE) - 1;

const fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

/// One FIFO slot, `struct ProxyTrigger` of the C header (size 16, align 16).
///
/// `fst` = size[0,32) | src offset[32,64); `snd` = dst offset[0,32) | src memory id[32,41) |
/// dst memory id[41,50) | type[50,53) | semaphore id[53,63) | commit\[63\].
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyTrigger {
    /// Word 0.
    pub fst: u64,
    /// Word 1 (holds the commit bit).
    pub snd: u64,
}

impl ProxyTrigger {
    /// Packs a trigger (commit bit clear; push sets it), checking every field against its width.
    pub fn new(
        trigger_type: u64,
        dst_memory_id: u32,
        dst_offset: u64,
        src_memory_id: u32,
        src_offset: u64,
        size: u64,
        semaphore_id: u32,
    ) -> Result<Self> {
        let check = |what: &str, v: u64, max: u64| -> Result<()> {
            if v > max {
                return Err(Error::invalid(format!(
                    "proxy trigger {what}: expected at most {max}, got {v}"
                )));
            }
            Ok(())
        };
        check("type", trigger_type, mask(BITS_TYPE))?;
        check("dst memory id", dst_memory_id.into(), MAX_MEMORY_ID.into())?;
        check("src memory id", src_memory_id.into(), MAX_MEMORY_ID.into())?;
        check("dst offset", dst_offset, mask(BITS_OFFSET))?;
        check("src offset", src_offset, mask(BITS_OFFSET))?;
        check("size", size, mask(BITS_SIZE))?;
        check("semaphore id", semaphore_id.into(), MAX_SEMAPHORE_ID.into())?;
        Ok(Self::pack(
            trigger_type,
            dst_memory_id,
            dst_offset,
            src_memory_id,
            src_offset,
            size,
            semaphore_id,
        ))
    }

    /// Packs a trigger like the C header's `makeProxyTrigger`: fields wider than their bit
    /// ranges are truncated.
    pub const fn pack(
        trigger_type: u64,
        dst_memory_id: u32,
        dst_offset: u64,
        src_memory_id: u32,
        src_offset: u64,
        size: u64,
        semaphore_id: u32,
    ) -> Self {
        let fst = (size & mask(BITS_SIZE)) | ((src_offset & mask(BITS_OFFSET)) << SHIFT_SRC_OFFSET);
        let snd = (dst_offset & mask(BITS_OFFSET))
            | (((src_memory_id & MAX_MEMORY_ID) as u64) << SHIFT_SRC_MEMORY_ID)
            | (((dst_memory_id & MAX_MEMORY_ID) as u64) << SHIFT_DST_MEMORY_ID)
            | ((trigger_type & mask(BITS_TYPE)) << SHIFT_TYPE)
            | (((semaphore_id & MAX_SEMAPHORE_ID) as u64) << SHIFT_SEMAPHORE_ID);
        ProxyTrigger { fst, snd }
    }

    /// Bytes to copy.
    pub fn size(&self) -> u64 {
        self.fst & mask(BITS_SIZE)
    }
    /// Offset into the source memory.
    pub fn src_offset(&self) -> u64 {
        self.fst >> SHIFT_SRC_OFFSET
    }
    /// Offset into the destination memory.
    pub fn dst_offset(&self) -> u64 {
        self.snd & mask(BITS_OFFSET)
    }
    /// Source memory id (of the proxy service).
    pub fn src_memory_id(&self) -> u32 {
        ((self.snd >> SHIFT_SRC_MEMORY_ID) & mask(BITS_MEMORY_ID)) as u32
    }
    /// Destination memory id.
    pub fn dst_memory_id(&self) -> u32 {
        ((self.snd >> SHIFT_DST_MEMORY_ID) & mask(BITS_MEMORY_ID)) as u32
    }
    /// Type bits ([`TRIGGER_DATA`] | [`TRIGGER_FLAG`] | [`TRIGGER_SYNC`]).
    pub fn trigger_type(&self) -> u64 {
        (self.snd >> SHIFT_TYPE) & mask(BITS_TYPE)
    }
    /// Semaphore id (of the proxy service).
    pub fn semaphore_id(&self) -> u32 {
        ((self.snd >> SHIFT_SEMAPHORE_ID) & mask(BITS_SEMAPHORE_ID)) as u32
    }
    /// The commit (lap parity) bit.
    pub fn commit(&self) -> bool {
        self.snd & TRIGGER_COMMIT_BIT != 0
    }
}

/// The commit bit a trigger at FIFO position `pos` carries (`size` a power of two).
pub const fn parity_bit(pos: u64, size: u32) -> u64 {
    if pos & (size as u64) == 0 {
        TRIGGER_COMMIT_BIT
    } else {
        0
    }
}

/// `struct FifoDeviceHandle` of the C header (size 40, align 8).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FifoDeviceHandle {
    /// `size` slots in host-mapped memory.
    pub triggers: *mut ProxyTrigger,
    /// Device memory: positions handed out.
    pub head: *mut u64,
    /// Host-mapped: triggers the host has handled.
    pub tail: *mut u64,
    /// Device memory: a recent value of `tail`.
    pub tail_cache: *mut u64,
    /// Number of slots (a power of two).
    pub size: u32,
    /// Padding to 8 bytes.
    pub pad: u32,
}

device_handle_thread_safe!(FifoDeviceHandle);

/// The host half of the FIFO: owns its memory, polls and pops triggers.
#[derive(Debug)]
pub struct Fifo {
    triggers: Box<dyn BufferDebug>,
    device_words: Box<dyn BufferDebug>,
    tail: Box<dyn BufferDebug>,
    triggers_host: *mut ProxyTrigger,
    tail_host: *mut u64,
    /// `tail_host + 1`: the failed-trigger count.
    failed_host: *mut u64,
    size: u32,
    /// The host's tail (only the polling thread moves it).
    host_tail: AtomicU64,
    numa_node: i32,
}

/// A [`Buffer`] that is also `Debug` (for `Box<dyn ..>`).
pub(crate) trait BufferDebug: Buffer + std::fmt::Debug {}
impl<T: Buffer + std::fmt::Debug> BufferDebug for T {}

// SAFETY: the raw pointers point into buffers the Fifo owns; the host side touches them only
// through atomics, and poll/pop are documented as single-consumer.
unsafe impl Send for Fifo {}
// SAFETY: as above.
unsafe impl Sync for Fifo {}

/// Default number of FIFO slots (upstream's `DEFAULT_FIFO_SIZE`).
pub const DEFAULT_FIFO_SIZE: u32 = 512;

impl Fifo {
    /// A FIFO of `size` slots on the GPU this process uses (the last one it allocated on or
    /// made an endpoint for; 0 if none) of the build's GPU backend.
    pub fn new(size: u32) -> Result<Self> {
        let dev = crate::memory::gpu_device(crate::memory::default_gpu())?;
        Self::new_on::<Gpu>(&dev, size)
    }

    /// A FIFO whose "device" is the CPU (host backend memory everywhere): for CPU ranks.
    pub fn new_host(size: u32) -> Result<Self> {
        use mscclpp_hal::api::Host;
        let dev =
            Host::open_device(0).map_err(|e| hal_error("Fifo::new_host: open host device", e))?;
        Self::new_on::<Host>(&dev, size)
    }

    /// A FIFO of `size` slots (a power of two, at least 2) with its memory on `dev` of backend `A`.
    pub fn new_on<A: Api>(dev: &A::Device, size: u32) -> Result<Self> {
        if size < 2 || !size.is_power_of_two() || size > (1 << 30) {
            return Err(Error::invalid(format!(
                "Fifo::new: expected a power of two in [2, 2^30] slots, got {size}"
            )));
        }
        let trig_bytes = size as usize * std::mem::size_of::<ProxyTrigger>();
        let alloc = |what: &str, len: usize, kind: MemoryKind| -> Result<A::Memory> {
            let m = A::alloc(dev, len, kind).map_err(|e| {
                hal_error(
                    &format!("Fifo::new: allocate {what} ({len} bytes, {kind:?})"),
                    e,
                )
            })?;
            A::memset(dev, &m, 0, 0, len)
                .map_err(|e| hal_error(&format!("Fifo::new: zero {what}"), e))?;
            Ok(m)
        };
        let triggers = alloc("triggers", trig_bytes, MemoryKind::HostMapped)?;
        let device_words = alloc("head and tail cache", 16, MemoryKind::Device)?;
        // The tail and, after it, the failed-trigger count.
        let tail = alloc("tail", 16, MemoryKind::HostMapped)?;
        let triggers_host = triggers
            .host_ptr()
            .ok_or_else(|| {
                Error::Internal("Fifo::new: host-mapped trigger memory has no host address".into())
            })?
            .cast::<ProxyTrigger>();
        let tail_host = tail
            .host_ptr()
            .ok_or_else(|| {
                Error::Internal("Fifo::new: host-mapped tail has no host address".into())
            })?
            .cast::<u64>();
        if !(triggers_host as usize).is_multiple_of(16) || !(tail_host as usize).is_multiple_of(8) {
            return Err(Error::Internal(format!(
                "Fifo::new: misaligned host mappings {triggers_host:p} / {tail_host:p}"
            )));
        }
        Ok(Fifo {
            triggers: Box::new(triggers),
            device_words: Box::new(device_words),
            tail: Box::new(tail),
            triggers_host,
            tail_host,
            // SAFETY: the tail allocation holds two u64 words.
            failed_host: unsafe { tail_host.add(1) },
            size,
            host_tail: AtomicU64::new(0),
            numa_node: A::properties(dev).map(|p| p.numa_node).unwrap_or(-1),
        })
    }

    /// NUMA node of the FIFO's device; -1 when unknown.
    pub fn numa_node(&self) -> i32 {
        self.numa_node
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The position the host expects next (= triggers popped so far).
    pub fn tail(&self) -> u64 {
        self.host_tail.load(Ordering::Relaxed)
    }

    fn slot(&self, pos: u64) -> &[AtomicU64; 2] {
        let idx = (pos & (self.size as u64 - 1)) as usize;
        // SAFETY: idx < size, the trigger memory holds `size` 16-byte aligned slots and lives as
        // long as self; AtomicU64 has the layout of u64.
        unsafe { &*(self.triggers_host.add(idx).cast::<[AtomicU64; 2]>()) }
    }

    /// The next trigger if one was published, without removing it. Single consumer: only one
    /// thread may call `poll`/`pop`.
    pub fn poll(&self) -> Option<ProxyTrigger> {
        let pos = self.host_tail.load(Ordering::Relaxed);
        let slot = self.slot(pos);
        let snd = slot[1].load(Ordering::Acquire);
        if (snd & TRIGGER_COMMIT_BIT) != parity_bit(pos, self.size) {
            return None;
        }
        let fst = slot[0].load(Ordering::Relaxed);
        Some(ProxyTrigger { fst, snd })
    }

    /// Removes the trigger `poll` returned: release-stores tail + 1, which frees the slot for
    /// pushers and completes the device's `sync` on that position.
    pub fn pop(&self) {
        let next = self.host_tail.load(Ordering::Relaxed) + 1;
        self.host_tail.store(next, Ordering::Relaxed);
        // SAFETY: tail_host points at 8 aligned bytes owned by self.tail.
        let tail = unsafe { AtomicU64::from_ptr(self.tail_host) };
        tail.store(next, Ordering::Release);
    }

    /// Counts one trigger the host failed to carry out; call before popping it, so a device
    /// that sees the pop also sees the count.
    pub fn record_failure(&self) {
        // SAFETY: failed_host points at 8 aligned bytes owned by self.tail.
        unsafe { AtomicU64::from_ptr(self.failed_host) }.fetch_add(1, Ordering::Release);
    }

    /// Triggers the host failed to carry out so far (never reset).
    pub fn failed(&self) -> u64 {
        // SAFETY: as in record_failure.
        unsafe { AtomicU64::from_ptr(self.failed_host) }.load(Ordering::Acquire)
    }

    /// The `#[repr(C)]` handle device code pushes through. Valid while `self` lives.
    pub fn device_handle(&self) -> FifoDeviceHandle {
        let words = self.device_words.device_ptr();
        FifoDeviceHandle {
            triggers: self.triggers.device_ptr() as usize as *mut ProxyTrigger,
            head: words as usize as *mut u64,
            tail: self.tail.device_ptr() as usize as *mut u64,
            tail_cache: (words + 8) as usize as *mut u64,
            size: self.size,
            pad: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_field_boundaries() {
        let max = ProxyTrigger::new(
            7,
            MAX_MEMORY_ID,
            MAX_TRIGGER_SIZE,
            MAX_MEMORY_ID,
            MAX_TRIGGER_SIZE,
            MAX_TRIGGER_SIZE,
            MAX_SEMAPHORE_ID,
        )
        .expect("max fields fit");
        assert_eq!(max.fst, u64::MAX);
        assert_eq!(max.snd, !TRIGGER_COMMIT_BIT);
        // Each field alone lands in exactly its bit range.
        let cases: [(ProxyTrigger, u64, u64); 7] = [
            (
                ProxyTrigger::new(0, 0, 0, 0, 0, MAX_TRIGGER_SIZE, 0).unwrap_or_default(),
                0xffff_ffff,
                0,
            ),
            (
                ProxyTrigger::new(0, 0, 0, 0, MAX_TRIGGER_SIZE, 0, 0).unwrap_or_default(),
                0xffff_ffff_0000_0000,
                0,
            ),
            (
                ProxyTrigger::new(0, 0, MAX_TRIGGER_SIZE, 0, 0, 0, 0).unwrap_or_default(),
                0,
                0xffff_ffff,
            ),
            (
                ProxyTrigger::new(0, 0, 0, MAX_MEMORY_ID, 0, 0, 0).unwrap_or_default(),
                0,
                0x1ff << 32,
            ),
            (
                ProxyTrigger::new(0, MAX_MEMORY_ID, 0, 0, 0, 0, 0).unwrap_or_default(),
                0,
                0x1ff << 41,
            ),
            (
                ProxyTrigger::new(7, 0, 0, 0, 0, 0, 0).unwrap_or_default(),
                0,
                0x7 << 50,
            ),
            (
                ProxyTrigger::new(0, 0, 0, 0, 0, 0, MAX_SEMAPHORE_ID).unwrap_or_default(),
                0,
                0x3ff << 53,
            ),
        ];
        for (i, (t, fst, snd)) in cases.iter().enumerate() {
            assert_eq!((t.fst, t.snd), (*fst, *snd), "case {i}");
        }
        let t = ProxyTrigger::new(
            TRIGGER_DATA | TRIGGER_SYNC,
            300,
            0x1234_5678,
            511,
            0x9abc_def0,
            4096,
            1000,
        )
        .expect("fits");
        assert_eq!(t.trigger_type(), TRIGGER_DATA | TRIGGER_SYNC);
        assert_eq!(t.dst_memory_id(), 300);
        assert_eq!(t.dst_offset(), 0x1234_5678);
        assert_eq!(t.src_memory_id(), 511);
        assert_eq!(t.src_offset(), 0x9abc_def0);
        assert_eq!(t.size(), 4096);
        assert_eq!(t.semaphore_id(), 1000);
        assert!(!t.commit());
    }

    #[test]
    fn trigger_rejects_overflow() {
        assert!(ProxyTrigger::new(8, 0, 0, 0, 0, 0, 0).is_err());
        assert!(ProxyTrigger::new(1, MAX_MEMORY_ID + 1, 0, 0, 0, 0, 0).is_err());
        assert!(ProxyTrigger::new(1, 0, 0, MAX_MEMORY_ID + 1, 0, 0, 0).is_err());
        assert!(ProxyTrigger::new(1, 0, 1 << 32, 0, 0, 0, 0).is_err());
        assert!(ProxyTrigger::new(1, 0, 0, 0, 1 << 32, 0, 0).is_err());
        assert!(ProxyTrigger::new(1, 0, 0, 0, 0, 1 << 32, 0).is_err());
        assert!(ProxyTrigger::new(1, 0, 0, 0, 0, 0, MAX_SEMAPHORE_ID + 1).is_err());
        // pack truncates like the C helper.
        let t = ProxyTrigger::pack(1, MAX_MEMORY_ID + 2, 0, 0, 0, (1 << 32) | 5, 0);
        assert_eq!(t.dst_memory_id(), 1);
        assert_eq!(t.size(), 5);
    }

    #[test]
    fn parity() {
        assert_eq!(parity_bit(0, 4), TRIGGER_COMMIT_BIT);
        assert_eq!(parity_bit(3, 4), TRIGGER_COMMIT_BIT);
        assert_eq!(parity_bit(4, 4), 0);
        assert_eq!(parity_bit(7, 4), 0);
        assert_eq!(parity_bit(8, 4), TRIGGER_COMMIT_BIT);
    }

    #[test]
    fn rejects_bad_sizes() {
        for s in [0, 1, 3, 6, 100] {
            assert!(Fifo::new_host(s).is_err(), "size {s}");
        }
    }
}
