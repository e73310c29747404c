//! CUDA memory: cuMemAlloc (Device/Uncached), cuMemHostAlloc (HostMapped), and cuMem VMM
//! allocations (Physical) exportable as POSIX fds (and fabric handles where supported);
//! caller-owned host memory pinned and mapped with cuMemHostRegister.
//!
//! Not cudarc's pooled `alloc`: peers cannot touch stream-ordered pool memory.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>.
//! [`crate::MemoryApi`] and [`crate::HostRegisterApi`] for [`Cuda`].

use super::conv::{alloc_prop, rw_access};
use super::device::CudaDevice;
use super::result::{checked, device, mem, peer, stream, vmm};
use super::Cuda;
use crate::auxil::fdpass::FdRegistration;
use crate::auxil::registration::{HostRegistration, Unregister};
use crate::auxil::{check_host_range, check_range, deferred, register_then_map};
use crate::ipc::{check_adopt_args, not_exportable};
use crate::{AllocationIdentity, Buffer, Error, HostRegisterApi, MemoryApi, MemoryKind, Result};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Mutex;

/// What backs a [`CudaMemory`].
#[derive(Debug)]
pub(super) enum Backing {
    /// cuMemAlloc_v2.
    Linear,
    /// cuMemHostAlloc(DEVICEMAP | PORTABLE); the host pointer.
    Host(*mut u8),
    /// cuMemCreate + cuMemAddressReserve + cuMemMap.
    Physical {
        handle: sys::CUmemGenericAllocationHandle,
        mapped_len: usize,
        fabric: bool,
    },
    /// The application's cuMemAlloc/cudaMalloc memory (adopted; never freed here).
    ForeignLinear,
    /// The application's cuMem/VMM mapping (adopted): the handle retained with
    /// cuMemRetainAllocationHandle (released on drop) and the shareable types it was made with.
    ForeignVmm {
        handle: sys::CUmemGenericAllocationHandle,
        mapped_len: usize,
        fabric: bool,
        posix: bool,
    },
}

/// A CUDA allocation; dropping it frees the memory.
#[derive(Debug)]
pub struct CudaMemory {
    pub(super) dev: CudaDevice,
    pub(super) ptr: u64,
    pub(super) size: usize,
    pub(super) kind: MemoryKind,
    pub(super) backing: Backing,
    /// The POSIX-fd export of a Physical allocation, registered once and kept while it lives.
    pub(super) fd_export: Mutex<Option<FdRegistration>>,
}

// SAFETY: device memory handles and the pinned host pointer may be used from any thread.
unsafe impl Send for CudaMemory {}
// SAFETY: as above; mutation goes through the driver or the Mutex.
unsafe impl Sync for CudaMemory {}

impl CudaMemory {
    /// The kind it was allocated as.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }
    /// The device it lives on.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }
    /// Bytes mapped (Physical: size rounded up to the granularity; else `size`).
    pub fn mapped_len(&self) -> usize {
        match self.backing {
            Backing::Physical { mapped_len, .. } | Backing::ForeignVmm { mapped_len, .. } => {
                mapped_len
            }
            _ => self.size,
        }
    }
}

impl Buffer for CudaMemory {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        match self.backing {
            Backing::Host(p) => Some(p),
            _ => None,
        }
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if let Err(e) = self.dev.bind() {
            deferred::record(e);
            return;
        }
        let r = match self.backing {
            // SAFETY: ptr came from cuMemAlloc and is freed once.
            Backing::Linear => unsafe { mem::free(self.ptr) },
            // SAFETY: p came from cuMemHostAlloc and is freed once.
            Backing::Host(p) => unsafe { mem::free_host(p.cast()) },
            Backing::Physical {
                handle, mapped_len, ..
            } => unmap_release(self.ptr, mapped_len, handle),
            // The application's memory: nothing of it is ours to free.
            Backing::ForeignLinear => Ok(()),
            // SAFETY: the handle was retained once by `adopt` and is released once.
            Backing::ForeignVmm { handle, .. } => unsafe { vmm::release(handle) },
        };
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

/// Unmaps, frees the VA range and releases the handle; keeps going after a failure and
/// returns the first one.
pub(super) fn unmap_release(
    ptr: u64,
    len: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: ptr/len is a range mapped by us to `handle`; each step runs once.
    let a = unsafe { vmm::unmap(ptr, len) };
    // SAFETY: as above.
    let b = unsafe { vmm::address_free(ptr, len) };
    // SAFETY: as above.
    let c = unsafe { vmm::release(handle) };
    a.and(b).and(c)
}

/// The handle types of an exportable allocation on `dev`: POSIX fd, and the ones to ask for
/// first (POSIX fd and fabric where the device reports fabric support, else POSIX fd alone).
pub(super) fn handle_types(dev: &CudaDevice) -> (u32, u32) {
    let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
    let fabric = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
    let fabric_ok = dev
        .attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
            "cuDeviceGetAttribute(HANDLE_TYPE_FABRIC_SUPPORTED)",
        )
        .unwrap_or(0)
        != 0;
    (posix, if fabric_ok { posix | fabric } else { posix })
}

/// The cuMem properties of a pinned allocation on `dev` exportable as `handle_types`.
pub(super) fn physical_prop(dev: &CudaDevice, handle_types: u32) -> sys::CUmemAllocationProp {
    let rdma = dev
        .attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
            "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)",
        )
        .unwrap_or(0);
    alloc_prop(dev.ordinal() as i32, handle_types, rdma != 0)
}

/// The minimum cuMem granularity for `prop` (at least 1).
pub(super) fn min_granularity(prop: &sys::CUmemAllocationProp) -> Result<usize> {
    Ok(vmm::min_granularity(prop)?.max(1))
}

/// Reserves a VA range of `len` bytes aligned to `align`, maps `handle` into it and gives
/// `devices` read/write access. Undoes what it did on failure (the handle is left to the caller).
pub(super) fn map_handle(
    handle: sys::CUmemGenericAllocationHandle,
    len: usize,
    align: usize,
    devices: &[i32],
) -> Result<u64> {
    let ptr = vmm::address_reserve(len, align)?;
    // SAFETY: ptr/len was just reserved; handle is a live allocation of at least len bytes.
    if let Err(e) = unsafe { vmm::map(ptr, len, handle) } {
        // SAFETY: undo the reservation made above (its own failure is secondary).
        let _ = unsafe { vmm::address_free(ptr, len) };
        return Err(e);
    }
    let descs: Vec<sys::CUmemAccessDesc> = devices.iter().map(|id| rw_access(*id)).collect();
    // SAFETY: the range is mapped.
    if let Err(e) = unsafe { vmm::set_access(ptr, len, &descs) } {
        // SAFETY: undo the mapping and reservation made above.
        unsafe {
            let _ = vmm::unmap(ptr, len);
            let _ = vmm::address_free(ptr, len);
        }
        return Err(e);
    }
    Ok(ptr)
}

/// This device plus every device that can access it as a peer.
fn access_devices(dev: &CudaDevice) -> Vec<i32> {
    let mut ids = vec![dev.ordinal() as i32];
    let n = device::count().unwrap_or(0);
    for other in 0..n {
        if other as usize == dev.ordinal() {
            continue;
        }
        let can = device::get(other)
            .and_then(|od| peer::can_access(od, dev.cu_device()))
            .unwrap_or(false);
        if can {
            ids.push(other);
        }
    }
    ids
}

fn alloc(dev: &CudaDevice, size: usize, kind: MemoryKind) -> Result<CudaMemory> {
    if size == 0 {
        return Err(Error::invalid("alloc(cuda)", "a non-zero size", "0"));
    }
    dev.enter()?;
    let mk = |ptr, backing| CudaMemory {
        dev: dev.clone(),
        ptr,
        size,
        kind,
        backing,
        fd_export: Mutex::new(None),
    };
    match kind {
        MemoryKind::Device | MemoryKind::Uncached => Ok(mk(mem::alloc(size)?, Backing::Linear)),
        MemoryKind::HostMapped => {
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            let h = mem::host_alloc(size, flags)?;
            // SAFETY: h is a live DEVICEMAP host allocation.
            match unsafe { mem::host_device_pointer(h) } {
                Ok(d) => Ok(mk(d, Backing::Host(h.cast()))),
                Err(e) => {
                    // SAFETY: undo the allocation above.
                    let _ = unsafe { mem::free_host(h) };
                    Err(e)
                }
            }
        }
        MemoryKind::Physical { granularity } => alloc_physical(dev, size, granularity, mk),
    }
}

fn alloc_physical(
    dev: &CudaDevice,
    size: usize,
    granularity: usize,
    mk: impl Fn(u64, Backing) -> CudaMemory,
) -> Result<CudaMemory> {
    let (posix, preferred) = handle_types(dev);
    let prop = physical_prop(dev, posix);
    let min = min_granularity(&prop)?;
    let gran = if granularity == 0 { min } else { granularity };
    if gran % min != 0 {
        return Err(Error::invalid(
            "alloc(cuda, Physical)",
            format!("a granularity that is a multiple of {min}"),
            gran.to_string(),
        ));
    }
    let mapped_len = size.div_ceil(gran).checked_mul(gran).ok_or_else(|| {
        Error::invalid(
            "alloc(cuda)",
            "a size that fits when rounded",
            size.to_string(),
        )
    })?;
    // Ask for fabric + POSIX fd where fabric is reported; without IMEX that can fail, so fall
    // back to POSIX fd alone.
    let with_fabric = (preferred != posix)
        .then(|| vmm::create(mapped_len, &physical_prop(dev, preferred)).ok())
        .flatten();
    let fabric = with_fabric.is_some();
    let handle = match with_fabric {
        Some(h) => h,
        None => vmm::create(mapped_len, &prop)?,
    };
    match map_handle(handle, mapped_len, gran, &access_devices(dev)) {
        Ok(ptr) => Ok(mk(
            ptr,
            Backing::Physical {
                handle,
                mapped_len,
                fabric,
            },
        )),
        Err(e) => {
            // SAFETY: release the handle created above; nothing maps it.
            let _ = unsafe { vmm::release(handle) };
            Err(e)
        }
    }
}

/// Runs `issue` on the device's own non-blocking stream ([`CudaDevice::sync_stream`]) and waits
/// for it: the HAL promises that `memset`/`write`/`read`/`copy` return when done (a peer may
/// read the memory right after).
///
/// They never use the legacy default stream (cuMemsetD8, cuMemcpyHtoD, ...): work queued there
/// would hold them. PyTorch queues its next kernels on the legacy stream (or runs a collective
/// there) behind the collective's kernel, and that kernel may be waiting for exactly this copy
/// (the Ethernet receiver writing a peer's signal, the proxy reading a put's source). A
/// non-blocking stream waits for no other stream (hal/tests/gpu_sync_copies.rs).
/// What this cannot help: while another thread of the process is blocked in a synchronous
/// copy on the legacy stream that waits for such a kernel (PyTorch reading a result), these
/// copies wait too, pinned staging or not (measured on an H200, driver 580, 2026-12-01: 4.75 s,
/// until the kernel gave up). Transports that must not depend on copy engines while kernels
/// wait for them (Ethernet to GPU memory) need host-mapped memory instead.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html>
pub(super) fn on_sync_stream(
    dev: &CudaDevice,
    op: &'static str,
    issue: impl FnOnce(sys::CUstream) -> Result<()>,
) -> Result<()> {
    dev.enter()?;
    let s = dev.sync_stream()?;
    issue(s)?;
    // SAFETY: the device's live stream.
    unsafe { stream::synchronize(op, s) }
}

impl MemoryApi for Cuda {
    fn alloc(dev: &CudaDevice, size: usize, kind: MemoryKind) -> Result<CudaMemory> {
        alloc(dev, size, kind)
    }

    fn memset(
        dev: &CudaDevice,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()> {
        check_range("memset(cuda)", dst.size(), offset, len)?;
        // SAFETY: range checked against a live buffer, which outlives the wait.
        on_sync_stream(dev, "cuMemsetD8Async", |s| unsafe {
            mem::set_d8_async(dst.device_ptr() + offset as u64, value, len, s)
        })
    }

    fn write(dev: &CudaDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
        check_range("write(cuda)", dst.size(), offset, src.len())?;
        // SAFETY: range checked against a live buffer; both outlive the wait.
        on_sync_stream(dev, "cuMemcpyHtoDAsync", |s| unsafe {
            mem::copy_htod_async(dst.device_ptr() + offset as u64, src, s)
        })
    }

    fn read(dev: &CudaDevice, src: &impl Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("read(cuda)", src.size(), offset, dst.len())?;
        // SAFETY: range checked against a live buffer; both outlive the wait.
        on_sync_stream(dev, "cuMemcpyDtoHAsync", |s| unsafe {
            mem::copy_dtoh_async(dst, src.device_ptr() + offset as u64, s)
        })
    }

    fn copy(
        dev: &CudaDevice,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_range("copy(cuda) dst", dst.size(), dst_offset, len)?;
        check_range("copy(cuda) src", src.size(), src_offset, len)?;
        // SAFETY: both ranges checked against live buffers (unified addressing), which
        // outlive the wait.
        on_sync_stream(dev, "cuMemcpyAsync", |s| unsafe {
            mem::copy_async(
                dst.device_ptr() + dst_offset as u64,
                src.device_ptr() + src_offset as u64,
                len,
                s,
            )
        })
    }
}

/// Caller-owned host memory pinned with `cuMemHostRegister(PORTABLE | DEVICEMAP)`; dropping it
/// calls `cuMemHostUnregister` (the memory itself stays the caller's).
pub type CudaHostRegistration = HostRegistration<CudaDevice>;

impl Unregister for CudaDevice {
    unsafe fn unregister(&self, host: *mut u8) {
        // SAFETY: `host` was registered by `register_host` and is unregistered once.
        deferred::release(self.bind(), || unsafe { mem::host_unregister(host.cast()) });
    }
}

impl HostRegisterApi for Cuda {
    /// Pins and maps `ptr..ptr+len` for every context (PORTABLE) and device access
    /// (DEVICEMAP).
    unsafe fn register_host(
        dev: &CudaDevice,
        ptr: *mut u8,
        len: usize,
    ) -> Result<CudaHostRegistration> {
        check_host_range("register_host(cuda)", ptr, len)?;
        dev.enter()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        let host: *mut c_void = ptr.cast();
        let device_ptr = register_then_map(
            // SAFETY: the caller guarantees a live host range that outlives the registration.
            || unsafe { mem::host_register(host, len, flags) },
            // SAFETY: asked only once the range is registered with DEVICEMAP.
            || unsafe { mem::host_device_pointer(host) },
            // SAFETY: undoes the registration made by the first step, once.
            || unsafe { mem::host_unregister(host) },
        )?;
        Ok(HostRegistration::new(dev.clone(), ptr, device_ptr, len))
    }

    fn host_registration_device_ptr(r: &CudaHostRegistration) -> u64 {
        r.device_ptr()
    }
}

/// What the driver reports about a pointer (`cuPointerGetAttributes`, which reports zeros
/// rather than failing for memory CUDA does not know).
/// <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__UNIFIED.html>
#[derive(Debug, Default)]
struct PointerFacts {
    memory_type: u64,
    buffer_id: u64,
    managed: bool,
    ordinal: u64,
    legacy_ipc: bool,
    start: u64,
    size: u64,
    handle_types: u64,
}

fn pointer_facts(ptr: u64) -> Result<PointerFacts> {
    use sys::CUpointer_attribute as A;
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        A::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    ];
    // Each value is at most 8 bytes (bool, unsigned int, unsigned long long, pointer, size_t):
    // zeroed u64 slots read back right on this little-endian target whatever the width.
    let mut vals = [0u64; 8];
    let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    // SAFETY: attrs and ptrs hold 8 entries each; every slot is 8 writable bytes.
    checked("cuPointerGetAttributes", || unsafe {
        sys::cuPointerGetAttributes(
            attrs.len() as u32,
            attrs.as_mut_ptr(),
            ptrs.as_mut_ptr(),
            ptr,
        )
    })?;
    Ok(PointerFacts {
        memory_type: vals[0] & 0xffff_ffff,
        buffer_id: vals[1],
        managed: vals[2] & 0xff != 0,
        ordinal: vals[3] & 0xffff_ffff,
        legacy_ipc: vals[4] & 0xff != 0,
        start: vals[5],
        size: vals[6],
        handle_types: vals[7] & 0xffff_ffff,
    })
}

const ADOPT: &str = "adopt(cuda)";

/// The facts of the device allocation holding `ptr..ptr+len` on `dev`, or an error naming
/// the pointer and why it cannot be shared.
fn device_allocation(dev: &CudaDevice, ptr: u64, len: usize) -> Result<PointerFacts> {
    check_adopt_args(ADOPT, ptr, len)?;
    let f = pointer_facts(ptr)?;
    let why = if f.memory_type == 0 {
        Some(
            "not memory CUDA knows (plain host memory, freed memory, or an address of another \
              process)"
                .to_string(),
        )
    } else if f.managed {
        Some(
            "managed memory (cudaMallocManaged): CUDA cannot export it to another process; \
              use cudaMalloc or cuMem memory"
                .to_string(),
        )
    } else if f.memory_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u64 {
        Some(
            "pinned host memory (cudaMallocHost / cudaHostRegister): export works for device \
              memory only"
                .to_string(),
        )
    } else if f.ordinal != dev.ordinal() as u64 {
        Some(format!(
            "memory of GPU {}, registered on GPU {}",
            f.ordinal,
            dev.ordinal()
        ))
    } else if f.size == 0
        || ptr
            .checked_add(len as u64)
            .is_none_or(|e| e > f.start + f.size)
    {
        Some(format!(
            "the range runs past the end of its allocation {:#x} (+{} bytes); register each \
             allocation separately",
            f.start, f.size
        ))
    } else {
        None
    };
    match why {
        Some(w) => Err(not_exportable(ADOPT, ptr, len, w)),
        None => Ok(f),
    }
}

/// The identity of the allocation `f` describes; `vmm_handle`: the handle backing a cuMem
/// mapping (0 for cuMemAlloc memory). The driver gives the same handle value for as long as the
/// memory is mapped, and a new allocation another one while an adoption holds the old one
/// retained: so VMM memory released and mapped again at the same address (where the buffer id
/// may repeat) is told apart too.
fn identity_of(f: &PointerFacts, vmm_handle: u64) -> AllocationIdentity {
    AllocationIdentity {
        base: f.start,
        size: f.size as usize,
        token: [
            f.buffer_id,
            f.handle_types | (u64::from(f.legacy_ipc) << 63),
            vmm_handle,
        ],
    }
}

/// `cuMemRetainAllocationHandle` of the cuMem mapping at `ptr` (released by the caller), or an
/// error naming the pointer.
fn retain_vmm(ptr: u64, len: usize) -> Result<sys::CUmemGenericAllocationHandle> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out pointer; an address that is no cuMem mapping is an error status.
    let retained = checked("cuMemRetainAllocationHandle", || unsafe {
        sys::cuMemRetainAllocationHandle(&mut handle, ptr as usize as *mut c_void)
    });
    retained.map(|()| handle).map_err(|e| {
        not_exportable(
            ADOPT,
            ptr,
            len,
            format!(
                "device memory that is neither cuMemAlloc/cudaMalloc memory (legacy IPC) nor a \
                 cuMem mapping (e.g. cudaMallocAsync pool memory): {e}"
            ),
        )
    })
}

/// [`crate::IpcApi::identity`] for CUDA.
pub(super) fn identity(dev: &CudaDevice, ptr: u64, len: usize) -> Result<AllocationIdentity> {
    dev.enter()?;
    let f = device_allocation(dev, ptr, len)?;
    if f.legacy_ipc {
        return Ok(identity_of(&f, 0));
    }
    let handle = retain_vmm(ptr, len)?;
    // SAFETY: retained just above; released once.
    unsafe { vmm::release(handle) }?;
    Ok(identity_of(&f, handle))
}

/// [`crate::IpcApi::adopt`] for CUDA: cuMemAlloc memory exports by legacy IPC of its base;
/// cuMem/VMM memory by the shareable handle types it was created with.
pub(super) fn adopt(
    dev: &CudaDevice,
    ptr: u64,
    len: usize,
) -> Result<(CudaMemory, AllocationIdentity)> {
    dev.enter()?;
    let f = device_allocation(dev, ptr, len)?;
    let size = f.size as usize;
    let mk = |backing, kind| CudaMemory {
        dev: dev.clone(),
        ptr: f.start,
        size,
        kind,
        backing,
        fd_export: Mutex::new(None),
    };
    if f.legacy_ipc {
        return Ok((
            mk(Backing::ForeignLinear, MemoryKind::Device),
            identity_of(&f, 0),
        ));
    }
    let handle = retain_vmm(ptr, len)?;
    let id = identity_of(&f, handle);
    let posix_bit =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
    let fabric_bit = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0 as u64;
    let (posix, fabric) = (
        f.handle_types & posix_bit != 0,
        f.handle_types & fabric_bit != 0,
    );
    if !posix && !fabric {
        // SAFETY: retained just above; released once.
        let _ = unsafe { vmm::release(handle) };
        return Err(not_exportable(
            ADOPT,
            ptr,
            len,
            format!(
                "cuMem/VMM memory made without a shareable handle type (allowed handle types \
                 {:#x}): create it with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (or FABRIC) in \
                 requestedHandleTypes",
                f.handle_types
            ),
        ));
    }
    let backing = Backing::ForeignVmm {
        handle,
        mapped_len: size,
        fabric,
        posix,
    };
    Ok((mk(backing, MemoryKind::Physical { granularity: 0 }), id))
}
