//! The table of this process's live CudaIpc registrations, shared with importers on the host.
//!
//! A CudaIpc export names an allocation, not a registration: after the owner drops a
//! registration (and perhaps registers other data in the same allocation, or at the same
//! address) an old handle would still map and write it. So every CudaIpc registration takes a
//! slot of one per-process table (host memfd memory, exported once through the host backend's
//! fd server) and stores its registration id there while it lives; dropping it zeroes the slot.
//! The serialized memory carries the table's descriptor and the slot. An importer maps the
//! owner's table once (shared by every import from that process) and refuses to import a
//! handle whose slot no longer holds its id; writes through an import check it again (one
//! atomic load), so a registration dropped after the import is never written either.
//!
//! Slot reuse is safe: a reused slot holds the new registration's (random) id, which never
//! equals the stale handle's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp_hal::api::Host;
use mscclpp_hal::{Api, Buffer, IpcApi, IpcDescriptor, IpcKind, MemoryApi, MemoryKind};

use crate::error::{Error, Result};
use crate::memory::{hal_err, host_device};

/// Slots of the table: live CudaIpc registrations one process can hold at a time (2 MiB of
/// address space; only touched pages are committed).
pub(crate) const SLOTS: u32 = 1 << 18;

struct LocalTable {
    /// Owned for the life of the process (`words` points into it).
    _mem: <Host as Api>::Memory,
    words: *const AtomicU64,
    desc: Vec<u8>,
    free: Mutex<(Vec<u32>, u32)>,
}

// SAFETY: `words` points into `mem`, which the table owns for the life of the process; it is
// only accessed through atomics.
unsafe impl Send for LocalTable {}
// SAFETY: as above.
unsafe impl Sync for LocalTable {}

impl LocalTable {
    fn word(&self, slot: u32) -> &AtomicU64 {
        // SAFETY: callers pass slot < SLOTS; the mapping holds SLOTS aligned u64 words and
        // lives as long as the table (the whole process).
        unsafe { &*self.words.add(slot as usize) }
    }
}

fn local_table() -> Result<&'static LocalTable> {
    static T: OnceLock<std::result::Result<LocalTable, String>> = OnceLock::new();
    T.get_or_init(|| {
        let make = || -> Result<LocalTable> {
            let dev = host_device()?;
            let bytes = SLOTS as usize * 8;
            let mem = Host::alloc(&dev, bytes, MemoryKind::Device)
                .map_err(|e| hal_err("allocate the registration table", e))?;
            let words = mem
                .host_ptr()
                .ok_or_else(|| Error::Internal("registration table has no host address".into()))?
                as *const AtomicU64;
            let desc = Host::export(&mem, IpcKind::HostMemfd)
                .map_err(|e| hal_err("export the registration table", e))?
                .to_bytes();
            Ok(LocalTable {
                _mem: mem,
                words,
                desc,
                free: Mutex::new((Vec::new(), 0)),
            })
        };
        make().map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::Internal(format!("registration table: {e}")))
}

/// A slot of this process's table holding a live registration's id; zeroed and freed on drop.
pub(crate) struct LocalSlot {
    table: &'static LocalTable,
    slot: u32,
}

impl LocalSlot {
    /// Takes a slot and stores `id` in it.
    pub(crate) fn new(id: u64) -> Result<LocalSlot> {
        let table = local_table()?;
        let slot = {
            let mut f = table.free.lock().unwrap_or_else(|p| p.into_inner());
            match f.0.pop() {
                Some(s) => s,
                None if f.1 < SLOTS => {
                    f.1 += 1;
                    f.1 - 1
                }
                None => {
                    return Err(Error::invalid(format!(
                        "register_memory: expected at most {SLOTS} live CudaIpc registrations \
                         in one process, all are in use"
                    )))
                }
            }
        };
        table.word(slot).store(id, Ordering::Release);
        Ok(LocalSlot { table, slot })
    }
    /// The slot index (serialized).
    pub(crate) fn index(&self) -> u32 {
        self.slot
    }
    /// The table's IPC descriptor (serialized).
    pub(crate) fn table_descriptor(&self) -> &[u8] {
        &self.table.desc
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        self.table.word(self.slot).store(0, Ordering::Release);
        self.table
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .push(self.slot);
    }
}

/// Another process's table, mapped here.
struct RemoteTable {
    map: <Host as Api>::Imported,
}

impl RemoteTable {
    fn holds(&self, slot: u32, id: u64) -> bool {
        if slot >= SLOTS || (u64::from(slot) + 1) * 8 > self.map.size() as u64 {
            return false;
        }
        let base = self.map.device_ptr() as usize as *const AtomicU64;
        // SAFETY: slot is inside the mapping (checked above); the mapping lives as long as
        // self, and the owner writes the words only atomically.
        unsafe { &*base.add(slot as usize) }.load(Ordering::Acquire) == id
    }
}

/// The owner's slot of an imported registration: checks that the registration still lives.
pub(crate) struct RemoteSlot {
    table: Arc<RemoteTable>,
    slot: u32,
    id: u64,
}

impl RemoteSlot {
    /// Maps (or reuses the mapping of) the owner's table named by `desc` and checks that
    /// `slot` holds `id`; a stale handle is an error naming it.
    pub(crate) fn import(desc: &[u8], slot: u32, id: u64, what: &str) -> Result<RemoteSlot> {
        let d = IpcDescriptor::from_bytes(desc).map_err(|e| {
            Error::invalid(format!(
                "{what}: registration table: expected a valid IPC descriptor: {e}"
            ))
        })?;
        if d.kind != IpcKind::HostMemfd || d.size != u64::from(SLOTS) * 8 {
            return Err(Error::invalid(format!(
                "{what}: expected a {}-byte host registration table, got a {:?} export of {} \
                 bytes",
                u64::from(SLOTS) * 8,
                d.kind,
                d.size
            )));
        }
        if slot >= SLOTS {
            return Err(Error::invalid(format!(
                "{what}: registration slot: expected below {SLOTS}, got {slot}"
            )));
        }
        let table = remote_table(&d)?;
        let s = RemoteSlot { table, slot, id };
        s.check(what)?;
        Ok(s)
    }

    /// `Ok` while the owner still holds the registration.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        if self.table.holds(self.slot, self.id) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{what}: registration {:#x} is no longer live at its owner (a stale handle: the \
             owner dropped it, and may have registered other memory there); expected a live \
             registration",
            self.id
        )))
    }
}

/// The mapped tables of other processes, by (pid, host id, fd id): one mapping per owner
/// while imports from it live.
fn remote_table(d: &IpcDescriptor) -> Result<Arc<RemoteTable>> {
    type Map = HashMap<(u32, u64, u64), Weak<RemoteTable>>;
    static M: OnceLock<Mutex<Map>> = OnceLock::new();
    let key = (d.pid, d.host_id, d.fd_id);
    let map = M.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(t) = map
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .and_then(Weak::upgrade)
    {
        return Ok(t);
    }
    // Import outside the lock: fetching the fd waits on the owner's fd server.
    let dev = host_device()?;
    let imported =
        Host::import(&dev, d).map_err(|e| hal_err("import the owner's registration table", e))?;
    let t = Arc::new(RemoteTable { map: imported });
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    m.retain(|_, w| w.strong_count() > 0);
    m.insert(key, Arc::downgrade(&t));
    Ok(t)
}
