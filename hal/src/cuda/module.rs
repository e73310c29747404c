//! CUDA code objects: cuModuleLoadData of embedded fatbins, cuLaunchKernel with a packed
//! `#[repr(C)]` argument struct split into parameters by cuFuncGetParamInfo
//! ([`crate::ModuleApi`] for [`Cuda`]).

use super::device::CudaDevice;
use super::result::{mem, module};
use super::stream::CudaStream;
use super::Cuda;
use crate::auxil::aligned_code_image;
use crate::{Error, LaunchConfig, ModuleApi, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// A loaded module; unloaded when the last kernel from it and the module itself are dropped.
#[derive(Debug, Clone)]
pub struct CudaModule {
    inner: Arc<ModuleInner>,
}

#[derive(Debug)]
struct ModuleInner {
    dev: CudaDevice,
    raw: sys::CUmodule,
}

/// A kernel of a module, with its parameter layout (offset, size) from the driver.
#[derive(Debug, Clone)]
pub struct CudaKernel {
    module: Arc<ModuleInner>,
    func: sys::CUfunction,
    params: Arc<Vec<(usize, usize)>>,
}

// Thread-safe: module and function handles may be used from any thread.
owned_handle!(ModuleInner, module::unload);
thread_safe!(CudaKernel);

/// The device global every module that polls the abort word defines (`mscclpp/device.hpp`).
const ABORT_WORD_GLOBAL: &std::ffi::CStr = c"mscclppAbortWord";

/// The process's abort word (`crate::abort`): pinned host memory mapped for every device,
/// allocated by the first module that asks for it and never freed. Its host address.
fn mapped_abort_word() -> Result<usize> {
    static WORD: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
    let mut w = WORD.lock().unwrap_or_else(|p| p.into_inner());
    if *w == 0 {
        // One cache line; PORTABLE: mapped in every context, not only the current one.
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let p = mem::host_alloc(64, flags)?;
        // SAFETY: a fresh 64-byte allocation, suitably aligned; zeroed before any device
        // reads it (no module has its address yet).
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
/// `m` is a live module of `dev`, whose context is current.
unsafe fn install_abort_word(dev: &CudaDevice, m: sys::CUmodule) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let Some((global, size)) = (unsafe { module::get_global(m, ABORT_WORD_GLOBAL) })? else {
        return Ok(());
    };
    if size != std::mem::size_of::<u64>() {
        return Err(Error::invalid(
            "load_module(cuda): mscclppAbortWord",
            "a pointer (8 bytes)",
            format!("{size} bytes"),
        ));
    }
    let host = mapped_abort_word()?;
    // SAFETY: a live DEVICEMAP allocation.
    let word: u64 = unsafe { mem::host_device_pointer(host as *mut c_void) }?;
    // On the device's own non-blocking stream: a synchronous copy would wait for the legacy
    // default stream, where a kernel may be waiting for this very load on another rank.
    let bytes = word.to_le_bytes();
    super::memory::on_sync_stream(dev, "cuMemcpyHtoDAsync(mscclppAbortWord)", |s| {
        // SAFETY: `global` is the module's live 8-byte global; `bytes` outlives the copy
        // (the stream is synchronised before `on_sync_stream` returns).
        unsafe { mem::copy_htod_async(global, &bytes, s) }
    })?;
    let keep = dev.clone();
    crate::abort::add_drain(dev.ordinal(), move || {
        // The word stays up meanwhile, so every wait of ours ends; bounded all the same.
        let _ = <Cuda as crate::DeviceApi>::synchronize(&keep, crate::abort::drain_limit());
    });
    Ok(())
}

impl ModuleApi for Cuda {
    fn load_module(dev: &CudaDevice, code: &[u8]) -> Result<CudaModule> {
        // An 8-byte-aligned, NUL-terminated copy (fatbins want alignment, PTX a NUL).
        let aligned = aligned_code_image("load_module(cuda)", code)?;
        dev.enter()?;
        // SAFETY: the aligned image is complete and alive for the call.
        let raw = unsafe { module::load_data(aligned.as_ptr().cast()) }?;
        // Under lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) a kernel's
        // code would be loaded at its first launch, which may wait for the kernels running on
        // the GPU; those can be other ranks' kernels spinning until this rank's kernel runs (a
        // collective), a deadlock. Load every function now, as NCCL loads its kernels at init.
        // cuFuncLoad exists from CUDA 12.4 (older drivers predate default lazy loading).
        if super::result::init::driver_version()? >= 12040 {
            // SAFETY: `raw` is the live module just loaded.
            if let Err(e) = unsafe { module::load_all_functions(raw) } {
                // SAFETY: nothing uses the module yet.
                let _ = unsafe { module::unload(raw) };
                return Err(e);
            }
        }
        // SAFETY: `raw` is the live module just loaded, its device's context current.
        if let Err(e) = unsafe { install_abort_word(dev, raw) } {
            // SAFETY: nothing uses the module yet.
            let _ = unsafe { module::unload(raw) };
            return Err(e);
        }
        Ok(CudaModule {
            inner: Arc::new(ModuleInner {
                dev: dev.clone(),
                raw,
            }),
        })
    }

    fn compile_source(
        arch: (u32, u32),
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
    ) -> Result<Vec<u8>> {
        super::rtc::compile(
            super::rtc::cache_dir(),
            arch,
            name,
            source,
            headers,
            options,
        )
    }

    fn get_kernel(m: &CudaModule, name: &str) -> Result<CudaKernel> {
        let cname = CString::new(name)
            .map_err(|_| Error::invalid("get_kernel(cuda)", "a name without NUL", name))?;
        m.inner.dev.enter()?;
        // SAFETY: the module is live while `m` is borrowed.
        let func = unsafe { module::get_function(m.inner.raw, &cname) }?;
        let mut params = Vec::new();
        // SAFETY: `func` belongs to the live module.
        while let Some(p) = unsafe { module::param_info(func, params.len()) } {
            params.push(p);
        }
        Ok(CudaKernel {
            module: Arc::clone(&m.inner),
            func,
            params: Arc::new(params),
        })
    }

    unsafe fn launch_raw(
        k: &CudaKernel,
        cfg: &LaunchConfig,
        stream: &CudaStream,
        args: &[u8],
    ) -> Result<()> {
        // The parameter pointers, on the stack for kernels of up to STACK_PARAMS parameters
        // (every kernel of this project): a launch makes no heap allocation (issue 28).
        const STACK_PARAMS: usize = 32;
        let mut on_stack = [std::ptr::null_mut::<c_void>(); STACK_PARAMS];
        let mut on_heap: Vec<*mut c_void> = Vec::new();
        let n = k.params.len();
        let ptrs: &mut [*mut c_void] = if n <= STACK_PARAMS {
            &mut on_stack[..n]
        } else {
            on_heap.resize(n, std::ptr::null_mut());
            &mut on_heap
        };
        for (i, (off, size)) in k.params.iter().enumerate() {
            if off + size > args.len() {
                return Err(Error::invalid(
                    "launch(cuda)",
                    format!(
                        "an argument struct covering parameter {i} (bytes {off}..{})",
                        off + size
                    ),
                    format!("{} bytes", args.len()),
                ));
            }
            // SAFETY: off < args.len() was checked above.
            ptrs[i] = unsafe { args.as_ptr().add(*off) } as *mut c_void;
        }
        k.module.dev.enter()?;
        // SAFETY: every parameter pointer points into `args`, alive for the call (the driver
        // copies the values at launch); function and stream are live; the caller keeps the
        // device pointers inside `args` valid until the kernel finishes.
        unsafe {
            module::launch(
                k.func,
                cfg.grid,
                cfg.block,
                cfg.shared_mem_bytes,
                stream.raw,
                ptrs,
            )
        }
    }
}
