//! The cache of registered user buffers for zero-copy algorithms, keyed by `(ptr, size)`; a hit
//! also needs the registered memory to still be there (its identity, not its address: memory
//! freed and allocated again at the same address is registered again).
//!
//! A buffer inside a live registration made before (not at its start: nccl-tests moves its
//! buffers through the registered range call by call, PyTorch's tensors lie inside segments)
//! is a view of it: at every miss one bootstrap all-gather (host only, so also under graph
//! capture) checks that every rank found the same registration (its creation number) at the
//! same offset; then the call uses that registration's mappings and device table with the
//! offset (no new registration, no driver call), else it goes on as a miss. Why: nccl-tests
//! shifts its buffers by the call's size at every iteration (inside the range it registered),
//! so without views every captured call but the first of a size missed and copied: `-R 1`
//! all-reduce on the H200 (2026-12-04, 2 ranks) took rsag_pipeline's times, 0.60x of `-R 0` at
//! 4 MiB, and was zero-copy (2.69x) only at 256 MiB, the range's one slot.
//!
//! Ranges the caller declared registered ([`UserBufferCache::declare`]: `ncclCommRegister`,
//! `ncclCommWindowRegister`, `Collectives::register_buffer`) are registered whole at the next
//! miss outside capture (every rank its pending ones, in declaration order, when every rank has
//! as many: the count rides on the view exchange), so every later call inside them is a view,
//! also when first met under capture. Why: a registration of the call's own extent covers only
//! that call; nccl-tests `-R 1` reduce-scatter in place reads its input from the receive range,
//! which no out-of-place call had registered, so every in-place size missed under capture and
//! copied (142 misses logged on the H200, 2026-12-04).
//!
//! Otherwise a miss outside graph capture is collective: every rank registers its buffer for
//! CudaIpc (memory of this library, or the application's own allocation when the backend can
//! export it: `cudaMalloc`, cuMem/VMM with a shareable handle type, a host memfd mapping),
//! then one bootstrap all-gather exchanges the results. If any rank could not register, every rank
//! caches a negative entry and the caller falls back to a copying algorithm, so all ranks take
//! the same path; so does a second exchange of whether every rank could map every peer's
//! buffer. Otherwise a miss under graph capture returns `None` (no registration). Ranks must
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

/// One registered user buffer and its peers' mappings, or a view of one (a buffer inside it at
/// the same offset on every rank).
pub struct UserBuffer {
    /// The local registration (keeps the allocation alive).
    pub local: RegisteredMemory,
    /// The peers' buffers mapped here (`None` at this rank).
    pub peers: Vec<Option<RegisteredMemory>>,
    /// `u64[nranks]`: every rank's buffer (this view's start) as mapped here (own address at
    /// this rank).
    pub bases: Vec<u64>,
    /// Device copy of the registration's `bases` (shared by its views) for kernels: a kernel
    /// adds [`UserBuffer::offset`] to its entries.
    pub table: Arc<LocalMemory>,
    /// Where this view starts past the registration's start (0 for the registration itself).
    pub offset: u64,
    /// The registration's creation number in this cache (the same on every rank: registrations
    /// are collective).
    seq: u64,
}

impl UserBuffer {
    /// The view of this registration starting `offset` bytes further.
    fn view(&self, offset: u64) -> UserBuffer {
        UserBuffer {
            local: self.local.clone(),
            peers: self.peers.clone(),
            bases: self.bases.iter().map(|b| b + offset).collect(),
            table: self.table.clone(),
            offset: self.offset + offset,
            seq: self.seq,
        }
    }
}

/// Cached registrations by `(ptr, size)`: `None` = not registrable by every rank. Ordered, so
/// the registrations starting at one address are neighbours (see [`UserBufferCache::lookup`]).
type Entries = BTreeMap<(u64, usize), Option<Arc<UserBuffer>>>;

/// The cache's state.
#[derive(Default)]
struct State {
    entries: Entries,
    /// The creation number of the next registration.
    next_seq: u64,
    /// Ranges the caller declared registered ([`UserBufferCache::declare`]: `ncclCommRegister`,
    /// `ncclCommWindowRegister`, `Collectives::register_buffer`), in declaration order, until
    /// taken back.
    declared: Vec<Declared>,
}

/// A declared range; `pending` until a miss registers it (or the ranks' counts of pending ones
/// differed there and every rank dropped them).
struct Declared {
    ptr: u64,
    size: usize,
    pending: bool,
}

/// The cache (see the module doc).
#[derive(Default)]
pub struct UserBufferCache {
    state: Mutex<State>,
}

impl UserBufferCache {
    /// A live registration of at least `size` bytes starting at `ptr` other than `(ptr, size)`
    /// itself: the call's buffer is the start of a larger buffer seen before (nccl-tests `-R`
    /// registers its largest size and warms up with it outside capture, then captures every
    /// smaller size at the same address; an exact-size lookup missed there and every size but
    /// the largest fell back to a copying algorithm). The smallest such registration.
    pub fn lookup(&self, ptr: u64, size: usize) -> Option<Arc<UserBuffer>> {
        let st = self.lock();
        Self::larger(&st.entries, ptr, size)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What [`UserBufferCache::get_or_register`] would answer without registering or talking
    /// to the peers: `Some(entry)` for a cached `(ptr, size)` whose memory is still there
    /// (positive or negative) or a live larger registration at `ptr`; `None` when only a
    /// registration could tell. A launch asks this first and queries graph capture (a driver
    /// call) only when it returns `None`.
    pub fn cached(&self, ptr: u64, size: usize) -> Option<Option<Arc<UserBuffer>>> {
        let st = self.lock();
        match st.entries.get(&(ptr, size)) {
            Some(Some(ub)) if !ub.local.is_current() => None,
            Some(e) => Some(e.clone()),
            None => Self::larger(&st.entries, ptr, size).map(Some),
        }
    }

    /// The smallest live registration (not a view) holding `ptr..ptr+size` that starts
    /// below `ptr`, and the offset of `ptr` in it.
    fn containing(entries: &Entries, ptr: u64, size: usize) -> Option<(Arc<UserBuffer>, u64)> {
        let end = ptr.checked_add(size as u64)?;
        entries
            .range(..(ptr, 0))
            .filter_map(|(&(p, s), e)| {
                let ub = e.as_ref()?;
                let fits = ub.offset == 0 && p.checked_add(s as u64)? >= end;
                (fits && ub.local.is_current()).then(|| (s, ub.clone(), ptr - p))
            })
            .min_by_key(|(s, _, off)| (*s, *off))
            .map(|(_, ub, off)| (ub, off))
    }

    /// The view of `ptr..ptr+size` inside the registration every rank `found` at the same
    /// offset (one bootstrap all-gather, host only, found or not), cached; `None` when they did
    /// not all find the same one. The same exchange carries every rank's number of pending
    /// declared ranges: that number when every rank has the same, above 0, else 0 (ranks that
    /// differ drop the ones they counted, logged: their buffers are then registered call by
    /// call). Declarations made meanwhile (another thread) stay pending for the next miss.
    fn agree_on_view(
        &self,
        comm: &Communicator,
        ptr: u64,
        size: usize,
        found: Option<(Arc<UserBuffer>, u64)>,
    ) -> Result<(Option<Arc<UserBuffer>>, usize)> {
        // [pending: u32][found: u8]([seq: u64][offset: u64])
        let pending = u32::try_from(self.pending()).unwrap_or(u32::MAX);
        let mut blob = pending.to_le_bytes().to_vec();
        blob.push(u8::from(found.is_some()));
        if let Some((ub, off)) = &found {
            blob.extend_from_slice(&ub.seq.to_le_bytes());
            blob.extend_from_slice(&off.to_le_bytes());
        }
        let all = comm.bootstrap().all_gather(&blob)?;
        let view = match found {
            Some((ub, off)) if all.iter().all(|x| x.get(4..) == blob.get(4..)) => {
                Some(Arc::new(ub.view(off)))
            }
            _ => None,
        };
        let counts: Vec<u32> = all
            .iter()
            .map(|x| {
                x.get(..4)
                    .map_or(0, |c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            })
            .collect();
        let agreed = counts.iter().all(|c| *c == pending);
        if !agreed {
            crate::log_info!(
                "COLL",
                "declared buffers pending per rank differ ({counts:?}): every rank drops them; \
                 their buffers are registered call by call"
            );
            self.drain_pending(pending as usize);
        }
        let said = match (&view, all.iter().any(|x| x.get(4) == Some(&1))) {
            (Some(_), _) => {
                Some("inside a registration at the same offset on every rank (zero-copy view)")
            }
            (None, true) => {
                Some("inside a registration, but not the same one at the same offset on every rank")
            }
            (None, false) => None,
        };
        if let Some(said) = said {
            crate::log_info!("COLL", "user buffer {ptr:#x} (+{size} bytes): {said}");
        }
        if view.is_some() {
            self.lock().entries.insert((ptr, size), view.clone());
        }
        Ok((view, if agreed { pending as usize } else { 0 }))
    }

    /// Marks the first `count` pending declarations no longer pending; their ranges.
    fn drain_pending(&self, count: usize) -> Vec<(u64, usize)> {
        let mut st = self.lock();
        st.declared
            .iter_mut()
            .filter(|d| d.pending)
            .take(count)
            .map(|d| {
                d.pending = false;
                (d.ptr, d.size)
            })
            .collect()
    }

    fn larger(entries: &Entries, ptr: u64, size: usize) -> Option<Arc<UserBuffer>> {
        let from = size.checked_add(1)?;
        entries
            .range((ptr, from)..=(ptr, usize::MAX))
            .find_map(|(_, e)| e.as_ref().filter(|ub| ub.local.is_current()).cloned())
    }

    /// Declares `ptr..ptr+size` registered by the caller (local, no peer, no driver): at the
    /// next miss outside graph capture every rank registers its declared ranges whole, in
    /// declaration order, if every rank has as many pending; later calls anywhere inside them
    /// are views (under capture too). Ranks declare their corresponding buffers alike, as with
    /// `ncclCommRegister`.
    pub fn declare(&self, ptr: u64, size: usize) {
        if size > 0 {
            self.lock().declared.push(Declared {
                ptr,
                size,
                pending: true,
            });
        }
    }

    /// Whether `ptr..ptr+size` lies inside one declared range ([`UserBufferCache::declare`]).
    pub fn is_declared(&self, ptr: u64, size: usize) -> bool {
        let Some(end) = ptr.checked_add(size as u64) else {
            return false;
        };
        self.lock()
            .declared
            .iter()
            .any(|d| d.ptr <= ptr && d.ptr.saturating_add(d.size as u64) >= end)
    }

    /// Takes back one declaration of `ptr..ptr+size` (registrations made from it go with
    /// [`UserBufferCache::forget`]).
    pub fn undeclare(&self, ptr: u64, size: usize) {
        let mut st = self.lock();
        // A pending one first (the range may be declared twice).
        let same = |d: &Declared| (d.ptr, d.size) == (ptr, size);
        let at = st.declared.iter().position(|d| same(d) && d.pending);
        if let Some(i) = at.or_else(|| st.declared.iter().position(same)) {
            st.declared.remove(i);
        }
    }

    /// Declared ranges not registered yet.
    pub fn pending(&self) -> usize {
        self.lock().declared.iter().filter(|d| d.pending).count()
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
        let inside = {
            let mut st = self.lock();
            let entries = &mut st.entries;
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
                    if let Some(ub) = Self::larger(entries, ptr, size) {
                        return Ok(Some(ub));
                    }
                }
            }
            Self::containing(entries, ptr, size)
        };
        // Every rank meets this miss (the same entries on every rank): agree on a view, also
        // under capture (host traffic only). Always exchanged, found or not, so a rank that
        // alone holds a containing registration never pairs its exchange with another's.
        let (view, pending) = self.agree_on_view(comm, ptr, size, inside)?;
        if let Some(view) = view {
            return Ok(Some(view));
        }
        if !capturing && pending > 0 {
            // Every rank registers its declared ranges whole (as many as every rank counted),
            // then looks again: the call is now inside one (a view), or goes on as a miss.
            self.register_pending(comm, device, pending)?;
            return self.get_or_register(comm, device, ptr, size, capturing);
        }
        if capturing {
            // Rare (once per captured call on a buffer never used outside capture), so said
            // every time: the capture runs a copying algorithm for it.
            crate::log_info!(
                "COLL",
                "user buffer {ptr:#x} (+{size} bytes): first seen under graph capture, not \
                 registered (copying algorithm; run the call once outside capture first)"
            );
            return Ok(None);
        }
        self.register_new(comm, device, ptr, size)
    }

    /// Registers the first `count` declared ranges pending (every rank counted as many: see
    /// [`UserBufferCache::agree_on_view`]), in declaration order, each collectively
    /// ([`UserBufferCache::register_new`]; one some rank cannot register is cached negative).
    fn register_pending(&self, comm: &Communicator, device: Device, count: usize) -> Result<()> {
        let ranges = self.drain_pending(count);
        for i in 0..count {
            // Exactly `count` collective registrations on every rank: should another thread
            // have taken a declaration back meanwhile, this rank takes part with an empty
            // range (registrable nowhere, so every rank caches that registration negative).
            let (p, s) = ranges.get(i).copied().unwrap_or((0, 0));
            self.register_new(comm, device, p, s)?;
        }
        Ok(())
    }

    /// Registers `ptr..ptr+size` on every rank (collective: every rank calls it alike) and
    /// caches the outcome: the registration with every peer's buffer mapped, or `None` when
    /// some rank could not register or map (agreed, so every rank copies alike).
    fn register_new(
        &self,
        comm: &Communicator,
        device: Device,
        ptr: u64,
        size: usize,
    ) -> Result<Option<Arc<UserBuffer>>> {
        let key = (ptr, size);
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
                    table: Arc::new(table),
                    offset: 0,
                    seq: 0,
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
                Ok(mut ub) if oks.iter().all(|x| x.first() == Some(&1)) => {
                    // Numbered in the order every rank registers (collectively, so alike).
                    let mut st = self.lock();
                    ub.seq = st.next_seq;
                    st.next_seq += 1;
                    Some(Arc::new(ub))
                }
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
        self.lock().entries.insert(key, entry.clone());
        Ok(entry)
    }

    /// Forgets every entry overlapping `ptr..ptr+size` (the application deregistered or is
    /// about to free that memory; their imports are unmapped once no call uses them). Local:
    /// every rank forgets alike (see the module doc).
    pub fn forget(&self, ptr: u64, size: usize) {
        let end = ptr.saturating_add(size as u64);
        self.lock()
            .entries
            .retain(|(p, s), _| *p >= end || p.saturating_add(*s as u64) <= ptr);
    }

    /// Entries cached so far (positive and negative).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
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
