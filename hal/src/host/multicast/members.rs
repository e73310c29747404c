//! Mapped emulated multicast objects and the members behind a multicast address: how the
//! host backend's "device" operations (`core::device_emu::switch_channel`) find, for an
//! address inside a mapping, every device's bound memory at that offset.
//!
//! A mapping is an inaccessible address reservation (plain loads and stores there fault, as
//! plain accesses to a multicast address are no substitute for `multimem` operations) entered
//! in a process-wide registry by address. Resolving `[addr, addr + len)` reads the object's
//! binding table (only when its generation changed since the last read), maps every member's
//! memfd once (fetched from the member's fd server) and returns one pointer per device into its
//! bound memory at that offset. The returned [`MulticastMembers`] keeps those maps alive.

use super::table::{Binding, McObject};
use crate::auxil::fdpass::{self, FD_FETCH_TIMEOUT};
use crate::auxil::os::{Mapping, Reservation};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A member's memfd mapped in this process.
#[derive(Debug)]
pub(super) struct PeerMap {
    map: Mapping,
    len: u64,
}

type PeerKey = (u64, u32, u64);

#[derive(Debug, Default)]
struct Cache {
    /// The table generation `bindings` was read at (`None` before the first read).
    generation: Option<u64>,
    bindings: Vec<(Binding, Arc<PeerMap>)>,
}

/// One mapping of an object: the reserved range and the cache of its members.
#[derive(Debug)]
pub(super) struct MappedObject {
    pub(super) obj: Arc<McObject>,
    resv: Reservation,
    len: usize,
    cache: Mutex<Cache>,
}

impl MappedObject {
    /// Reserves `len` bytes for `obj` and enters the range in the registry.
    pub(super) fn new(obj: Arc<McObject>, len: usize) -> Result<Arc<MappedObject>> {
        let resv = Reservation::new(len)?;
        let m = Arc::new(MappedObject {
            obj,
            resv,
            len,
            cache: Mutex::new(Cache::default()),
        });
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(m.base(), Arc::downgrade(&m));
        Ok(m)
    }

    /// The first address of the reserved range.
    pub(super) fn base(&self) -> u64 {
        self.resv.ptr() as usize as u64
    }

    /// Re-reads the binding table if it changed and maps members not mapped yet. A member that
    /// unbinds (and frees its memory) meanwhile makes its fd unavailable: then the table is read
    /// again, a few times.
    fn refresh(&self, cache: &mut Cache) -> Result<()> {
        let table = self.obj.table();
        for _attempt in 0..8 {
            let generation = table.header().generation.load(Ordering::Acquire);
            if cache.generation == Some(generation) {
                return Ok(());
            }
            let mut known: HashMap<PeerKey, Arc<PeerMap>> = cache
                .bindings
                .iter()
                .map(|(b, m)| ((b.host_id, b.pid, b.fd_id), Arc::clone(m)))
                .collect();
            let mut fresh = Vec::new();
            let mut gone = false;
            for (_, b) in table.bindings()? {
                let key = (b.host_id, b.pid, b.fd_id);
                let map = match known.get(&key) {
                    Some(m) => Arc::clone(m),
                    None => match map_member(&b) {
                        Ok(m) => {
                            let m = Arc::new(m);
                            known.insert(key, Arc::clone(&m));
                            m
                        }
                        Err(e) => {
                            if table.header().generation.load(Ordering::Acquire) != generation {
                                gone = true;
                                break;
                            }
                            return Err(e);
                        }
                    },
                };
                if b.mem_offset + b.size > map.len {
                    return Err(Error::BadDescriptor(format!(
                        "multicast member of pid {}: binding [{}, {}) of its memory exceeds the \
                         {}-byte memfd",
                        b.pid,
                        b.mem_offset,
                        b.mem_offset + b.size,
                        map.len
                    )));
                }
                fresh.push((b, map));
            }
            if !gone {
                cache.bindings = fresh;
                cache.generation = Some(generation);
                return Ok(());
            }
        }
        Err(Error::Timeout {
            op: "read the multicast binding table (it kept changing under the reader)",
            waited: FD_FETCH_TIMEOUT,
        })
    }
}

impl Drop for MappedObject {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if reg.get(&self.base()).is_some_and(|w| w.strong_count() == 0) {
            reg.remove(&self.base());
        }
    }
}

/// Memfd `fd_id` of process `pid` on host `host_id`, fetched from that process's fd server,
/// and its length (`what` names the fstat in its error).
pub(super) fn fetch_memfd(
    host_id: u64,
    pid: u32,
    fd_id: u64,
    what: &'static str,
) -> Result<(OwnedFd, u64)> {
    let file = std::fs::File::from(fdpass::fetch(host_id, pid, fd_id, FD_FETCH_TIMEOUT)?);
    let len = file
        .metadata()
        .map_err(|source| Error::Os { op: what, source })?
        .len();
    Ok((OwnedFd::from(file), len))
}

fn map_member(b: &Binding) -> Result<PeerMap> {
    let (fd, len) = fetch_memfd(b.host_id, b.pid, b.fd_id, "fstat(multicast member memfd)")?;
    let map_len = usize::try_from(len)
        .map_err(|_| Error::BadDescriptor(format!("member memfd of {len} bytes")))?;
    // The mapping keeps the pages; the fd is closed when this function returns.
    let map = Mapping::shared(&fd, map_len)?;
    Ok(PeerMap { map, len })
}

fn registry() -> &'static Mutex<BTreeMap<u64, Weak<MappedObject>>> {
    static REG: OnceLock<Mutex<BTreeMap<u64, Weak<MappedObject>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Every device's memory behind a multicast address range, one pointer per device in the
/// order the devices were added; keeps the member mappings alive while it lives.
#[derive(Debug)]
pub struct MulticastMembers {
    ptrs: Vec<*mut u8>,
    _maps: Vec<Arc<PeerMap>>,
}

// Thread-safe: plain addresses of shared mappings kept alive by `_maps`; access is the caller's
// (device code's) business, as for device memory.
thread_safe!(MulticastMembers);

impl MulticastMembers {
    /// One pointer per device, each to the first byte of the resolved range in that device's
    /// bound memory (valid for the resolved length while `self` lives).
    pub fn ptrs(&self) -> &[*mut u8] {
        &self.ptrs
    }
}

/// Resolves `[addr, addr + len)` of a host-backend multicast mapping of this process into every
/// device's bound memory at that offset. Errors: the address is no mapped multicast range, the
/// range leaves the mapping, or some device has no memory bound covering the whole range.
pub fn multicast_members(addr: u64, len: usize) -> Result<MulticastMembers> {
    const OP: &str = "multicast device operation (host)";
    let mapped = {
        let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.range(..=addr)
            .next_back()
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| {
                Error::invalid(
                    OP,
                    "an address inside a multicast mapping of this process",
                    format!("{addr:#x}"),
                )
            })?
    };
    let offset = addr - mapped.base();
    if offset
        .checked_add(len as u64)
        .is_none_or(|end| end > mapped.len as u64)
        || len == 0
    {
        return Err(Error::invalid(
            OP,
            format!(
                "a non-empty range inside the {}-byte multicast mapping",
                mapped.len
            ),
            format!("offset {offset} + {len} bytes"),
        ));
    }
    let mut cache = mapped.cache.lock().unwrap_or_else(|p| p.into_inner());
    mapped.refresh(&mut cache)?;
    let n = mapped.obj.info.ndevices;
    let mut ptrs = Vec::with_capacity(n);
    let mut maps = Vec::with_capacity(n);
    for device in 0..n as u32 {
        let hit = cache
            .bindings
            .iter()
            .find(|(b, _)| b.device == device && b.covers(offset, len as u64));
        let Some((b, map)) = hit else {
            return Err(Error::invalid(
                OP,
                format!(
                    "memory of each of the {n} devices bound over multicast offsets [{offset}, {})",
                    offset + len as u64
                ),
                format!("device {device} has none bound there"),
            ));
        };
        let at = b.mem_offset + (offset - b.mc_offset);
        // SAFETY: at + len <= mem_offset + size <= the member's memfd length (checked at refresh).
        ptrs.push(unsafe { map.map.ptr().add(at as usize) });
        maps.push(Arc::clone(map));
    }
    Ok(MulticastMembers { ptrs, _maps: maps })
}
