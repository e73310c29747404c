//! CUDA code objects: cuModuleLoadData of embedded fatbins, cuLaunchKernel with a packed
//! `#[repr(C)]` argument struct split into parameters by cuFuncGetParamInfo
//! ([`crate::ModuleApi`] for [`Cuda`]).

use super::device::CudaDevice;
use super::result::module;
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
        Ok(CudaModule {
            inner: Arc::new(ModuleInner {
                dev: dev.clone(),
                raw,
            }),
        })
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
