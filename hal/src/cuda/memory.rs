//! CUDA memory: cuMemAlloc (Device/Uncached), cuMemHostAlloc (HostMapped), and cuMem VMM
//! allocations (Physical) exportable as POSIX fds (and fabric handles where supported);
//! caller-owned host memory pinned and mapped with cuMemHostRegister.
//!
//! Not cudarc's pooled `alloc`: peers cannot touch stream-ordered pool memory.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>.

use super::conv::check;
use super::device::CudaDevice;
use crate::fdpass::FdRegistration;
use crate::{check_host_range, check_range, deferred, Buffer, Error, MemoryKind, Result};
use cudarc::driver::sys;
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
            Backing::Physical { mapped_len, .. } => mapped_len,
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
            // SAFETY: ptr came from cuMemAlloc_v2 and is freed once.
            Backing::Linear => check("cuMemFree", unsafe { sys::cuMemFree_v2(self.ptr) }),
            // SAFETY: p came from cuMemHostAlloc and is freed once.
            Backing::Host(p) => check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(p.cast()) }),
            Backing::Physical {
                handle, mapped_len, ..
            } => unmap_release(self.ptr, mapped_len, handle),
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
    let a = check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, len) });
    // SAFETY: as above.
    let b = check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(ptr, len)
    });
    // SAFETY: as above.
    let c = check("cuMemRelease", unsafe { sys::cuMemRelease(handle) });
    a.and(b).and(c)
}

fn device_location(dev: &CudaDevice) -> sys::CUmemLocation {
    // SAFETY: CUmemLocation is a plain C struct; all-zero is a valid starting value.
    let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev.ordinal() as i32;
    loc
}

pub(super) fn physical_prop(dev: &CudaDevice, handle_types: u32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; zero is the documented default for every field.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = device_location(dev);
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType(handle_types);
    let rdma = dev
        .attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
            "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)",
        )
        .unwrap_or(0);
    prop.allocFlags.gpuDirectRDMACapable = u8::from(rdma != 0);
    prop
}

/// The minimum cuMem granularity of `dev`.
pub(super) fn min_granularity(dev: &CudaDevice, prop: &sys::CUmemAllocationProp) -> Result<usize> {
    let mut g = 0usize;
    // SAFETY: valid out pointer and property struct.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    let _ = dev;
    Ok(g.max(1))
}

/// Reserves a VA range of `len` bytes aligned to `align`, maps `handle` into it and gives
/// `devices` read/write access. Undoes what it did on failure (the handle is left to the caller).
pub(super) fn map_handle(
    handle: sys::CUmemGenericAllocationHandle,
    len: usize,
    align: usize,
    devices: &[i32],
) -> Result<u64> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; no fixed address requested.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut ptr, len, align, 0, 0)
    })?;
    // SAFETY: ptr/len was just reserved; handle is a live allocation of at least len bytes.
    if let Err(e) = check("cuMemMap", unsafe { sys::cuMemMap(ptr, len, 0, handle, 0) }) {
        // SAFETY: undo the reservation made above.
        unsafe { sys::cuMemAddressFree(ptr, len) };
        return Err(e);
    }
    let descs: Vec<sys::CUmemAccessDesc> = devices
        .iter()
        .map(|id| {
            // SAFETY: plain C struct.
            let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            d.location.id = *id;
            d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            d
        })
        .collect();
    // SAFETY: the range is mapped; descs is a live array of descs.len() entries.
    if let Err(e) = check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(ptr, len, descs.as_ptr(), descs.len())
    }) {
        // SAFETY: undo the mapping and reservation made above.
        unsafe {
            sys::cuMemUnmap(ptr, len);
            sys::cuMemAddressFree(ptr, len);
        }
        return Err(e);
    }
    Ok(ptr)
}

/// This device plus every device that can access it as a peer.
fn access_devices(dev: &CudaDevice) -> Vec<i32> {
    let mut ids = vec![dev.ordinal() as i32];
    let mut n = 0i32;
    // SAFETY: valid out pointer.
    if unsafe { sys::cuDeviceGetCount(&mut n) } == sys::CUresult::CUDA_SUCCESS {
        for other in 0..n {
            if other as usize == dev.ordinal() {
                continue;
            }
            let mut od: sys::CUdevice = 0;
            let mut can = 0i32;
            // SAFETY: valid out pointers; other < count.
            let ok = unsafe {
                sys::cuDeviceGet(&mut od, other) == sys::CUresult::CUDA_SUCCESS
                    && sys::cuDeviceCanAccessPeer(&mut can, od, dev.cu_device())
                        == sys::CUresult::CUDA_SUCCESS
            };
            if ok && can != 0 {
                ids.push(other);
            }
        }
    }
    ids
}

pub(super) fn alloc(dev: &CudaDevice, size: usize, kind: MemoryKind) -> Result<CudaMemory> {
    if size == 0 {
        return Err(Error::invalid("alloc(cuda)", "a non-zero size", "0"));
    }
    dev.bind()?;
    let mk = |ptr, backing| CudaMemory {
        dev: dev.clone(),
        ptr,
        size,
        kind,
        backing,
        fd_export: Mutex::new(None),
    };
    match kind {
        MemoryKind::Device | MemoryKind::Uncached => {
            let mut p: sys::CUdeviceptr = 0;
            // SAFETY: valid out pointer; context is current.
            check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, size) })?;
            Ok(mk(p, Backing::Linear))
        }
        MemoryKind::HostMapped => {
            let mut h: *mut std::ffi::c_void = std::ptr::null_mut();
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: valid out pointer; context is current.
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut h, size, flags)
            })?;
            let mut d: sys::CUdeviceptr = 0;
            // SAFETY: h is a DEVICEMAP host allocation.
            if let Err(e) = check("cuMemHostGetDevicePointer", unsafe {
                sys::cuMemHostGetDevicePointer_v2(&mut d, h, 0)
            }) {
                // SAFETY: undo the allocation above.
                unsafe { sys::cuMemFreeHost(h) };
                return Err(e);
            }
            Ok(mk(d, Backing::Host(h.cast())))
        }
        MemoryKind::Physical { granularity } => {
            let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
            let fabric_type = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
            let fabric_ok = dev
                .attribute(
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
                    "cuDeviceGetAttribute(HANDLE_TYPE_FABRIC_SUPPORTED)",
                )
                .unwrap_or(0)
                != 0;
            let prop = physical_prop(dev, posix);
            let min = min_granularity(dev, &prop)?;
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
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // Ask for fabric + POSIX fd where fabric is reported; without IMEX that can fail,
            // so fall back to POSIX fd alone.
            let mut fabric = false;
            if fabric_ok {
                let p = physical_prop(dev, posix | fabric_type);
                // SAFETY: valid out pointer and property struct.
                fabric = unsafe { sys::cuMemCreate(&mut handle, mapped_len, &p, 0) }
                    == sys::CUresult::CUDA_SUCCESS;
            }
            if !fabric {
                // SAFETY: valid out pointer and property struct.
                check("cuMemCreate", unsafe {
                    sys::cuMemCreate(&mut handle, mapped_len, &prop, 0)
                })?;
            }
            let ptr = match map_handle(handle, mapped_len, gran, &access_devices(dev)) {
                Ok(p) => p,
                Err(e) => {
                    // SAFETY: release the handle created above.
                    unsafe { sys::cuMemRelease(handle) };
                    return Err(e);
                }
            };
            Ok(mk(
                ptr,
                Backing::Physical {
                    handle,
                    mapped_len,
                    fabric,
                },
            ))
        }
    }
}

pub(super) fn memset(
    dev: &CudaDevice,
    dst: &impl Buffer,
    offset: usize,
    value: u8,
    len: usize,
) -> Result<()> {
    check_range("memset(cuda)", dst.size(), offset, len)?;
    dev.bind()?;
    // SAFETY: range checked against a live buffer.
    check("cuMemsetD8", unsafe {
        sys::cuMemsetD8_v2(dst.device_ptr() + offset as u64, value, len)
    })?;
    finish_legacy_stream("cuMemsetD8")
}

/// Waits for the work just issued on the legacy default stream. `cuMemsetD8`, a
/// device-to-device `cuMemcpy` and a `cuMemcpyHtoD` from pageable memory may return before
/// the device has finished (the last one once the bytes are staged), but the HAL promises
/// that `memset`/`write`/`copy` return when done: a peer may read the memory right after.
/// Our own streams are non-blocking, so kernels running on them are not waited for.
/// <https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html>
fn finish_legacy_stream(after: &'static str) -> Result<()> {
    // SAFETY: a null stream is the legacy default stream of the current context.
    check(after, unsafe {
        sys::cuStreamSynchronize(std::ptr::null_mut())
    })
}

pub(super) fn write(dev: &CudaDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
    check_range("write(cuda)", dst.size(), offset, src.len())?;
    dev.bind()?;
    // SAFETY: range checked; src is a live host slice.
    check("cuMemcpyHtoD", unsafe {
        sys::cuMemcpyHtoD_v2(
            dst.device_ptr() + offset as u64,
            src.as_ptr().cast(),
            src.len(),
        )
    })?;
    finish_legacy_stream("cuMemcpyHtoD")
}

pub(super) fn read(
    dev: &CudaDevice,
    src: &impl Buffer,
    offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    check_range("read(cuda)", src.size(), offset, dst.len())?;
    dev.bind()?;
    // SAFETY: range checked; dst is a live host slice.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(
            dst.as_mut_ptr().cast(),
            src.device_ptr() + offset as u64,
            dst.len(),
        )
    })
}

pub(super) fn copy(
    dev: &CudaDevice,
    dst: &impl Buffer,
    dst_offset: usize,
    src: &impl Buffer,
    src_offset: usize,
    len: usize,
) -> Result<()> {
    check_range("copy(cuda) dst", dst.size(), dst_offset, len)?;
    check_range("copy(cuda) src", src.size(), src_offset, len)?;
    dev.bind()?;
    // SAFETY: both ranges checked against live buffers (unified addressing).
    check("cuMemcpy", unsafe {
        sys::cuMemcpy(
            dst.device_ptr() + dst_offset as u64,
            src.device_ptr() + src_offset as u64,
            len,
        )
    })?;
    finish_legacy_stream("cuMemcpy")
}

/// Caller-owned host memory pinned with `cuMemHostRegister(PORTABLE | DEVICEMAP)`; dropping it
/// calls `cuMemHostUnregister` (the memory itself stays the caller's).
#[derive(Debug)]
pub struct CudaHostRegistration {
    dev: CudaDevice,
    host: *mut u8,
    device_ptr: u64,
    len: usize,
}

// SAFETY: the host pointer is only handed to the driver (thread-safe) and back to the caller;
// the memory is owned and synchronised by the caller per the `register_host` contract.
unsafe impl Send for CudaHostRegistration {}
// SAFETY: as above; the struct is immutable after creation.
unsafe impl Sync for CudaHostRegistration {}

impl CudaHostRegistration {
    /// The registered host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    /// Registered bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: registrations are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address kernels use (`cuMemHostGetDevicePointer`).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

impl Drop for CudaHostRegistration {
    fn drop(&mut self) {
        let r = self.dev.bind().and_then(|()| {
            // SAFETY: `host` was registered by `register_host` and is unregistered once.
            check("cuMemHostUnregister", unsafe {
                sys::cuMemHostUnregister(self.host.cast())
            })
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

/// Pins and maps `ptr..ptr+len` for every context (PORTABLE) and device access (DEVICEMAP).
///
/// # Safety
/// As [`crate::Api::register_host`]: the range is one live host allocation that outlives the
/// registration.
pub(super) unsafe fn register_host(
    dev: &CudaDevice,
    ptr: *mut u8,
    len: usize,
) -> Result<CudaHostRegistration> {
    check_host_range("register_host(cuda)", ptr, len)?;
    dev.bind()?;
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: the caller guarantees a live host range; the context is current.
    check("cuMemHostRegister", unsafe {
        sys::cuMemHostRegister_v2(ptr.cast(), len, flags)
    })?;
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: valid out pointer; ptr was just registered with DEVICEMAP; flags must be 0.
    if let Err(e) = check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut d, ptr.cast(), 0)
    }) {
        // SAFETY: undo the registration made above.
        unsafe { sys::cuMemHostUnregister(ptr.cast()) };
        return Err(e);
    }
    Ok(CudaHostRegistration {
        dev: dev.clone(),
        host: ptr,
        device_ptr: d,
        len,
    })
}
