//! Registered memory: a range of a live allocation made reachable over a set of transports,
//! and its explicit wire format.
//!
//! Wire format (little endian), version 2, inside the `crate::serialize` envelope (magic
//! `MREG`):
//!
//! | field | type |
//! |---|---|
//! | original pointer | u64 (the address in the owning process) |
//! | size | u64 (> 0; pointer + size must not overflow) |
//! | transports | u32 ([`TransportFlags::bits`]) |
//! | device kind, device id | u8, i32 (as in endpoints) |
//! | host hash, pid hash | u64, u64 |
//! | registration id | u64 (random, not 0) |
//! | transport infos | u8 count, then per info: transport u8, u32 length (<= 4096), bytes |
//!
//! Each transport in the set carries at most one info blob. CudaIpc: `backend u8 (0 host, 1
//! GPU) | offset of the range inside the exported allocation u64 | IPC descriptor blob`
//! ([`mscclpp_hal::IpcDescriptor`]) `| liveness slot u32 | liveness table descriptor blob`;
//! it is present exactly when CudaIpc is in the set. IB transports carry their own blob
//! (address, length, rkey; see [`crate::ib`]), opaque to this layer, and a local registration
//! owns one memory region per IB transport; Ethernet needs none (the peer addresses the memory
//! by its original pointer and registration id).
//!
//! # Identity
//! Every registration has a random 64-bit id, unguessable by other processes, so a handle
//! names one registration, not an address range: after the owner drops a registration (and
//! perhaps registers other memory at the same address) the old handle is stale and refused
//! everywhere. Ethernet writes carry the id and the receiver accepts them only into the live
//! registration with that id (`find_registration`); IB refuses them by rkey (the region
//! was deregistered); CudaIpc checks the owner's liveness table (`liveness`) at import and
//! before every write through the import; deserializing in the owning process finds the live
//! registration by id.
//!
//! Deserializing in the owning process returns the live registration; on the same host with
//! CudaIpc it imports the export through the HAL (the fd is fetched from the exporter's fd
//! server and closed when the last clone of the import drops); elsewhere the memory is
//! reachable only remotely and [`RegisteredMemory::data`] is 0.

mod liveness;

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp_hal::api::Host;
use mscclpp_hal::{prelude::*, Buffer, Gpu, IpcDescriptor};

use crate::error::{Error, Result};
use crate::identity::{local_host_hash, pid_hash};
use crate::memory::{
    default_gpu, gpu_device, hal_err, host_addressable, host_device, Allocation, BackendTag,
};
use crate::serialize::{decode_device, Reader, Writer, MAX_TRANSPORT_PAYLOAD};
use crate::transport::{Device, DeviceType, Transport, TransportFlags};

const MAGIC: &[u8; 4] = b"MREG";
const VERSION: u16 = 2;

/// Memory registered with a [`crate::Context`], or received from a peer. Cheap to clone.
#[derive(Clone)]
pub struct RegisteredMemory {
    inner: Arc<RegInner>,
}

struct RegInner {
    /// This registration's slot in the liveness table (CudaIpc registrations made here);
    /// first, so the slot is cleared before anything else is released.
    _live_local: Option<liveness::LocalSlot>,
    /// The owner's liveness slot of an imported CudaIpc registration.
    live_remote: Option<liveness::RemoteSlot>,
    /// The registration id (see "Identity").
    id: u64,
    original_ptr: u64,
    size: usize,
    transports: TransportFlags,
    device: Device,
    host_hash: u64,
    pid_hash: u64,
    /// Usable address in this process (0 if only reachable remotely).
    data: u64,
    /// One memory region per IB transport of a local registration; declared before `local`
    /// so the regions are deregistered before the allocation can be freed.
    ib_mrs: Vec<crate::ib::mr::IbMr>,
    /// The allocation when this process owns the memory, and the offset of the range in it.
    local: Option<(Arc<Allocation>, u64)>,
    /// The imported mapping (dropped -> unmapped, fd closed).
    _imported: Option<Box<dyn Any + Send + Sync>>,
    infos: Vec<(Transport, Vec<u8>)>,
    /// Whether this is the registry's entry (a registration made here; removed on drop).
    registered_here: bool,
}

impl Drop for RegInner {
    fn drop(&mut self) {
        if self.registered_here {
            let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
            // Remove only our own entry (an upgrade of a dead weak would fail anyway).
            if map.get(&self.id).is_some_and(|e| e.mem.strong_count() == 0) {
                map.remove(&self.id);
            }
        }
    }
}

impl std::fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("RegisteredMemory")
            .field("original_ptr", &format_args!("{:#x}", i.original_ptr))
            .field("data", &format_args!("{:#x}", i.data))
            .field("size", &i.size)
            .field("transports", &i.transports)
            .field("device", &i.device)
            .field("id", &format_args!("{:#x}", i.id))
            .finish()
    }
}

struct RegistryEntry {
    start: u64,
    len: u64,
    transports: TransportFlags,
    mem: Weak<RegInner>,
}

fn registry() -> &'static Mutex<BTreeMap<u64, RegistryEntry>> {
    static R: OnceLock<Mutex<BTreeMap<u64, RegistryEntry>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Why [`find_registration`] refused an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// No live registration has the id (never registered, or dropped: a stale handle).
    Stale,
    /// The registration lives but the range is outside it.
    OutOfRange,
    /// The registration lives but is not registered for the transport.
    WrongTransport,
}

impl Rejection {
    /// What the peer is told (an Ethernet ack status names these).
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Rejection::Stale => {
                "no live registration has the handle's id there (a stale handle: the memory \
                 was deregistered, perhaps re-registered at the same address)"
            }
            Rejection::OutOfRange => "the range lies outside the registration",
            Rejection::WrongTransport => "the registration is not registered for this transport",
        }
    }
}

/// The live local registration `id`, if `addr..addr+len` lies inside it and it is registered
/// for `transport`. The returned memory keeps the allocation alive while the caller uses it.
pub(crate) fn find_registration(
    id: u64,
    addr: u64,
    len: u64,
    transport: Transport,
) -> std::result::Result<RegisteredMemory, Rejection> {
    let inner = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .and_then(|e| e.mem.upgrade())
        .ok_or(Rejection::Stale)?;
    if !inner.transports.has(transport) {
        return Err(Rejection::WrongTransport);
    }
    let end = addr.checked_add(len).ok_or(Rejection::OutOfRange)?;
    if addr < inner.original_ptr || end > inner.original_ptr + inner.size as u64 {
        return Err(Rejection::OutOfRange);
    }
    Ok(RegisteredMemory { inner })
}

/// A fresh registration id: random (std's randomly keyed SipHash over a counter and the
/// clock; no crate of the workspace offers OS randomness to core), never 0, not in use here.
fn fresh_registration_id(map: &BTreeMap<u64, RegistryEntry>) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u64(pid_hash());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        let id = h.finish();
        if id != 0 && !map.contains_key(&id) {
            return id;
        }
    }
}

/// A live local registration covering `addr..addr+len` for `transport`, if any. The returned
/// memory keeps the allocation alive while the caller uses it.
pub(crate) fn find_local(addr: u64, len: u64, transport: Transport) -> Option<RegisteredMemory> {
    let end = addr.checked_add(len)?;
    let map = registry().lock().unwrap_or_else(|p| p.into_inner());
    map.values()
        .filter(|e| e.transports.has(transport) && e.start <= addr && end <= e.start + e.len)
        .find_map(|e| e.mem.upgrade())
        .map(|inner| RegisteredMemory { inner })
}

impl RegisteredMemory {
    /// The host address of `addr` (an address of this registration in this process) when the
    /// host can load and store there directly: memory of a host-addressable device, and
    /// host-mapped GPU memory this process owns (see `Allocation::host_address`); `None` when
    /// the GPU backend has to copy. The Ethernet threads use it to make no GPU call for such
    /// memory (a GPU copy waits behind whatever the application's threads block on in the
    /// driver; connection/ethernet).
    pub(crate) fn host_address(&self, addr: u64) -> Option<*mut u8> {
        match &self.inner.local {
            Some((alloc, _)) => alloc.host_address(addr),
            None => host_addressable(self.inner.device).then_some(addr as usize as *mut u8),
        }
    }

    /// Registers `size` bytes at `offset` of `alloc` for `transports` (used by the context).
    pub(crate) fn register_local(
        alloc: Arc<Allocation>,
        offset: u64,
        size: usize,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        let mut infos = Vec::new();
        let mut ib_mrs = Vec::new();
        for t in transports.iter().filter(|t| t.is_ib()) {
            // SAFETY: the region is stored in the returned memory next to the `Arc` of the
            // allocation and dropped before it (field order of RegInner).
            let mr = unsafe { crate::ib::mr::register(t, &alloc, offset, size) }?;
            infos.push((t, mr.info()));
            ib_mrs.push(mr);
        }
        let original_ptr = alloc.ptr() + offset;
        // The exports below may take time (driver calls): not under the registry's lock.
        let id = fresh_registration_id(&registry().lock().unwrap_or_else(|p| p.into_inner()));
        let mut live_local = None;
        if transports.has(Transport::CudaIpc) {
            let (backend, desc) = alloc.export()?;
            let slot = liveness::LocalSlot::new(id)?;
            infos.push((
                Transport::CudaIpc,
                encode_ipc_info(
                    backend,
                    offset,
                    &desc.to_bytes(),
                    slot.index(),
                    slot.table_descriptor(),
                ),
            ));
            live_local = Some(slot);
        }
        let inner = Arc::new(RegInner {
            _live_local: live_local,
            live_remote: None,
            id,
            original_ptr,
            size,
            transports,
            device: alloc.device(),
            host_hash: local_host_hash(),
            pid_hash: pid_hash(),
            data: original_ptr,
            ib_mrs,
            local: Some((alloc, offset)),
            _imported: None,
            infos,
            registered_here: true,
        });
        let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(&id) {
            // Two registrations drew the same random id in the same instant: never seen.
            return Err(Error::Internal(format!(
                "registration id {id:#x} drawn twice; register again"
            )));
        }
        map.insert(
            id,
            RegistryEntry {
                start: original_ptr,
                len: size as u64,
                transports,
                mem: Arc::downgrade(&inner),
            },
        );
        Ok(RegisteredMemory { inner })
    }

    /// Whether the memory this registration names is still there: always for memory this
    /// library allocated and for imports; for the application's own memory registered here,
    /// while the allocation at its address is the one registered (not freed and allocated
    /// again; one driver query).
    pub fn is_current(&self) -> bool {
        self.inner
            .local
            .as_ref()
            .is_none_or(|(alloc, _)| alloc.is_current())
    }

    /// The registration id (see "Identity" in the module docs).
    pub fn registration_id(&self) -> u64 {
        self.inner.id
    }

    /// `Ok` unless this is an import whose registration the owner has dropped since (a
    /// stale handle); `op` names the caller in the error.
    pub fn check_live(&self, op: &str) -> Result<()> {
        match &self.inner.live_remote {
            Some(s) => s.check(&format!(
                "{op}: destination {:#x} (+{} bytes)",
                self.inner.original_ptr, self.inner.size
            )),
            None => Ok(()),
        }
    }

    /// The address usable in this process: the original pointer in the owning process, the
    /// mapped import on the same host, 0 when the memory is only reachable remotely.
    pub fn data(&self) -> u64 {
        self.inner.data
    }
    /// The address in the owning process (remote transports address the memory by it).
    pub fn original_data_ptr(&self) -> u64 {
        self.inner.original_ptr
    }
    /// Registered bytes.
    pub fn size(&self) -> usize {
        self.inner.size
    }
    /// The transports the memory is reachable over.
    pub fn transports(&self) -> TransportFlags {
        self.inner.transports
    }
    /// The device the memory lives on (in the owning process).
    pub fn device(&self) -> Device {
        self.inner.device
    }
    /// The owner's host hash.
    pub fn host_hash(&self) -> u64 {
        self.inner.host_hash
    }
    /// The owner's pid hash.
    pub fn pid_hash(&self) -> u64 {
        self.inner.pid_hash
    }
    /// Whether this process owns the memory (it was registered here, or deserialized in the
    /// process that registered it).
    pub fn is_local(&self) -> bool {
        self.inner.local.is_some()
    }
    /// The per-transport blob carried for `transport` (CudaIpc's export; IB's keys).
    pub fn transport_info(&self, transport: Transport) -> Option<&[u8]> {
        self.inner
            .infos
            .iter()
            .find(|(t, _)| *t == transport)
            .map(|(_, b)| b.as_slice())
    }

    /// How this process registered the memory with IB transport `t` (dma-buf through mlx5 Data
    /// Direct, dma-buf, or plain `ibv_reg_mr`); `None` for a transport it was not registered
    /// with here (or a deserialized copy).
    pub fn ib_registration_path(&self, t: Transport) -> Option<crate::ib::RegPath> {
        self.inner
            .ib_mrs
            .iter()
            .find(|m| m.transport == t)
            .map(|m| m.path)
    }

    /// The local key of this process's memory region for IB transport `t` (registrations
    /// made here only; a copy deserialized in the owning process has none).
    pub(crate) fn ib_lkey(&self, t: Transport) -> Option<u32> {
        self.inner
            .ib_mrs
            .iter()
            .find(|m| m.transport == t)
            .map(|m| m.mr.lkey())
    }

    /// Encodes the memory (see the module docs for the format).
    pub fn serialize(&self) -> Vec<u8> {
        let i = &self.inner;
        let mut w = Writer::new(MAGIC, VERSION);
        w.u64(i.original_ptr)
            .u64(i.size as u64)
            .u32(i.transports.bits())
            .u8(match i.device.kind {
                DeviceType::Cpu => 0,
                DeviceType::Gpu => 1,
            })
            .i32(i.device.id)
            .u64(i.host_hash)
            .u64(i.pid_hash)
            .u64(i.id)
            .u8(i.infos.len() as u8);
        for (t, blob) in &i.infos {
            w.u8(t.to_u8()).blob(blob);
        }
        w.finish()
    }

    /// Decodes a memory; in the owning process reuses the pointer, on the same host imports
    /// the CudaIpc export, elsewhere returns a remote-only memory. Malformed input, an
    /// allocation that is gone, or a failed import are errors.
    pub fn deserialize(bytes: &[u8]) -> Result<RegisteredMemory> {
        let mut r = Reader::new("registered memory", bytes, MAGIC, VERSION)?;
        let original_ptr = r.u64("original pointer")?;
        let size64 = r.u64("size")?;
        if size64 == 0 {
            return Err(r.bad("size", "a size above 0", 0));
        }
        if original_ptr.checked_add(size64).is_none() {
            return Err(r.bad(
                "size",
                "pointer + size without overflow",
                format!("{original_ptr:#x} + {size64}"),
            ));
        }
        let size =
            usize::try_from(size64).map_err(|_| r.bad("size", "a size that fits usize", size64))?;
        let transports = TransportFlags::from_bits(r.u32("transports")?)?;
        if transports.has(Transport::Unknown) {
            return Err(r.bad("transports", "no Unknown transport", "Unknown"));
        }
        let kind = r.u8("device kind")?;
        let id = r.i32("device id")?;
        let device = decode_device(&r, kind, id)?;
        let host_hash = r.u64("host hash")?;
        let pid_hash_v = r.u64("pid hash")?;
        let id = r.u64("registration id")?;
        if id == 0 {
            return Err(r.bad("registration id", "a registration id other than 0", 0));
        }
        let count = r.u8("transport info count")? as usize;
        if count > transports.count() {
            return Err(r.bad(
                "transport info count",
                &format!("at most {} (one per transport)", transports.count()),
                count,
            ));
        }
        let mut infos: Vec<(Transport, Vec<u8>)> = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Transport::from_u8(r.u8("info transport")?)?;
            if !transports.has(t) {
                return Err(r.bad("info transport", "a transport of the set", t));
            }
            if infos.iter().any(|(x, _)| *x == t) {
                return Err(r.bad("info transport", "each transport once", t));
            }
            let blob = r.blob("transport info", MAX_TRANSPORT_PAYLOAD)?.to_vec();
            infos.push((t, blob));
        }
        r.finish()?;
        let ipc = match infos.iter().find(|(t, _)| *t == Transport::CudaIpc) {
            Some((_, blob)) => Some(decode_ipc_info(blob, size64)?),
            None => None,
        };
        if transports.has(Transport::CudaIpc) != ipc.is_some() {
            return Err(Error::invalid(format!(
                "registered memory: CudaIpc in transports ({}) but export info {}",
                transports.has(Transport::CudaIpc),
                if ipc.is_some() { "present" } else { "absent" }
            )));
        }

        // Same process: the live registration with that id.
        if host_hash == local_host_hash() && pid_hash_v == pid_hash() {
            let stale = || {
                Error::invalid(format!(
                    "registered memory {original_ptr:#x} (+{size} bytes) was registered by this \
                     process as registration {id:#x}, which is no longer live (a stale handle); \
                     expected a live registration"
                ))
            };
            let inner = registry()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .and_then(|e| e.mem.upgrade())
                .ok_or_else(stale)?;
            let found = RegisteredMemory { inner };
            // Every field, the transport blobs included, must be the registration's own.
            if found.serialize() != bytes {
                return Err(Error::invalid(format!(
                    "registered memory: registration {id:#x} of this process is {:#x} (+{} \
                     bytes, {:?}, {:?}); expected the handle to describe it exactly, got a \
                     different one ({original_ptr:#x}, +{size} bytes, {transports:?}, {device:?})",
                    found.inner.original_ptr,
                    found.inner.size,
                    found.inner.transports,
                    found.inner.device
                )));
            }
            return Ok(found);
        }

        // Same host with CudaIpc: check the owner still holds the registration, map the export.
        let mut live_remote = None;
        let (data, imported) = match ipc {
            Some((backend, offset, desc, slot, table)) if host_hash == local_host_hash() => {
                live_remote = Some(liveness::RemoteSlot::import(
                    &table,
                    slot,
                    id,
                    &format!("registered memory {original_ptr:#x} (+{size} bytes)"),
                )?);
                let (base, len, hold): (u64, usize, Box<dyn Any + Send + Sync>) = match backend {
                    BackendTag::Host => {
                        let dev = host_device()?;
                        let m = Host::import(&dev, &desc)
                            .map_err(|e| hal_err("import host memory", e))?;
                        (m.device_ptr(), m.size(), Box::new(m))
                    }
                    BackendTag::Gpu => {
                        let dev = gpu_device(default_gpu())?;
                        let m = Gpu::import(&dev, &desc)
                            .map_err(|e| hal_err("import GPU memory", e))?;
                        (m.device_ptr(), m.size(), Box::new(m))
                    }
                };
                if offset
                    .checked_add(size64)
                    .is_none_or(|end| end > len as u64)
                {
                    return Err(Error::invalid(format!(
                        "registered memory: range offset {offset} + {size} bytes outside the \
                         {len}-byte imported mapping"
                    )));
                }
                (base + offset, Some(hold))
            }
            _ => (0, None),
        };
        Ok(RegisteredMemory {
            inner: Arc::new(RegInner {
                _live_local: None,
                live_remote,
                id,
                original_ptr,
                size,
                transports,
                device,
                host_hash,
                pid_hash: pid_hash_v,
                data,
                ib_mrs: Vec::new(),
                local: None,
                _imported: imported,
                infos,
                registered_here: false,
            }),
        })
    }
}

fn encode_ipc_info(
    backend: BackendTag,
    offset: u64,
    desc: &[u8],
    slot: u32,
    table: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(21 + desc.len() + table.len());
    out.push(backend as u8);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(desc);
    out.extend_from_slice(&slot.to_le_bytes());
    out.extend_from_slice(&(table.len() as u32).to_le_bytes());
    out.extend_from_slice(table);
    out
}

/// A decoded CudaIpc info: backend, offset in the export, the export, liveness slot, table.
pub(crate) type IpcInfo = (BackendTag, u64, IpcDescriptor, u32, Vec<u8>);

/// Decodes a CudaIpc info blob (see the module docs) for a range of `size` bytes.
pub(crate) fn decode_ipc_info(b: &[u8], size: u64) -> Result<IpcInfo> {
    let bad = |what: String| Error::invalid(format!("registered memory: CudaIpc info: {what}"));
    let u32_at = |at: usize| -> Option<u32> {
        b.get(at..at.checked_add(4)?)
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
    };
    if b.len() < 13 {
        return Err(bad(format!("expected at least 13 bytes, got {}", b.len())));
    }
    let backend = match b[0] {
        0 => BackendTag::Host,
        1 => BackendTag::Gpu,
        x => {
            return Err(bad(format!(
                "expected backend 0 (host) or 1 (GPU), got {x}"
            )))
        }
    };
    let mut o = [0u8; 8];
    o.copy_from_slice(&b[1..9]);
    let offset = u64::from_le_bytes(o);
    let n = u32::from_le_bytes([b[9], b[10], b[11], b[12]]) as usize;
    let desc_end = 13usize.saturating_add(n);
    let (Some(slot), Some(table_len)) = (u32_at(desc_end), u32_at(desc_end.saturating_add(4)))
    else {
        return Err(bad(format!(
            "expected {n} descriptor bytes and a liveness slot and table length after them, \
             got {} bytes in all",
            b.len()
        )));
    };
    let table_at = desc_end + 8;
    if b.len() - table_at != table_len as usize {
        return Err(bad(format!(
            "expected {table_len} liveness table bytes, got {}",
            b.len() - table_at
        )));
    }
    let desc = IpcDescriptor::from_bytes(&b[13..desc_end])
        .map_err(|e| bad(format!("descriptor: expected a valid IPC descriptor: {e}")))?;
    if offset.checked_add(size).is_none_or(|end| end > desc.size) {
        return Err(bad(format!(
            "range offset {offset} + {size} bytes outside the {}-byte export",
            desc.size
        )));
    }
    Ok((backend, offset, desc, slot, b[table_at..].to_vec()))
}
