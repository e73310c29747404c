//! CUDA devices: loading the driver, primary contexts, properties, peer access
//! ([`crate::DeviceApi`] for [`Cuda`]).

use super::result::{ctx, device, init, peer};
use super::Cuda;
use crate::auxil::deferred;
use crate::{DeviceApi, DeviceProperties, Error, Result};
use cudarc::driver::sys;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
    /// The non-blocking stream of the synchronous copies and sets (`memset`, `write`, `read`,
    /// `copy`), created on first use; see `memory::on_sync_stream`.
    pub(super) sync_stream: OnceLock<RawStream>,
}

/// A stream handle owned by [`DeviceInner`] (destroyed in its `Drop`).
#[derive(Debug)]
pub(super) struct RawStream(pub(super) sys::CUstream);

// Thread-safe: a CUcontext handle may be used from any thread (the driver is thread-safe).
thread_safe!(DeviceInner);

impl Drop for DeviceInner {
    fn drop(&mut self) {
        if let Some(s) = self.sync_stream.get() {
            // SAFETY: the context is still retained; the stream was created in it by
            // `sync_stream` and is destroyed once, here.
            let r = unsafe { ctx::set_current(self.ctx) }
                .and_then(|()| unsafe { super::result::stream::destroy(s.0) });
            if let Err(e) = r {
                deferred::record(e);
            }
        }
        // SAFETY: the primary context was retained once in `open_device`.
        if let Err(e) = unsafe { ctx::primary_release(self.dev) } {
            deferred::record(e);
        }
    }
}

impl CudaDevice {
    /// Enters the device for one operation: makes the context current. Every fallible
    /// operation of this backend starts here; `Drop` paths use [`CudaDevice::bind`]. It does
    /// not surface failures recorded by an earlier `Drop` (see `auxil::deferred`): one thread's
    /// failed free must not fail another thread's copy.
    pub(super) fn enter(&self) -> Result<()> {
        self.bind()
    }
    /// Makes this device's context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        // SAFETY: ctx is retained by `inner` for as long as this device lives.
        unsafe { ctx::set_current(self.inner.ctx) }
    }
    /// The device's own non-blocking stream for synchronous copies and sets (created on first
    /// use; the caller has entered the device).
    pub(super) fn sync_stream(&self) -> Result<sys::CUstream> {
        if let Some(s) = self.inner.sync_stream.get() {
            return Ok(s.0);
        }
        let s = super::result::stream::create_non_blocking()?;
        if let Err(RawStream(extra)) = self.inner.sync_stream.set(RawStream(s)) {
            // Another thread created one first: use it.
            // SAFETY: `extra` was created above and nothing else has it.
            unsafe { super::result::stream::destroy(extra) }?;
        }
        self.inner
            .sync_stream
            .get()
            .map(|s| s.0)
            .ok_or_else(|| Error::invalid("sync_stream(cuda)", "a stream", "none was set"))
    }
    /// The raw CUdevice.
    pub fn cu_device(&self) -> sys::CUdevice {
        self.inner.dev
    }
    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }
    /// A device attribute; `op` names it in errors.
    pub(super) fn attribute(&self, attr: sys::CUdevice_attribute, op: &'static str) -> Result<i32> {
        device::attribute(self.inner.dev, attr, op)
    }
}

/// Loads libcuda (checked first, so a missing driver is an error and not a panic) and runs
/// `cuInit` once per process; then surfaces deferred failures like [`CudaDevice::enter`].
pub(super) fn enter_driver() -> Result<()> {
    load_driver()?;
    deferred::check()
}

/// Loads libcuda and runs `cuInit` once per process (an error, never a panic, without a
/// driver); unlike [`enter_driver`] it leaves deferred failures for later.
fn load_driver() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let r = READY.get_or_init(|| {
        // SAFETY: only tries to dlopen the candidate library names.
        if !unsafe { sys::is_culib_present() } {
            return Err(String::new());
        }
        init::init().map_err(|e| e.to_string())
    });
    match r {
        Ok(()) => Ok(()),
        Err(msg) if msg.is_empty() => Err(Error::NoDriver {
            backend: "cuda",
            tried: ["cuda", "nvcuda"]
                .iter()
                .flat_map(|n| cudarc::get_lib_name_candidates(n))
                .collect(),
            detail: "is the NVIDIA driver installed?".into(),
        }),
        Err(msg) => Err(Error::NoDriver {
            backend: "cuda",
            tried: vec!["libcuda (loaded)".into()],
            detail: msg.clone(),
        }),
    }
}

impl DeviceApi for Cuda {
    fn device_count() -> Result<usize> {
        enter_driver()?;
        Ok(device::count()?.max(0) as usize)
    }

    fn open_device(ordinal: usize) -> Result<CudaDevice> {
        let n = Self::device_count()?;
        if ordinal >= n {
            return Err(Error::invalid(
                "open_device(cuda)",
                format!("an ordinal below {n}"),
                ordinal.to_string(),
            ));
        }
        let dev = device::get(ordinal as i32)?;
        let ctx = ctx::primary_retain(dev)?;
        let d = CudaDevice {
            inner: Arc::new(DeviceInner {
                ordinal,
                dev,
                ctx,
                sync_stream: OnceLock::new(),
            }),
        };
        d.bind()?;
        Ok(d)
    }

    fn device_ordinal(dev: &CudaDevice) -> usize {
        dev.ordinal()
    }

    fn set_current(dev: &CudaDevice) -> Result<()> {
        dev.enter()
    }

    fn current_ordinal() -> Result<Option<usize>> {
        // Without a loaded driver a driver call would panic (cudarc's dynamic loading).
        load_driver()?;
        // A CUdevice is the device's ordinal.
        Ok(ctx::current_device()?.and_then(|d| usize::try_from(d).ok()))
    }

    fn properties(d: &CudaDevice) -> Result<DeviceProperties> {
        use sys::CUdevice_attribute as A;
        d.enter()?;
        let name = device::name(d.inner.dev)?;
        let bus = device::pci_bus_id(d.inner.dev)?;
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
            name,
            sm_count: sm.max(0) as u32,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            pci_bus_id: bus.to_ascii_lowercase(),
            numa_node: if numa < 0 { -1 } else { numa },
        })
    }

    fn can_access_peer(d: &CudaDevice, p: &CudaDevice) -> Result<bool> {
        d.enter()?;
        if d.inner.dev == p.inner.dev {
            return Ok(true);
        }
        peer::can_access(d.inner.dev, p.inner.dev)
    }

    fn enable_peer_access(d: &CudaDevice, p: &CudaDevice) -> Result<()> {
        d.enter()?;
        if d.inner.dev == p.inner.dev {
            return Ok(());
        }
        // SAFETY: the peer's context is retained by `p` for the call.
        unsafe { peer::enable(p.inner.ctx) }
    }

    fn multicast_supported(dev: &CudaDevice) -> Result<bool> {
        dev.enter()?;
        let v = dev
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
                "cuDeviceGetAttribute(MULTICAST_SUPPORTED)",
            )
            .unwrap_or(0);
        Ok(v != 0)
    }

    fn synchronize(d: &CudaDevice, timeout: Duration) -> Result<()> {
        d.enter()?;
        // cuCtxSynchronize has no timeout: run it on a helper thread and stop waiting at the
        // limit. The thread holds a clone of the device, so the context stays retained.
        let (tx, rx) = std::sync::mpsc::channel();
        let keep = d.clone();
        std::thread::Builder::new()
            .name("mscclpp-hal-ctxsync".into())
            .spawn(move || {
                let r = keep.bind().and_then(|()| ctx::synchronize());
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
}
