//! Registered memory: a range of a live allocation made reachable over a set of transports,
//! and its explicit wire format.
//!
//! Wire format (little endian), version 1, inside the [`crate::serialize`] envelope (magic
//! `MREG`):
//!
//! | field | type |
//! |---|---|
//! | original pointer | u64 (the address in the owning process) |
//! | size | u64 (> 0; pointer + size must not overflow) |
//! | transports | u32 ([`TransportFlags::bits`]) |
//! | device kind, device id | u8, i32 (as in endpoints) |
//! | host hash, pid hash | u64, u64 |
//! | transport infos | u8 count, then per info: transport u8, u32 length (<= 4096), bytes |
//!
//! Each transport in the set carries at most one info blob. CudaIpc: `backend u8 (0 host, 1
//! GPU) | offset of the range inside the exported allocation u64 | IPC descriptor blob`
//! ([`mscclpp_hal::IpcDescriptor`]); it is present exactly when CudaIpc is in the set. IB
//! transports carry their own blob (address, length, rkey; see [`crate::ib`]), opaque to this
//! layer, and a local registration owns one memory region per IB transport; Ethernet needs
//! none (the peer addresses the memory by its original pointer).
//!
//! Deserializing in the owning process reuses the pointer; on the same host with CudaIpc it
//! imports the export through the HAL (the fd is fetched from the exporter's fd server and
//! closed when the last clone of the import drops); elsewhere the memory is reachable only
//! remotely and [`RegisteredMemory::data`] is 0.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp_hal::api::Host;
use mscclpp_hal::{prelude::*, Buffer, Gpu, IpcDescriptor};

use crate::error::{Error, Result};
use crate::identity::{local_host_hash, pid_hash};
use crate::memory::{default_gpu, gpu_device, hal_err, host_device, Allocation, BackendTag};
use crate::serialize::{decode_device, Reader, Writer, MAX_TRANSPORT_PAYLOAD};
use crate::transport::{Device, DeviceType, Transport, TransportFlags};

const MAGIC: &[u8; 4] = b"MREG";
const VERSION: u16 = 1;

/// Memory registered with a [`crate::Context`], or received from a peer. Cheap to clone.
#[derive(Clone)]
pub struct RegisteredMemory {
    inner: Arc<RegInner>,
}

struct RegInner {
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
    /// Entry in the registry of local memories (removed on drop).
    registry_id: Option<u64>,
}

impl Drop for RegInner {
    fn drop(&mut self) {
        if let Some(id) = self.registry_id {
            registry()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
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

static NEXT_REGISTRY_ID: AtomicU64 = AtomicU64::new(1);

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
            let mr =
                unsafe { crate::ib::mr::register(t, alloc.ptr() + offset, size, alloc.device()) }?;
            infos.push((t, mr.info()));
            ib_mrs.push(mr);
        }
        if transports.has(Transport::CudaIpc) {
            let (backend, desc) = alloc.export()?;
            infos.push((
                Transport::CudaIpc,
                encode_ipc_info(backend, offset, &desc.to_bytes()),
            ));
        }
        Ok(RegisteredMemory::with_local(
            alloc.ptr() + offset,
            size,
            transports,
            alloc.device(),
            local_host_hash(),
            pid_hash(),
            (alloc, offset),
            infos,
            ib_mrs,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn with_local(
        original_ptr: u64,
        size: usize,
        transports: TransportFlags,
        device: Device,
        host_hash: u64,
        pid_hash: u64,
        local: (Arc<Allocation>, u64),
        infos: Vec<(Transport, Vec<u8>)>,
        ib_mrs: Vec<crate::ib::mr::IbMr>,
    ) -> RegisteredMemory {
        let id = NEXT_REGISTRY_ID.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(RegInner {
            original_ptr,
            size,
            transports,
            device,
            host_hash,
            pid_hash,
            data: original_ptr,
            ib_mrs,
            local: Some(local),
            _imported: None,
            infos,
            registry_id: Some(id),
        });
        registry().lock().unwrap_or_else(|p| p.into_inner()).insert(
            id,
            RegistryEntry {
                start: original_ptr,
                len: size as u64,
                transports,
                mem: Arc::downgrade(&inner),
            },
        );
        RegisteredMemory { inner }
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

        // Same process: reuse the pointer of the live allocation.
        if host_hash == local_host_hash() && pid_hash_v == pid_hash() {
            let (alloc, offset) =
                crate::memory::find_allocation(original_ptr, size).ok_or_else(|| {
                    Error::invalid(format!(
                        "registered memory {original_ptr:#x} (+{size} bytes) was registered by \
                         this process but is no longer allocated"
                    ))
                })?;
            return Ok(RegisteredMemory::with_local(
                original_ptr,
                size,
                transports,
                device,
                host_hash,
                pid_hash_v,
                (alloc, offset),
                infos,
                Vec::new(),
            ));
        }

        // Same host with CudaIpc: map the export.
        let (data, imported) = match ipc {
            Some((backend, offset, desc)) if host_hash == local_host_hash() => {
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
                registry_id: None,
            }),
        })
    }
}

fn encode_ipc_info(backend: BackendTag, offset: u64, desc: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + desc.len());
    out.push(backend as u8);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(desc);
    out
}

fn decode_ipc_info(b: &[u8], size: u64) -> Result<(BackendTag, u64, IpcDescriptor)> {
    let bad = |what: String| Error::invalid(format!("registered memory: CudaIpc info: {what}"));
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
    if b.len() - 13 != n {
        return Err(bad(format!(
            "expected {n} descriptor bytes, got {}",
            b.len() - 13
        )));
    }
    let desc = IpcDescriptor::from_bytes(&b[13..]).map_err(|e| bad(format!("descriptor: {e}")))?;
    if offset.checked_add(size).is_none_or(|end| end > desc.size) {
        return Err(bad(format!(
            "range offset {offset} + {size} bytes outside the {}-byte export",
            desc.size
        )));
    }
    Ok((backend, offset, desc))
}
