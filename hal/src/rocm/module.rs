//! ROCm code objects: hipModuleLoadData, hipModuleLaunchKernel with the packed argument buffer
//! (HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) ([`crate::ModuleApi`] for [`Rocm`]).

use super::device::RocmDevice;
use super::result::module;
use super::stream::RocmStream;
use super::sys::{HipFunction, HipModule};
use super::Rocm;
use crate::auxil::aligned_code_image;
use crate::{Error, LaunchConfig, ModuleApi, Result};
use std::ffi::CString;
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

// Thread-safe: module and function handles may be used from any thread.
owned_handle!(ModuleInner, module::unload);
thread_safe!(RocmKernel);

impl ModuleApi for Rocm {
    fn load_module(dev: &RocmDevice, code: &[u8]) -> Result<RocmModule> {
        // An 8-byte-aligned, NUL-terminated copy (fatbins want alignment, PTX a NUL).
        let aligned = aligned_code_image("load_module(rocm)", code)?;
        dev.enter()?;
        // SAFETY: the aligned image is complete and alive for the call.
        let raw = unsafe { module::load_data(aligned.as_ptr().cast()) }?;
        Ok(RocmModule {
            inner: Arc::new(ModuleInner { dev: *dev, raw }),
        })
    }

    fn get_kernel(m: &RocmModule, name: &str) -> Result<RocmKernel> {
        let cname = CString::new(name)
            .map_err(|_| Error::invalid("get_kernel(rocm)", "a name without NUL", name))?;
        m.inner.dev.enter()?;
        // SAFETY: the module is live while `m` is borrowed.
        let func = unsafe { module::get_function(m.inner.raw, &cname) }?;
        Ok(RocmKernel {
            module: Arc::clone(&m.inner),
            func,
        })
    }

    unsafe fn launch_raw(
        k: &RocmKernel,
        cfg: &LaunchConfig,
        stream: &RocmStream,
        args: &[u8],
    ) -> Result<()> {
        k.module.dev.enter()?;
        // SAFETY: function and stream are live; the caller vouches for `args`.
        unsafe {
            module::launch(
                k.func,
                cfg.grid,
                cfg.block,
                cfg.shared_mem_bytes,
                stream.raw,
                args,
            )
        }
    }
}
