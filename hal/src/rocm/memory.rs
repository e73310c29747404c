//! ROCm memory: hipMalloc (Device, and Physical rounded to its granularity: VMM export is not
//! implemented on ROCm yet), hipExtMallocWithFlags(uncached) for Uncached (fine-grained),
//! hipHostMalloc(mapped | portable) for HostMapped; caller-owned host memory pinned and mapped
//! with hipHostRegister(mapped | portable).

use super::conv::{check, hip, HIP_MEMCPY_DEFAULT};
use super::device::RocmDevice;
use crate::{check_host_range, check_range, deferred, Buffer, Error, MemoryKind, Result};
use std::ffi::c_void;

const HIP_HOST_MALLOC_PORTABLE: u32 = 0x1;
const HIP_HOST_MALLOC_MAPPED: u32 = 0x2;
const HIP_DEVICE_MALLOC_UNCACHED: u32 = 0x3;
const HIP_HOST_REGISTER_PORTABLE: u32 = 0x1;
const HIP_HOST_REGISTER_MAPPED: u32 = 0x2;

/// A ROCm allocation; dropping it frees the memory.
#[derive(Debug)]
pub struct RocmMemory {
    pub(super) dev: RocmDevice,
    pub(super) ptr: u64,
    pub(super) host: Option<*mut u8>,
    pub(super) size: usize,
    pub(super) kind: MemoryKind,
}

// SAFETY: device pointers and pinned host pointers may be used from any thread.
unsafe impl Send for RocmMemory {}
// SAFETY: as above.
unsafe impl Sync for RocmMemory {}

impl RocmMemory {
    /// The kind it was allocated as.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }
}

impl Buffer for RocmMemory {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        self.host
    }
}

impl Drop for RocmMemory {
    fn drop(&mut self) {
        let r = hip().and_then(|h| {
            self.dev.bind()?;
            match self.host {
                // SAFETY: p came from hipHostMalloc and is freed once.
                Some(p) => check("hipHostFree", unsafe { (h.hipHostFree)(p.cast()) }),
                // SAFETY: ptr came from hipMalloc/hipExtMallocWithFlags and is freed once.
                None => check("hipFree", unsafe {
                    (h.hipFree)(self.ptr as usize as *mut c_void)
                }),
            }
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

pub(super) fn alloc(dev: &RocmDevice, size: usize, kind: MemoryKind) -> Result<RocmMemory> {
    if size == 0 {
        return Err(Error::invalid("alloc(rocm)", "a non-zero size", "0"));
    }
    let h = hip()?;
    dev.bind()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut host = None;
    match kind {
        // SAFETY: valid out pointer (all three arms).
        MemoryKind::Device => check("hipMalloc", unsafe { (h.hipMalloc)(&mut p, size) })?,
        MemoryKind::Physical { granularity } => {
            let g = granularity.max(1);
            let len = size.div_ceil(g).checked_mul(g).ok_or_else(|| {
                Error::invalid(
                    "alloc(rocm)",
                    "a size that fits when rounded",
                    size.to_string(),
                )
            })?;
            // SAFETY: valid out pointer.
            check("hipMalloc", unsafe { (h.hipMalloc)(&mut p, len) })?
        }
        // SAFETY: valid out pointer.
        MemoryKind::Uncached => check("hipExtMallocWithFlags(uncached)", unsafe {
            (h.hipExtMallocWithFlags)(&mut p, size, HIP_DEVICE_MALLOC_UNCACHED)
        })?,
        MemoryKind::HostMapped => {
            // SAFETY: valid out pointer.
            check("hipHostMalloc", unsafe {
                (h.hipHostMalloc)(
                    &mut p,
                    size,
                    HIP_HOST_MALLOC_MAPPED | HIP_HOST_MALLOC_PORTABLE,
                )
            })?;
            let mut d: *mut c_void = std::ptr::null_mut();
            // SAFETY: p is a mapped host allocation.
            if let Err(e) = check("hipHostGetDevicePointer", unsafe {
                (h.hipHostGetDevicePointer)(&mut d, p, 0)
            }) {
                // SAFETY: undo the allocation above.
                unsafe { (h.hipHostFree)(p) };
                return Err(e);
            }
            host = Some(p.cast::<u8>());
            p = d;
        }
    }
    Ok(RocmMemory {
        dev: *dev,
        ptr: p as usize as u64,
        host,
        size,
        kind,
    })
}

pub(super) fn memset(
    dev: &RocmDevice,
    dst: &impl Buffer,
    offset: usize,
    value: u8,
    len: usize,
) -> Result<()> {
    check_range("memset(rocm)", dst.size(), offset, len)?;
    let h = hip()?;
    dev.bind()?;
    // SAFETY: range checked against a live buffer.
    check("hipMemset", unsafe {
        (h.hipMemset)(
            (dst.device_ptr() as usize + offset) as *mut c_void,
            i32::from(value),
            len,
        )
    })
}

pub(super) fn memcpy(
    dev: &RocmDevice,
    op: &'static str,
    dst: u64,
    src: u64,
    len: usize,
) -> Result<()> {
    let h = hip()?;
    dev.bind()?;
    // SAFETY: callers pass ranges checked against live buffers or live host slices.
    check(op, unsafe {
        (h.hipMemcpy)(
            dst as usize as *mut c_void,
            src as usize as *const c_void,
            len,
            HIP_MEMCPY_DEFAULT,
        )
    })
}

/// Caller-owned host memory pinned with `hipHostRegister(Mapped | Portable)`; dropping it calls
/// `hipHostUnregister` (the memory itself stays the caller's).
#[derive(Debug)]
pub struct RocmHostRegistration {
    dev: RocmDevice,
    host: *mut u8,
    device_ptr: u64,
    len: usize,
}

// SAFETY: the host pointer is only handed to the runtime (thread-safe) and back to the caller;
// the memory is owned and synchronised by the caller per the `register_host` contract.
unsafe impl Send for RocmHostRegistration {}
// SAFETY: as above; the struct is immutable after creation.
unsafe impl Sync for RocmHostRegistration {}

impl RocmHostRegistration {
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
    /// The address kernels use (`hipHostGetDevicePointer`).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

impl Drop for RocmHostRegistration {
    fn drop(&mut self) {
        let r = hip().and_then(|h| {
            self.dev.bind()?;
            // SAFETY: `host` was registered by `register_host` and is unregistered once.
            check("hipHostUnregister", unsafe {
                (h.hipHostUnregister)(self.host.cast())
            })
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

/// Pins and maps `ptr..ptr+len` for device access from every device (Mapped | Portable).
///
/// # Safety
/// As [`crate::Api::register_host`]: the range is one live host allocation that outlives the
/// registration.
pub(super) unsafe fn register_host(
    dev: &RocmDevice,
    ptr: *mut u8,
    len: usize,
) -> Result<RocmHostRegistration> {
    check_host_range("register_host(rocm)", ptr, len)?;
    let h = hip()?;
    dev.bind()?;
    // SAFETY: the caller guarantees a live host range; the device is current.
    check("hipHostRegister", unsafe {
        (h.hipHostRegister)(
            ptr.cast(),
            len,
            HIP_HOST_REGISTER_MAPPED | HIP_HOST_REGISTER_PORTABLE,
        )
    })?;
    let mut d: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out pointer; ptr was just registered as mapped; flags must be 0.
    if let Err(e) = check("hipHostGetDevicePointer", unsafe {
        (h.hipHostGetDevicePointer)(&mut d, ptr.cast(), 0)
    }) {
        // SAFETY: undo the registration made above.
        unsafe { (h.hipHostUnregister)(ptr.cast()) };
        return Err(e);
    }
    Ok(RocmHostRegistration {
        dev: *dev,
        host: ptr,
        device_ptr: d as usize as u64,
        len,
    })
}
