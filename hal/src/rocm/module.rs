//! ROCm code objects: hipModuleLoadData, hipModuleLaunchKernel with the packed argument buffer
//! (HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE).

use super::conv::{check, hip, HipFunction, HipModule};
use super::device::RocmDevice;
use super::stream::RocmStream;
use crate::{deferred, Error, LaunchConfig, Result};
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// A loaded code object; unloaded when it and every kernel from it are dropped.
#[derive(Debug, Clone)]
pub struct RocmModule {
    inner: Arc<ModuleInner>,
}

#[derive(Debug)]
struct ModuleInner {
    dev: RocmDevice,
    raw: HipModule,
}

/// A kernel of a module.
#[derive(Debug, Clone)]
pub struct RocmKernel {
    module: Arc<ModuleInner>,
    func: HipFunction,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}
// SAFETY: as above.
unsafe impl Send for RocmKernel {}
// SAFETY: as above.
unsafe impl Sync for RocmKernel {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: raw came from hipModuleLoadData and is unloaded once.
        let r = hip().and_then(|h| {
            self.dev
                .bind()
                .and_then(|_| check("hipModuleUnload", unsafe { (h.hipModuleUnload)(self.raw) }))
        });
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

pub(super) fn load(dev: &RocmDevice, code: &[u8]) -> Result<RocmModule> {
    if code.is_empty() {
        return Err(Error::invalid(
            "load_module(rocm)",
            "code object bytes",
            "an empty slice",
        ));
    }
    let h = hip()?;
    dev.bind()?;
    let mut aligned = vec![0u64; code.len() / 8 + 2];
    // SAFETY: `aligned` holds at least code.len() + 8 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), code.len())
    };
    let mut m: HipModule = std::ptr::null_mut();
    // SAFETY: valid out pointer; the image is alive for the call.
    check("hipModuleLoadData", unsafe {
        (h.hipModuleLoadData)(&mut m, aligned.as_ptr().cast())
    })?;
    Ok(RocmModule {
        inner: Arc::new(ModuleInner { dev: *dev, raw: m }),
    })
}

pub(super) fn get_kernel(module: &RocmModule, name: &str) -> Result<RocmKernel> {
    let cname = CString::new(name)
        .map_err(|_| Error::invalid("get_kernel(rocm)", "a name without NUL", name))?;
    let h = hip()?;
    module.inner.dev.bind()?;
    let mut f: HipFunction = std::ptr::null_mut();
    // SAFETY: valid out pointer, live module, NUL-terminated name.
    check("hipModuleGetFunction", unsafe {
        (h.hipModuleGetFunction)(&mut f, module.inner.raw, cname.as_ptr())
    })?;
    Ok(RocmKernel {
        module: Arc::clone(&module.inner),
        func: f,
    })
}

/// # Safety
/// `args` must be the kernel's parameters laid out as a `#[repr(C)]` struct; pointers in it
/// must stay valid until the kernel finishes.
pub(super) unsafe fn launch(
    k: &RocmKernel,
    cfg: &LaunchConfig,
    stream: &RocmStream,
    args: &[u8],
) -> Result<()> {
    let h = hip()?;
    k.module.dev.bind()?;
    let mut buf = vec![0u64; args.len().div_ceil(8).max(1)];
    // SAFETY: buf holds at least args.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(args.as_ptr(), buf.as_mut_ptr().cast::<u8>(), args.len())
    };
    let mut size = args.len();
    let mut extra: [*mut c_void; 5] = [
        std::ptr::without_provenance_mut::<c_void>(1), // HIP_LAUNCH_PARAM_BUFFER_POINTER
        buf.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut::<c_void>(2), // HIP_LAUNCH_PARAM_BUFFER_SIZE
        (&mut size as *mut usize).cast(),
        std::ptr::without_provenance_mut::<c_void>(3), // HIP_LAUNCH_PARAM_END
    ];
    let (g, b) = (cfg.grid, cfg.block);
    // SAFETY: extra points at live locals for the call; function and stream are live.
    check("hipModuleLaunchKernel", unsafe {
        (h.hipModuleLaunchKernel)(
            k.func,
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            cfg.shared_mem_bytes,
            stream.raw,
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        )
    })
}
