//! The shared state of an emulated multicast object: one memfd that every member process maps,
//! holding a header and a table of bindings (which process bound which memfd range at which
//! multicast offset for which device).
//!
//! Layout (all fields 8-byte atomics, little endian, zero-initialised by the memfd):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `MSCLMCST` |
//! | 8 | size of the object |
//! | 16 | device count |
//! | 24 | minimum granularity |
//! | 32 | devices added so far |
//! | 40 | generation: bumped after every bind and unbind |
//! | 64 + 64 i | binding slot i: seq, state, device, pid, host id, fd id, memory offset, multicast offset |
//! | ... | and the binding's size in the slot's last word (see [`Slot`]) |
//!
//! Slots are written under a sequence lock: a writer makes `seq` odd, writes, makes it even;
//! a reader retries until it reads the same even `seq` before and after. Writers of one slot
//! are serialised by its state (claimed with a compare-exchange from free).

use crate::auxil::os::Mapping;
use crate::auxil::Backoff;
use crate::multicast::{Kind, Live};
use crate::{Error, MulticastInfo, Result};
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One handle's view of an emulated multicast object: its mapping of the control memfd (the
/// [`Table`]) and what this handle did with it.
#[derive(Debug)]
pub(super) struct McObject {
    pub(super) map: Mapping,
    /// The control memfd: kept by the creator until it exports (imports close theirs at once).
    pub(super) fd: Mutex<Option<OwnedFd>>,
    pub(super) info: MulticastInfo,
    /// The device index this handle added (`multicast_add_device`), if any.
    pub(super) device: Mutex<Option<u32>>,
    /// Serialises this handle's binds (the overlap check and the insert).
    pub(super) bind_lock: Mutex<()>,
    pub(super) _live: Live,
}

impl McObject {
    /// A new handle on the control memfd `fd` (of TABLE_BYTES): maps it, and keeps `fd` open
    /// when `keep_fd` (the creator, until it exports) or closes it (an import).
    pub(super) fn map(fd: OwnedFd, keep_fd: bool, info: MulticastInfo) -> Result<Self> {
        let map = Mapping::shared(&fd, TABLE_BYTES)?;
        Ok(McObject {
            map,
            fd: Mutex::new(keep_fd.then_some(fd)),
            info,
            device: Mutex::new(None),
            bind_lock: Mutex::new(()),
            _live: Live::new(Kind::Handle),
        })
    }

    /// The binding table in the mapping.
    pub(super) fn table(&self) -> Table {
        // SAFETY: `map` is a live mapping of TABLE_BYTES (checked at create/import) that lives
        // as long as `self`, and every view is used only while `self` is borrowed.
        unsafe { Table::new(self.map.ptr()) }
    }
}

/// `MSCLMCST` as a little-endian u64.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"MSCLMCST");
/// Binding slots of one object (many buffers over up to a few dozen devices).
pub(super) const SLOTS: usize = 1024;
const HEADER_BYTES: usize = 64;
const SLOT_BYTES: usize = 64;
/// Bytes of the shared control memfd.
pub(super) const TABLE_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;

const FREE: u64 = 0;
const CLAIMED: u64 = 1;
const BOUND: u64 = 2;

/// How long a reader waits for a slot stuck mid-update (its writer died while writing).
const STUCK: Duration = Duration::from_secs(5);

#[repr(C)]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    pub(super) size: AtomicU64,
    pub(super) ndevices: AtomicU64,
    pub(super) granularity: AtomicU64,
    pub(super) added: AtomicU64,
    pub(super) generation: AtomicU64,
    _pad: [AtomicU64; 2],
}

/// One binding slot. The device id shares word 2 with the pid (`device << 32 | pid`) and the
/// size takes the last word, so a slot is 8 words.
#[repr(C)]
struct Slot {
    seq: AtomicU64,
    state: AtomicU64,
    device_pid: AtomicU64,
    host_id: AtomicU64,
    fd_id: AtomicU64,
    mem_offset: AtomicU64,
    mc_offset: AtomicU64,
    size: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);

/// A binding as recorded in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Binding {
    /// The device (the order of `multicast_add_device`) the memory belongs to.
    pub(super) device: u32,
    /// The process that bound it (its fd server serves the memfd).
    pub(super) pid: u32,
    pub(super) host_id: u64,
    /// The memfd's id at that process's fd server.
    pub(super) fd_id: u64,
    /// Where the bound range starts in the memfd.
    pub(super) mem_offset: u64,
    /// Where it sits in the multicast object.
    pub(super) mc_offset: u64,
    pub(super) size: u64,
}

impl Binding {
    /// Whether `[offset, offset + len)` of the object lies inside this binding.
    pub(super) fn covers(&self, offset: u64, len: u64) -> bool {
        offset >= self.mc_offset
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= self.mc_offset + self.size)
    }
    /// Whether this binding and `[offset, offset + len)` share a byte.
    pub(super) fn overlaps(&self, offset: u64, len: u64) -> bool {
        offset < self.mc_offset + self.size && self.mc_offset < offset.saturating_add(len)
    }
}

/// A view of the control block of one object, mapped at `base` (which the caller keeps mapped
/// for as long as the view is used).
#[derive(Clone, Copy, Debug)]
pub(super) struct Table {
    base: *mut u8,
}

// Thread-safe: the view is a pointer to shared memory accessed only through atomics.
thread_safe!(Table);

impl Table {
    /// A view of the control block at `base`.
    ///
    /// # Safety
    /// `base` is the start of a live, page-aligned mapping of at least [`TABLE_BYTES`] bytes
    /// that outlives every use of the view.
    pub(super) unsafe fn new(base: *mut u8) -> Table {
        Table { base }
    }

    pub(super) fn header(&self) -> &Header {
        // SAFETY: `new`'s contract: the mapping holds the header at offset 0, aligned; every
        // field is an atomic, valid for any bit pattern.
        unsafe { &*self.base.cast::<Header>() }
    }

    fn slot(&self, i: usize) -> &Slot {
        debug_assert!(i < SLOTS);
        // SAFETY: slot i lies inside the mapping (`i < SLOTS`), 8-byte aligned; atomics only.
        unsafe { &*self.base.add(HEADER_BYTES + i * SLOT_BYTES).cast::<Slot>() }
    }

    /// Reads slot `i`: `Some` when it holds a binding. Retries while a writer is mid-update;
    /// an error after [`STUCK`] (the writer died holding the slot).
    pub(super) fn read(&self, i: usize) -> Result<Option<Binding>> {
        let s = self.slot(i);
        let start = Instant::now();
        let mut backoff = Backoff::polling();
        loop {
            let before = s.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let state = s.state.load(Ordering::Relaxed);
                let dp = s.device_pid.load(Ordering::Relaxed);
                let b = Binding {
                    device: (dp >> 32) as u32,
                    pid: dp as u32,
                    host_id: s.host_id.load(Ordering::Relaxed),
                    fd_id: s.fd_id.load(Ordering::Relaxed),
                    mem_offset: s.mem_offset.load(Ordering::Relaxed),
                    mc_offset: s.mc_offset.load(Ordering::Relaxed),
                    size: s.size.load(Ordering::Relaxed),
                };
                fence(Ordering::Acquire);
                if s.seq.load(Ordering::Relaxed) == before {
                    return Ok((state == BOUND).then_some(b));
                }
            }
            if start.elapsed() > STUCK {
                return Err(Error::Timeout {
                    op: "read a multicast binding slot (its writer stopped mid-update)",
                    waited: STUCK,
                });
            }
            backoff.snooze();
        }
    }

    /// Every binding in the table.
    pub(super) fn bindings(&self) -> Result<Vec<(usize, Binding)>> {
        let mut out = Vec::new();
        for i in 0..SLOTS {
            if self.slot(i).state.load(Ordering::Acquire) == FREE {
                continue;
            }
            if let Some(b) = self.read(i)? {
                out.push((i, b));
            }
        }
        Ok(out)
    }

    /// Records `b` in a free slot; returns the slot index.
    pub(super) fn insert(&self, b: &Binding) -> Result<usize> {
        for i in 0..SLOTS {
            let s = self.slot(i);
            if s.state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            s.seq.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::Release);
            s.device_pid.store(
                u64::from(b.device) << 32 | u64::from(b.pid),
                Ordering::Relaxed,
            );
            s.host_id.store(b.host_id, Ordering::Relaxed);
            s.fd_id.store(b.fd_id, Ordering::Relaxed);
            s.mem_offset.store(b.mem_offset, Ordering::Relaxed);
            s.mc_offset.store(b.mc_offset, Ordering::Relaxed);
            s.size.store(b.size, Ordering::Relaxed);
            s.state.store(BOUND, Ordering::Relaxed);
            s.seq.fetch_add(1, Ordering::Release);
            self.header().generation.fetch_add(1, Ordering::AcqRel);
            return Ok(i);
        }
        Err(Error::invalid(
            "multicast_bind(host)",
            format!("a free binding slot (an object holds at most {SLOTS} bindings)"),
            "all slots in use",
        ))
    }

    /// Clears slot `i` (a binding this process inserted).
    pub(super) fn remove(&self, i: usize) {
        let s = self.slot(i);
        s.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        s.state.store(CLAIMED, Ordering::Relaxed);
        for w in [
            &s.device_pid,
            &s.host_id,
            &s.fd_id,
            &s.mem_offset,
            &s.mc_offset,
            &s.size,
        ] {
            w.store(0, Ordering::Relaxed);
        }
        s.seq.fetch_add(1, Ordering::Release);
        s.state.store(FREE, Ordering::Release);
        self.header().generation.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auxil::os::{memfd, Mapping};

    #[test]
    fn insert_read_remove() {
        let fd = memfd(c"table-test", TABLE_BYTES).expect("memfd");
        let map = Mapping::shared(&fd, TABLE_BYTES).expect("map");
        // SAFETY: the mapping is TABLE_BYTES long and outlives the view.
        let t = unsafe { Table::new(map.ptr()) };
        assert!(t.bindings().expect("read").is_empty());
        let b = Binding {
            device: 3,
            pid: 77,
            host_id: 9,
            fd_id: 5,
            mem_offset: 4096,
            mc_offset: 8192,
            size: 4096,
        };
        let g0 = t.header().generation.load(Ordering::SeqCst);
        let i = t.insert(&b).expect("slot");
        let j = t.insert(&Binding { device: 1, ..b }).expect("slot");
        assert_ne!(i, j);
        assert_eq!(t.read(i).expect("read"), Some(b));
        assert_eq!(t.bindings().expect("read").len(), 2);
        t.remove(i);
        assert_eq!(t.read(i).expect("read"), None);
        assert_eq!(
            t.bindings().expect("read"),
            vec![(j, Binding { device: 1, ..b })]
        );
        assert_eq!(t.header().generation.load(Ordering::SeqCst), g0 + 3);
        assert!(b.covers(8192, 4096) && !b.covers(8192, 4097) && !b.covers(4096, 10));
        assert!(b.overlaps(12287, 1) && !b.overlaps(12288, 1) && !b.overlaps(0, 8192));
    }
}
