//! Memory the library can register and share: owners of HAL allocations on the CPU (host
//! backend, memfd mappings) or on a GPU (the build's GPU backend).
//!
//! Every [`LocalMemory`] is entered in a process-wide registry of live allocations, so
//! [`crate::Context::register_memory`] can take a plain address, find the allocation that
//! contains it and export it for IPC. Registration keeps the allocation alive, so a
//! [`crate::RegisteredMemory`] never outlives the memory it names.
//!
//! Memory the application allocated itself (`cudaMalloc`, cuMem/VMM, a PyTorch tensor, a host
//! memfd mapping) is adopted through the HAL ([`IpcApi::adopt`]): the allocation behind the
//! pointer is found and wrapped without being owned. Adoptions are cached by base address,
//! but a hit needs the same [`AllocationIdentity`] (CUDA's buffer id, the host mapping's
//! file): memory freed and allocated again at the same address is adopted afresh. The
//! application keeps such memory alive while registrations of it are used.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp_hal::api::Host;
use mscclpp_hal::{prelude::*, AllocationIdentity, Buffer, Gpu, IpcDescriptor, MemoryKind};

use crate::error::{Error, Result};
use crate::transport::{Device, DeviceType};

/// Converts a HAL error into this crate's error, naming the operation.
pub(crate) fn hal_err(op: &str, e: mscclpp_hal::Error) -> Error {
    Error::Hal {
        op: op.to_string(),
        source: e,
    }
}

/// Whether the host can touch memory of `device` directly: the CPU's, and every memory of a
/// GPU backend whose "device" memory is host memory ([`Api::HOST_ADDRESSABLE`]).
pub(crate) fn host_addressable(device: Device) -> bool {
    device.kind == DeviceType::Cpu || <Gpu as Api>::HOST_ADDRESSABLE
}

/// Which backend an allocation (or an IPC export) belongs to; the wire value in serialized
/// memories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackendTag {
    Host = 0,
    Gpu = 1,
}

pub(crate) enum Backing {
    Host(<Host as Api>::Device, <Host as Api>::Memory),
    Gpu(<Gpu as Api>::Device, <Gpu as Api>::Memory),
}

/// One live HAL allocation, or an adopted one of the application's.
pub(crate) struct Allocation {
    device: Device,
    ptr: u64,
    size: usize,
    backing: Backing,
    /// `Some` for adopted memory: its identity when adopted.
    foreign: Option<AllocationIdentity>,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // Leave the registry before the memory is freed (the fields drop after this body).
        if self.foreign.is_some() {
            let mut map = foreign_allocs().lock().unwrap_or_else(|p| p.into_inner());
            if map
                .get(&self.ptr)
                .is_some_and(|(id, w)| Some(*id) == self.foreign && w.strong_count() == 0)
            {
                map.remove(&self.ptr);
            }
            return;
        }
        let mut map = allocs().lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&self.ptr).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.ptr);
        }
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Allocation({:?}, {:#x}, {} bytes)",
            self.device, self.ptr, self.size
        )
    }
}

impl Allocation {
    pub(crate) fn device(&self) -> Device {
        self.device
    }
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Bytes of the allocation.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
    /// The HAL allocation behind it.
    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Whether the memory at the allocation's address is still the memory it names: always
    /// for this library's allocations (they live while this does); for adopted memory, while
    /// the backend reports the same identity there (the application may have freed it and
    /// allocated other memory at the same address).
    pub(crate) fn is_current(&self) -> bool {
        let Some(id) = self.foreign else {
            return true;
        };
        match &self.backing {
            Backing::Gpu(dev, _) => Gpu::identity(dev, self.ptr, 1).is_ok_and(|now| now == id),
            Backing::Host(dev, _) => Host::identity(dev, self.ptr, 1).is_ok_and(|now| now == id),
        }
    }

    /// The host address of the allocation's device address `addr` when the host can load and
    /// store there directly without the GPU backend: host memory (the CPU's, or a backend whose
    /// device memory is host memory) and host-mapped GPU memory (`MemoryKind::HostMapped`,
    /// whose host and device addresses may differ). `None` for device memory, or when `addr`
    /// lies outside the allocation.
    pub(crate) fn host_address(&self, addr: u64) -> Option<*mut u8> {
        let off = addr.checked_sub(self.ptr)?;
        if off >= self.size as u64 {
            return None;
        }
        if host_addressable(self.device) {
            return Some(addr as usize as *mut u8);
        }
        let base = match &self.backing {
            Backing::Host(_, m) => m.host_ptr(),
            Backing::Gpu(_, m) => m.host_ptr(),
        }?;
        // In bounds (checked above).
        Some(base.wrapping_add(off as usize))
    }

    /// Exports the whole allocation with the backend's preferred IPC kind.
    pub(crate) fn export(&self) -> Result<(BackendTag, IpcDescriptor)> {
        match &self.backing {
            Backing::Host(_, mem) => {
                let kind = Host::ipc_kinds(mem).into_iter().next().ok_or_else(|| {
                    Error::invalid("host memory offers no IPC kind to export".to_string())
                })?;
                let desc = Host::export(mem, kind).map_err(|e| hal_err("export host memory", e))?;
                Ok((BackendTag::Host, desc))
            }
            Backing::Gpu(_, mem) => {
                let kind = Gpu::ipc_kinds(mem).into_iter().next().ok_or_else(|| {
                    Error::invalid(format!(
                        "GPU memory at {:#x} offers no IPC kind to export (allocate it with \
                         MemoryKind::Device or Physical)",
                        self.ptr
                    ))
                })?;
                let desc = Gpu::export(mem, kind).map_err(|e| hal_err("export GPU memory", e))?;
                Ok((BackendTag::Gpu, desc))
            }
        }
    }
}

fn allocs() -> &'static Mutex<BTreeMap<u64, Weak<Allocation>>> {
    static MAP: OnceLock<Mutex<BTreeMap<u64, Weak<Allocation>>>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// The live allocation containing `ptr..ptr+size`, and the offset of `ptr` inside it.
pub(crate) fn find_allocation(ptr: u64, size: usize) -> Option<(Arc<Allocation>, u64)> {
    let map = allocs().lock().unwrap_or_else(|p| p.into_inner());
    let (_, weak) = map.range(..=ptr).next_back()?;
    let alloc = weak.upgrade()?;
    let offset = ptr - alloc.ptr;
    let end = offset.checked_add(size as u64)?;
    (end <= alloc.size as u64).then_some((alloc, offset))
}

type ForeignMap = BTreeMap<u64, (AllocationIdentity, Weak<Allocation>)>;

/// Adopted allocations by base address (see the module doc).
fn foreign_allocs() -> &'static Mutex<ForeignMap> {
    static MAP: OnceLock<Mutex<ForeignMap>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// The application's allocation holding `ptr..ptr+size` on the current GPU (the build's GPU
/// backend; on the host backend a shared host mapping), adopted through the HAL, and the offset
/// of `ptr` in it. A live earlier adoption with the same identity is reused.
pub(crate) fn adopt_allocation(ptr: u64, size: usize) -> Result<(Arc<Allocation>, u64)> {
    let device = Device::gpu(default_gpu());
    let dev = gpu_device(device.id)?;
    let what = || format!("register {ptr:#x} (+{size} bytes)");
    let id = Gpu::identity(&dev, ptr, size).map_err(|e| hal_err(&what(), e))?;
    let reuse = |map: &ForeignMap| {
        map.get(&id.base)
            .filter(|(known, _)| *known == id)
            .and_then(|(_, w)| w.upgrade())
    };
    if let Some(a) = reuse(&foreign_allocs().lock().unwrap_or_else(|p| p.into_inner())) {
        return Ok((a, ptr - id.base));
    }
    // Adopt outside the lock (driver calls, /proc reads).
    let (mem, id) = Gpu::adopt(&dev, ptr, size).map_err(|e| hal_err(&what(), e))?;
    let mut map = foreign_allocs().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(a) = reuse(&map) {
        return Ok((a, ptr - id.base));
    }
    let alloc = Arc::new(Allocation {
        device,
        ptr: id.base,
        size: mem.size(),
        backing: Backing::Gpu(dev, mem),
        foreign: Some(id),
    });
    map.insert(id.base, (id, Arc::downgrade(&alloc)));
    Ok((alloc, ptr - id.base))
}

/// Live adoptions (for tests).
pub fn adopted_allocations() -> usize {
    foreign_allocs()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter(|(_, w)| w.strong_count() > 0)
        .count()
}

static LAST_GPU: AtomicI64 = AtomicI64::new(-1);

/// The GPU this process used last (for allocations or endpoints), 0 if none yet. Imports of
/// GPU memory are mapped on it.
pub(crate) fn default_gpu() -> i32 {
    LAST_GPU.load(Ordering::Relaxed).max(0) as i32
}

/// Opens (once per process) the backend device of `device`.
#[allow(clippy::clone_on_copy)] // the GPU device type is Copy on the host backend only
pub(crate) fn gpu_device(id: i32) -> Result<<Gpu as Api>::Device> {
    static DEVS: OnceLock<Mutex<HashMap<i32, <Gpu as Api>::Device>>> = OnceLock::new();
    let ordinal = usize::try_from(id)
        .map_err(|_| Error::invalid(format!("GPU id {id}: expected a non-negative ordinal")))?;
    let mut map = DEVS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&id) {
        Gpu::set_current(d).map_err(|e| hal_err("set current GPU", e))?;
        return Ok(d.clone());
    }
    let d = Gpu::open_device(ordinal).map_err(|e| hal_err(&format!("open GPU {id}"), e))?;
    LAST_GPU.store(i64::from(id), Ordering::Relaxed);
    map.insert(id, d.clone());
    Ok(d)
}

/// The host backend's one device.
pub(crate) fn host_device() -> Result<<Host as Api>::Device> {
    static DEV: OnceLock<<Host as Api>::Device> = OnceLock::new();
    if let Some(d) = DEV.get() {
        return Ok(*d);
    }
    let d = Host::open_device(0).map_err(|e| hal_err("open host device", e))?;
    Ok(*DEV.get_or_init(|| d))
}

/// A buffer named by a raw address, so the HAL's copy functions can reach memory found
/// through the registries (an allocation or an imported mapping that the caller keeps alive).
pub(crate) struct RawBuf {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) host: bool,
}

impl Buffer for RawBuf {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.len
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        self.host.then_some(self.ptr as usize as *mut u8)
    }
}

/// Copies `bytes` to `dst` on `device`.
///
/// # Safety
/// `dst..dst+bytes.len()` must be live memory of `device` (an allocation or a mapping the
/// caller keeps alive for the call) that no Rust reference aliases.
pub(crate) unsafe fn write_to(device: Device, dst: u64, bytes: &[u8]) -> Result<()> {
    match device.kind {
        DeviceType::Cpu => {
            // SAFETY: the caller guarantees the destination range is live host memory.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as usize as *mut u8, bytes.len())
            };
            Ok(())
        }
        DeviceType::Gpu => {
            let dev = gpu_device(device.id)?;
            let buf = RawBuf {
                ptr: dst,
                len: bytes.len(),
                host: Gpu::NAME == Host::NAME,
            };
            Gpu::write(&dev, &buf, 0, bytes).map_err(|e| hal_err("copy to GPU memory", e))
        }
    }
}

/// Reads `len` bytes at `src` on `device`.
///
/// # Safety
/// `src..src+len` must be live memory of `device` that the caller keeps alive for the call.
pub(crate) unsafe fn read_from(device: Device, src: u64, len: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len];
    match device.kind {
        DeviceType::Cpu => {
            // SAFETY: the caller guarantees the source range is live host memory.
            unsafe { std::ptr::copy(src as usize as *const u8, out.as_mut_ptr(), len) };
        }
        DeviceType::Gpu => {
            let dev = gpu_device(device.id)?;
            let buf = RawBuf {
                ptr: src,
                len,
                host: Gpu::NAME == Host::NAME,
            };
            Gpu::read(&dev, &buf, 0, &mut out).map_err(|e| hal_err("copy from GPU memory", e))?;
        }
    }
    Ok(out)
}

/// Memory owned by this process on the CPU (host backend) or a GPU, zero-filled at
/// allocation. Cloning shares the allocation; it is freed when the last clone and the last
/// [`crate::RegisteredMemory`] of it are gone.
#[derive(Clone, Debug)]
pub struct LocalMemory {
    alloc: Arc<Allocation>,
}

impl LocalMemory {
    /// Allocates `size` zeroed bytes of plain device memory on `device`.
    pub fn alloc(device: Device, size: usize) -> Result<LocalMemory> {
        LocalMemory::alloc_kind(device, size, MemoryKind::Device)
    }

    /// Allocates `size` zeroed bytes of memory `kind` on `device` (`Device::CPU`: host backend
    /// memfd memory; `Device::gpu(i)`: the build's GPU backend).
    pub fn alloc_kind(device: Device, size: usize, kind: MemoryKind) -> Result<LocalMemory> {
        if size == 0 {
            return Err(Error::invalid(format!(
                "allocating on {device:?}: expected a size above 0, got 0"
            )));
        }
        let backing = match device.kind {
            DeviceType::Cpu => {
                let dev = host_device()?;
                let mem = Host::alloc(&dev, size, kind)
                    .map_err(|e| hal_err(&format!("allocate {size} host bytes"), e))?;
                Backing::Host(dev, mem)
            }
            DeviceType::Gpu => {
                let dev = gpu_device(device.id)?;
                LAST_GPU.store(i64::from(device.id), Ordering::Relaxed);
                let mem = Gpu::alloc(&dev, size, kind).map_err(|e| {
                    hal_err(&format!("allocate {size} bytes on GPU {}", device.id), e)
                })?;
                Gpu::memset(&dev, &mem, 0, 0, size)
                    .map_err(|e| hal_err("zero new GPU memory", e))?;
                Backing::Gpu(dev, mem)
            }
        };
        let ptr = match &backing {
            Backing::Host(_, m) => m.device_ptr(),
            Backing::Gpu(_, m) => m.device_ptr(),
        };
        let alloc = Arc::new(Allocation {
            device,
            ptr,
            size,
            backing,
            foreign: None,
        });
        allocs()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr, Arc::downgrade(&alloc));
        Ok(LocalMemory { alloc })
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.alloc.device
    }
    /// The device address (on the CPU: the host address).
    pub fn ptr(&self) -> u64 {
        self.alloc.ptr
    }
    /// Usable bytes.
    pub fn size(&self) -> usize {
        self.alloc.size
    }
    /// The host address when the host can touch the memory directly.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match &self.alloc.backing {
            Backing::Host(_, m) => m.host_ptr(),
            Backing::Gpu(_, m) => m.host_ptr(),
        }
    }

    /// Copies `bytes` into the memory at `offset`.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        check_range("LocalMemory::write", self.size(), offset, bytes.len())?;
        match &self.alloc.backing {
            Backing::Host(d, m) => {
                Host::write(d, m, offset, bytes).map_err(|e| hal_err("write host memory", e))
            }
            Backing::Gpu(d, m) => {
                Gpu::write(d, m, offset, bytes).map_err(|e| hal_err("write GPU memory", e))
            }
        }
    }

    /// Copies `out.len()` bytes at `offset` out of the memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range("LocalMemory::read", self.size(), offset, out.len())?;
        match &self.alloc.backing {
            Backing::Host(d, m) => {
                Host::read(d, m, offset, out).map_err(|e| hal_err("read host memory", e))
            }
            Backing::Gpu(d, m) => {
                Gpu::read(d, m, offset, out).map_err(|e| hal_err("read GPU memory", e))
            }
        }
    }

    /// The whole contents.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.size()];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Reads the little-endian u64 at `offset`.
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub(crate) fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }
}

/// Checks that `offset..offset+len` lies inside `size` bytes.
pub(crate) fn check_range(op: &str, size: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid(format!(
            "{op}: expected a range inside {size} bytes, got offset {offset} + length {len}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_address_covers_exactly_the_allocation() {
        let m = LocalMemory::alloc(Device::CPU, 4096).unwrap();
        let a = m.allocation();
        assert_eq!(a.host_address(m.ptr()), Some(m.ptr() as usize as *mut u8));
        assert_eq!(
            a.host_address(m.ptr() + 4095),
            Some((m.ptr() + 4095) as usize as *mut u8)
        );
        assert_eq!(a.host_address(m.ptr() + 4096), None);
        assert_eq!(a.host_address(m.ptr().wrapping_sub(1)), None);
        // Written through the host address, read back through the backend.
        // SAFETY: inside the live allocation `m`.
        unsafe { *a.host_address(m.ptr() + 7).unwrap() = 0x5a };
        assert_eq!(m.to_vec().unwrap()[7], 0x5a);
    }

    #[test]
    fn registry_finds_live_allocations_only() {
        let m = LocalMemory::alloc(Device::CPU, 4096).unwrap();
        let (a, off) = find_allocation(m.ptr() + 100, 200).unwrap();
        assert_eq!(a.ptr(), m.ptr());
        assert_eq!(off, 100);
        assert!(find_allocation(m.ptr() + 4000, 200).is_none());
        m.write(10, b"hello").unwrap();
        let mut b = [0u8; 5];
        m.read(10, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert!(m.write(4095, b"xx").is_err());
        let p = m.ptr();
        drop(a);
        drop(m);
        assert!(find_allocation(p, 1).is_none());
    }
}
