//! The cache of registered user buffers for zero-copy algorithms, keyed by `(ptr, size)`; a hit
//! also needs the registered memory to still be there (its identity, not its address: memory
//! freed and allocated again at the same address is registered again).
//!
//! A miss outside graph capture is collective: every rank registers its buffer for CudaIpc
//! (memory of this library, or the application's own allocation when the backend can export
//! it: `cudaMalloc`, cuMem/VMM with a shareable handle type, a host memfd mapping), then one
//! bootstrap all-gather exchanges the results. If any rank could not register, every rank
//! caches a negative entry and the caller falls back to a copying algorithm, so all ranks take
//! the same path; so does a second exchange of whether every rank could map every peer's
//! buffer. A miss under graph capture returns `None` without any traffic. Ranks must
//! therefore meet the same buffers in the same order, and free, allocate again and
//! [`UserBufferCache::forget`] them alike (as with upstream MSCCL++ and NCCL's windows): a
//! rank that alone meets a miss waits in the exchange until the bootstrap's timeout, an error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::communicator::Communicator;
use crate::error::{Error, Result};
use crate::memory::LocalMemory;
use crate::registered_memory::RegisteredMemory;
use crate::transport::{Device, Transport};

/// One registered user buffer and its peers' mappings.
pub struct UserBuffer {
    /// The local registration (keeps the allocation alive).
    pub local: RegisteredMemory,
    /// The peers' buffers mapped here (`None` at this rank).
    pub peers: Vec<Option<RegisteredMemory>>,
    /// `u64[nranks]`: every rank's buffer as mapped here (own address at this rank).
    pub bases: Vec<u64>,
    /// Device copy of `bases` for kernels.
    pub table: LocalMemory,
}

/// Cached registrations by `(ptr, size)`: `None` = not registrable by every rank. Ordered, so
/// the registrations starting at one address are neighbours (see [`UserBufferCache::lookup`]).
type Entries = BTreeMap<(u64, usize), Option<Arc<UserBuffer>>>;

/// The cache (see the module doc).
#[derive(Default)]
pub struct UserBufferCache {
    entries: Mutex<Entries>,
}

impl UserBufferCache {
    /// A live registration of at least `size` bytes starting at `ptr` other than `(ptr, size)`
    /// itself: the call's buffer is the start of a larger buffer seen before (nccl-tests `-R`
    /// registers its largest size and warms up with it outside capture, then captures every
    /// smaller size at the same address; an exact-size lookup missed there and every size but
    /// the largest fell back to a copying algorithm). The smallest such registration.
    pub fn lookup(&self, ptr: u64, size: usize) -> Option<Arc<UserBuffer>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        Self::larger(&entries, ptr, size)
    }

    /// What [`UserBufferCache::get_or_register`] would answer without registering or talking
    /// to the peers: `Some(entry)` for a cached `(ptr, size)` whose memory is still there
    /// (positive or negative) or a live larger registration at `ptr`; `None` when only a
    /// registration could tell. A launch asks this first and queries graph capture (a driver
    /// call) only when it returns `None`.
    pub fn cached(&self, ptr: u64, size: usize) -> Option<Option<Arc<UserBuffer>>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(&(ptr, size)) {
            Some(Some(ub)) if !ub.local.is_current() => None,
            Some(e) => Some(e.clone()),
            None => Self::larger(&entries, ptr, size).map(Some),
        }
    }

    fn larger(entries: &Entries, ptr: u64, size: usize) -> Option<Arc<UserBuffer>> {
        let from = size.checked_add(1)?;
        entries
            .range((ptr, from)..=(ptr, usize::MAX))
            .find_map(|(_, e)| e.as_ref().filter(|ub| ub.local.is_current()).cloned())
    }

    /// The registered buffer `(ptr, size)` (or a live larger one starting at `ptr`,
    /// [`UserBufferCache::lookup`]), registering it on a miss when not `capturing`.
    /// `Ok(None)`: not registrable by every rank (or a miss during capture): use a copying
    /// algorithm.
    pub fn get_or_register(
        &self,
        comm: &Communicator,
        device: Device,
        ptr: u64,
        size: usize,
        capturing: bool,
    ) -> Result<Option<Arc<UserBuffer>>> {
        let key = (ptr, size);
        {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            match entries.get(&key) {
                Some(Some(ub)) if !ub.local.is_current() => {
                    if capturing {
                        return Err(Error::invalid(format!(
                            "user buffer {ptr:#x} (+{size} bytes): the memory registered there \
                             was freed and other memory allocated at the same address; under \
                             graph capture only registrations made before it can be used \
                             (run the call once outside capture first)"
                        )));
                    }
                    // Freed and allocated again: register the new memory (collectively: the
                    // ranks free and allocate alike, see the module doc).
                    entries.remove(&key);
                }
                Some(e) => return Ok(e.clone()),
                None => {
                    // Every rank caches the same entries (they meet the same buffers in the
                    // same order), so every rank takes this hit alike.
                    if let Some(ub) = Self::larger(&entries, ptr, size) {
                        return Ok(Some(ub));
                    }
                }
            }
        }
        if capturing {
            return Ok(None);
        }
        let b = comm.bootstrap();
        let (rank, n) = (b.rank(), b.nranks());
        let local = match comm.register_memory(ptr, size, Transport::CudaIpc.into()) {
            Ok(l) => Some(l),
            Err(e) => {
                crate::log_info!(
                    "COLL",
                    "user buffer {ptr:#x} (+{size} bytes) cannot be registered here, every rank \
                     copies it instead: {e}"
                );
                None
            }
        };
        let mut blob = vec![u8::from(local.is_some())];
        if let Some(l) = &local {
            blob.extend_from_slice(&l.serialize());
        }
        let all = b.all_gather(&blob)?;
        let entry = if all.iter().all(|x| x.first() == Some(&1)) {
            let local = local.ok_or_else(|| Error::Internal("registration vanished".into()))?;
            // Mapping the peers' exports may fail here (a driver refusing a handle): agree on
            // that too, so every rank takes the same path.
            let mapped = map_peers(&all, rank, ptr).and_then(|(peers, bases)| {
                let table = LocalMemory::alloc(device, 8 * n)?;
                let bytes: Vec<u8> = bases.iter().flat_map(|v| v.to_le_bytes()).collect();
                table.write(0, &bytes)?;
                Ok(UserBuffer {
                    local,
                    peers,
                    bases,
                    table,
                })
            });
            if let Err(e) = &mapped {
                crate::log_info!(
                    "COLL",
                    "user buffer {ptr:#x} (+{size} bytes): mapping the peers' buffers failed \
                     here, every rank copies it instead: {e}"
                );
            }
            let oks = b.all_gather(&[u8::from(mapped.is_ok())])?;
            match mapped {
                Ok(ub) if oks.iter().all(|x| x.first() == Some(&1)) => Some(Arc::new(ub)),
                _ => None,
            }
        } else {
            None
        };
        crate::log_info!(
            "COLL",
            "user buffer {ptr:#x} (+{size} bytes): {}",
            if entry.is_some() {
                "mapped on every rank (zero-copy)"
            } else {
                "not registrable on every rank (copying algorithms)"
            }
        );
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, entry.clone());
        Ok(entry)
    }

    /// Forgets every entry overlapping `ptr..ptr+size` (the application deregistered or is
    /// about to free that memory; their imports are unmapped once no call uses them). Local:
    /// every rank forgets alike (see the module doc).
    pub fn forget(&self, ptr: u64, size: usize) {
        let end = ptr.saturating_add(size as u64);
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(p, s), _| *p >= end || p.saturating_add(*s as u64) <= ptr);
    }

    /// Entries cached so far (positive and negative).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every peer's registration of `all` (this rank's own at `rank`, address `ptr`) mapped here:
/// the mappings and every rank's address as seen here.
fn map_peers(
    all: &[Vec<u8>],
    rank: usize,
    ptr: u64,
) -> Result<(Vec<Option<RegisteredMemory>>, Vec<u64>)> {
    let mut peers = Vec::with_capacity(all.len());
    let mut bases = Vec::with_capacity(all.len());
    for (p, x) in all.iter().enumerate() {
        if p == rank {
            peers.push(None);
            bases.push(ptr);
            continue;
        }
        let m = RegisteredMemory::deserialize(&x[1..])?;
        if m.data() == 0 {
            return Err(Error::remote(
                p,
                "user buffer: expected memory mapped in this process (CudaIpc on this host)",
            ));
        }
        bases.push(m.data());
        peers.push(Some(m));
    }
    Ok((peers, bases))
}
