//! ROCm memory: hipMalloc (Device, and Physical rounded to its granularity: VMM export is not
//! implemented on ROCm yet), hipExtMallocWithFlags(uncached) for Uncached (fine-grained),
//! hipHostMalloc(mapped | portable) for HostMapped; caller-owned host memory pinned and mapped
//! with hipHostRegister(mapped | portable) ([`crate::MemoryApi`] and
//! [`crate::HostRegisterApi`] for [`Rocm`]).

use super::conv::{
    HIP_DEVICE_MALLOC_UNCACHED, HIP_HOST_MALLOC_MAPPED, HIP_HOST_MALLOC_PORTABLE,
    HIP_HOST_REGISTER_MAPPED, HIP_HOST_REGISTER_PORTABLE,
};
use super::device::RocmDevice;
use super::result::{mem, stream};
use super::sys::HipStream;
use super::Rocm;
use crate::auxil::registration::{HostRegistration, Unregister};
use crate::auxil::{check_host_range, check_range, deferred, register_then_map};
use crate::{Buffer, Error, HostRegisterApi, MemoryApi, MemoryKind, Result};
use std::ffi::c_void;

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
        deferred::release(self.dev.bind(), || match self.host {
            // SAFETY: p came from hipHostMalloc and is freed once.
            Some(p) => unsafe { mem::host_free(p.cast()) },
            // SAFETY: ptr came from hipMalloc/hipExtMallocWithFlags and is freed once.
            None => unsafe { mem::free(self.ptr as usize as *mut c_void) },
        });
    }
}

impl MemoryApi for Rocm {
    fn alloc(dev: &RocmDevice, size: usize, kind: MemoryKind) -> Result<RocmMemory> {
        if size == 0 {
            return Err(Error::invalid("alloc(rocm)", "a non-zero size", "0"));
        }
        dev.enter()?;
        let mut host = None;
        let p = match kind {
            MemoryKind::Device => mem::malloc(size)?,
            MemoryKind::Physical { granularity } => {
                let g = granularity.max(1);
                let len = size.div_ceil(g).checked_mul(g).ok_or_else(|| {
                    Error::invalid(
                        "alloc(rocm)",
                        "a size that fits when rounded",
                        size.to_string(),
                    )
                })?;
                mem::malloc(len)?
            }
            MemoryKind::Uncached => mem::ext_malloc(
                "hipExtMallocWithFlags(uncached)",
                size,
                HIP_DEVICE_MALLOC_UNCACHED,
            )?,
            MemoryKind::HostMapped => {
                let h = mem::host_malloc(size, HIP_HOST_MALLOC_MAPPED | HIP_HOST_MALLOC_PORTABLE)?;
                // SAFETY: h is a live mapped host allocation.
                match unsafe { mem::host_device_pointer(h) } {
                    Ok(d) => {
                        host = Some(h.cast::<u8>());
                        d
                    }
                    Err(e) => {
                        // SAFETY: undo the allocation above.
                        let _ = unsafe { mem::host_free(h) };
                        return Err(e);
                    }
                }
            }
        };
        Ok(RocmMemory {
            dev: *dev,
            ptr: p as usize as u64,
            host,
            size,
            kind,
        })
    }

    fn memset(
        dev: &RocmDevice,
        dst: &impl Buffer,
        offset: usize,
        value: u8,
        len: usize,
    ) -> Result<()> {
        check_range("memset(rocm)", dst.size(), offset, len)?;
        // SAFETY: range checked against a live buffer, which outlives the wait.
        on_sync_stream(dev, "hipMemsetAsync", |s| unsafe {
            mem::set_async(dst.device_ptr() + offset as u64, value, len, s)
        })
    }

    fn write(dev: &RocmDevice, dst: &impl Buffer, offset: usize, src: &[u8]) -> Result<()> {
        check_range("write(rocm)", dst.size(), offset, src.len())?;
        // SAFETY: range checked against a live buffer; src is a live host slice; both outlive
        // the wait.
        on_sync_stream(dev, "hipMemcpyAsync(HtoD)", |s| unsafe {
            mem::copy_async(
                dst.device_ptr() + offset as u64,
                src.as_ptr() as usize as u64,
                src.len(),
                s,
            )
        })
    }

    fn read(dev: &RocmDevice, src: &impl Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("read(rocm)", src.size(), offset, dst.len())?;
        // SAFETY: range checked against a live buffer; dst is a live host slice; both outlive
        // the wait.
        on_sync_stream(dev, "hipMemcpyAsync(DtoH)", |s| unsafe {
            mem::copy_async(
                dst.as_mut_ptr() as usize as u64,
                src.device_ptr() + offset as u64,
                dst.len(),
                s,
            )
        })
    }

    fn copy(
        dev: &RocmDevice,
        dst: &impl Buffer,
        dst_offset: usize,
        src: &impl Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_range("copy(rocm) dst", dst.size(), dst_offset, len)?;
        check_range("copy(rocm) src", src.size(), src_offset, len)?;
        // SAFETY: both ranges checked against live buffers, which outlive the wait.
        on_sync_stream(dev, "hipMemcpyAsync(DtoD)", |s| unsafe {
            mem::copy_async(
                dst.device_ptr() + dst_offset as u64,
                src.device_ptr() + src_offset as u64,
                len,
                s,
            )
        })
    }
}

/// A stream handle kept for the life of the process.
struct SyncStream(HipStream);
// SAFETY: a HIP stream handle may be used from any thread.
unsafe impl Send for SyncStream {}

/// Runs `issue` on the device's own non-blocking stream and waits for it: the HAL promises that
/// `memset`/`write`/`read`/`copy` return when done. They never use the null stream (hipMemcpy,
/// hipMemset): work queued there (PyTorch's next kernels behind a wait for a collective's
/// kernel) would hold them while that kernel waits for this very copy (see the CUDA backend's
/// `on_sync_stream`, also for what it cannot help). One stream per device ordinal, created on
/// first use and kept for the life of the process (a `RocmDevice` is a plain ordinal with no
/// owner to destroy it).
pub(super) fn on_sync_stream(
    dev: &RocmDevice,
    op: &'static str,
    issue: impl FnOnce(HipStream) -> Result<()>,
) -> Result<()> {
    static STREAMS: std::sync::Mutex<Vec<(i32, SyncStream)>> = std::sync::Mutex::new(Vec::new());
    dev.enter()?;
    let s = {
        let mut g = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        match g.iter().find(|(o, _)| *o == dev.ordinal) {
            Some((_, s)) => s.0,
            None => {
                let s = stream::create_non_blocking()?;
                g.push((dev.ordinal, SyncStream(s)));
                s
            }
        }
    };
    issue(s)?;
    // SAFETY: a live stream (never destroyed).
    unsafe { stream::synchronize(op, s) }
}

/// Caller-owned host memory pinned with `hipHostRegister(Mapped | Portable)`; dropping it calls
/// `hipHostUnregister` (the memory itself stays the caller's).
pub type RocmHostRegistration = HostRegistration<RocmDevice>;

impl Unregister for RocmDevice {
    unsafe fn unregister(&self, host: *mut u8) {
        // SAFETY: `host` was registered by `register_host` and is unregistered once.
        deferred::release(self.bind(), || unsafe { mem::host_unregister(host.cast()) });
    }
}

impl HostRegisterApi for Rocm {
    /// Pins and maps `ptr..ptr+len` for device access from every device (Mapped | Portable).
    unsafe fn register_host(
        dev: &RocmDevice,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RocmHostRegistration> {
        check_host_range("register_host(rocm)", ptr, len)?;
        dev.enter()?;
        let host: *mut c_void = ptr.cast();
        let flags = HIP_HOST_REGISTER_MAPPED | HIP_HOST_REGISTER_PORTABLE;
        let device_ptr = register_then_map(
            // SAFETY: the caller guarantees a live host range that outlives the registration.
            || unsafe { mem::host_register(host, len, flags) },
            // SAFETY: asked only once the range is registered as mapped.
            || unsafe { mem::host_device_pointer(host) }.map(|d| d as usize as u64),
            // SAFETY: undoes the registration made by the first step, once.
            || unsafe { mem::host_unregister(host) },
        )?;
        Ok(HostRegistration::new(*dev, ptr, device_ptr, len))
    }

    fn host_registration_device_ptr(r: &RocmHostRegistration) -> u64 {
        r.device_ptr()
    }
}
