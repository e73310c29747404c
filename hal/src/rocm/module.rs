//! ROCm code objects: hipModuleLoadData, hipModuleLaunchKernel with the packed argument buffer
//! (HIP_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) ([`crate::ModuleApi`] for [`Rocm`]).

use super::conv::{HIP_HOST_MALLOC_MAPPED, HIP_HOST_MALLOC_PORTABLE};
use super::device::RocmDevice;
use super::result::{mem, module};
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

/// The device global every module that polls the abort word defines (`mscclpp/device.hpp`).
const ABORT_WORD_GLOBAL: &std::ffi::CStr = c"mscclppAbortWord";

/// The process's abort word (`crate::abort`): pinned host memory mapped for every device
/// (`hipHostMalloc(Mapped | Portable)`), allocated by the first module that asks for it and
/// never freed. Its host address.
fn mapped_abort_word() -> Result<usize> {
    static WORD: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
    let mut w = WORD.lock().unwrap_or_else(|p| p.into_inner());
    if *w == 0 {
        let p = mem::host_malloc(64, HIP_HOST_MALLOC_MAPPED | HIP_HOST_MALLOC_PORTABLE)?;
        // SAFETY: a fresh 64-byte allocation, suitably aligned; zeroed before any device reads
        // it (no module has its address yet).
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, 64) };
        // SAFETY: aligned, live and never freed.
        unsafe { crate::abort::set_mapped_word(p.cast::<u32>()) };
        *w = p as usize;
    }
    Ok(*w)
}

/// Writes the abort word's device address into the module's `mscclppAbortWord`, when it has
/// one, and registers the device's drain (run before the word is lowered).
///
/// # Safety
/// `m` is a live module of `dev`, the current device.
unsafe fn install_abort_word(dev: &RocmDevice, m: HipModule) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let Some((global, size)) = (unsafe { module::get_global(m, ABORT_WORD_GLOBAL) })? else {
        return Ok(());
    };
    if size != std::mem::size_of::<u64>() {
        return Err(Error::invalid(
            "load_module(rocm): mscclppAbortWord",
            "a pointer (8 bytes)",
            format!("{size} bytes"),
        ));
    }
    let host = mapped_abort_word()?;
    // SAFETY: a live mapped allocation.
    let word = unsafe { mem::host_device_pointer(host as *mut std::ffi::c_void) }? as usize as u64;
    let bytes = word.to_le_bytes();
    // On the device's own non-blocking stream (see `on_sync_stream`).
    super::memory::on_sync_stream(dev, "hipMemcpyAsync(mscclppAbortWord)", |s| {
        // SAFETY: `global` is the module's live 8-byte global; `bytes` outlives the copy (the
        // stream is synchronised before `on_sync_stream` returns).
        unsafe { mem::copy_async(global, bytes.as_ptr() as usize as u64, bytes.len(), s) }
    })?;
    let keep = *dev;
    crate::abort::add_drain(dev.ordinal as usize, move || {
        // The word stays up meanwhile, so every wait of ours ends; bounded all the same.
        let _ = <Rocm as crate::DeviceApi>::synchronize(&keep, crate::abort::drain_limit());
    });
    Ok(())
}

impl ModuleApi for Rocm {
    fn load_module(dev: &RocmDevice, code: &[u8]) -> Result<RocmModule> {
        // An 8-byte-aligned, NUL-terminated copy (fatbins want alignment, PTX a NUL).
        let aligned = aligned_code_image("load_module(rocm)", code)?;
        dev.enter()?;
        // SAFETY: the aligned image is complete and alive for the call.
        let raw = unsafe { module::load_data(aligned.as_ptr().cast()) }?;
        // SAFETY: `raw` is the live module just loaded, on the current device.
        if let Err(e) = unsafe { install_abort_word(dev, raw) } {
            // SAFETY: nothing uses the module yet.
            let _ = unsafe { module::unload(raw) };
            return Err(e);
        }
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
