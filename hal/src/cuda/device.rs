//! CUDA devices: primary contexts, properties, peer access.
//!
//! Driver calls: cuDeviceGet, cuDevicePrimaryCtxRetain/Release, cuCtxSetCurrent,
//! cuDeviceGetAttribute, cuDeviceGetPCIBusId, cuDeviceCanAccessPeer, cuCtxEnablePeerAccess
//! (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__DEVICE.html>,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html>).

use super::conv::{check, ensure_driver};
use crate::{deferred, DeviceProperties, Error, Result};
use cudarc::driver::sys;
use std::sync::Arc;

/// An opened CUDA device holding its retained primary context. Cheap to clone.
#[derive(Clone, Debug)]
pub struct CudaDevice {
    pub(super) inner: Arc<DeviceInner>,
}

#[derive(Debug)]
pub(super) struct DeviceInner {
    pub(super) ordinal: usize,
    pub(super) dev: sys::CUdevice,
    pub(super) ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver is thread-safe).
unsafe impl Send for DeviceInner {}
// SAFETY: as above.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: the primary context was retained once in `open`.
        if let Err(e) = check("cuDevicePrimaryCtxRelease", unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev)
        }) {
            deferred::record(e);
        }
    }
}

impl CudaDevice {
    /// Makes this device's context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        // SAFETY: ctx is a retained primary context.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.inner.ctx)
        })
    }
    /// The raw CUdevice.
    pub fn cu_device(&self) -> sys::CUdevice {
        self.inner.dev
    }
    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }
    pub(super) fn attribute(&self, attr: sys::CUdevice_attribute, op: &'static str) -> Result<i32> {
        let mut v = 0i32;
        // SAFETY: valid out pointer and device.
        check(op, unsafe {
            sys::cuDeviceGetAttribute(&mut v, attr, self.inner.dev)
        })?;
        Ok(v)
    }
}

pub(super) fn count() -> Result<usize> {
    ensure_driver()?;
    let mut n = 0i32;
    // SAFETY: valid out pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n.max(0) as usize)
}

/// The device of the calling thread's current context (`cuCtxGetCurrent`, `cuCtxGetDevice`);
/// `None` when the thread has no current context.
pub(super) fn current_ordinal() -> Result<Option<usize>> {
    ensure_driver()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        return Ok(None);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out pointer; a context is current.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    // A CUdevice is the device's ordinal.
    Ok(usize::try_from(dev).ok())
}

pub(super) fn open(ordinal: usize) -> Result<CudaDevice> {
    let n = count()?;
    if ordinal >= n {
        return Err(Error::invalid(
            "open_device(cuda)",
            format!("an ordinal below {n}"),
            ordinal.to_string(),
        ));
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out pointer; ordinal < count.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer and device.
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    let d = CudaDevice {
        inner: Arc::new(DeviceInner { ordinal, dev, ctx }),
    };
    d.bind()?;
    Ok(d)
}

pub(super) fn properties(d: &CudaDevice) -> Result<DeviceProperties> {
    use sys::CUdevice_attribute as A;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds 256 chars; the driver NUL-terminates.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, d.inner.dev)
    })?;
    let mut bus = [0 as std::ffi::c_char; 64];
    // SAFETY: as above.
    check("cuDeviceGetPCIBusId", unsafe {
        sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, d.inner.dev)
    })?;
    let cstr = |b: &[std::ffi::c_char]| {
        let bytes: Vec<u8> = b
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let sm = d.attribute(
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
    )?;
    let major = d.attribute(
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "cuDeviceGetAttribute(CC_MAJOR)",
    )?;
    let minor = d.attribute(
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "cuDeviceGetAttribute(CC_MINOR)",
    )?;
    // NUMA_ID may be unknown to older drivers or -1 on VMs: never an error.
    let numa = d
        .attribute(
            A::CU_DEVICE_ATTRIBUTE_NUMA_ID,
            "cuDeviceGetAttribute(NUMA_ID)",
        )
        .unwrap_or(-1);
    Ok(DeviceProperties {
        name: cstr(&name),
        sm_count: sm.max(0) as u32,
        compute_capability: (major.max(0) as u32, minor.max(0) as u32),
        pci_bus_id: cstr(&bus).to_ascii_lowercase(),
        numa_node: if numa < 0 { -1 } else { numa },
    })
}

pub(super) fn can_access_peer(d: &CudaDevice, peer: &CudaDevice) -> Result<bool> {
    if d.inner.dev == peer.inner.dev {
        return Ok(true);
    }
    let mut v = 0i32;
    // SAFETY: valid out pointer and devices.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut v, d.inner.dev, peer.inner.dev)
    })?;
    Ok(v != 0)
}

pub(super) fn enable_peer_access(d: &CudaDevice, peer: &CudaDevice) -> Result<()> {
    if d.inner.dev == peer.inner.dev {
        return Ok(());
    }
    d.bind()?;
    // SAFETY: peer ctx is a retained primary context; flags must be 0.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer.inner.ctx, 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check("cuCtxEnablePeerAccess", r)
}

pub(super) fn synchronize(d: &CudaDevice, timeout: std::time::Duration) -> Result<()> {
    // cuCtxSynchronize has no timeout: run it on a helper thread and stop waiting at the limit.
    let ctx = DeviceCtx(d.inner.ctx);
    let (tx, rx) = std::sync::mpsc::channel();
    let keep = d.clone();
    std::thread::Builder::new()
        .name("mscclpp-hal-ctxsync".into())
        .spawn(move || {
            let ctx = ctx;
            // SAFETY: the context stays retained by `keep` for the thread's life.
            let r = check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx.0) })
                .and_then(|_| check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }));
            drop(keep);
            let _ = tx.send(r);
        })
        .map_err(|source| Error::Os {
            op: "spawn ctx sync thread",
            source,
        })?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            op: "cuCtxSynchronize",
            waited: timeout,
        }),
    }
}

struct DeviceCtx(sys::CUcontext);
// SAFETY: a context handle may be used from any thread.
unsafe impl Send for DeviceCtx {}
