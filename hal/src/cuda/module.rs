//! CUDA code objects: cuModuleLoadData of embedded fatbins, cuLaunchKernel with a packed
//! `#[repr(C)]` argument struct split into parameters by cuFuncGetParamInfo.
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html>,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html>.

use super::conv::check;
use super::device::CudaDevice;
use super::stream::CudaStream;
use crate::{deferred, Error, LaunchConfig, Result};
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

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for ModuleInner {}
// SAFETY: as above.
unsafe impl Sync for ModuleInner {}
// SAFETY: as above.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: raw came from cuModuleLoadData and is unloaded once.
        let r = self
            .dev
            .bind()
            .and_then(|_| check("cuModuleUnload", unsafe { sys::cuModuleUnload(self.raw) }));
        if let Err(e) = r {
            deferred::record(e);
        }
    }
}

pub(super) fn load(dev: &CudaDevice, code: &[u8]) -> Result<CudaModule> {
    if code.is_empty() {
        return Err(Error::invalid(
            "load_module(cuda)",
            "code object bytes",
            "an empty slice",
        ));
    }
    dev.bind()?;
    // Copy into an 8-byte-aligned, NUL-terminated buffer (fatbins want alignment, PTX a NUL).
    let mut aligned = vec![0u64; code.len() / 8 + 2];
    // SAFETY: `aligned` holds at least code.len() + 8 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), code.len())
    };
    let mut m: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: valid out pointer; the image stays alive for the call.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut m, aligned.as_ptr().cast())
    })?;
    Ok(CudaModule {
        inner: Arc::new(ModuleInner {
            dev: dev.clone(),
            raw: m,
        }),
    })
}

pub(super) fn get_kernel(module: &CudaModule, name: &str) -> Result<CudaKernel> {
    let cname = CString::new(name)
        .map_err(|_| Error::invalid("get_kernel(cuda)", "a name without NUL", name))?;
    module.inner.dev.bind()?;
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: valid out pointer, live module, NUL-terminated name.
    check("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, module.inner.raw, cname.as_ptr())
    })?;
    let mut params = Vec::new();
    loop {
        let (mut off, mut size) = (0usize, 0usize);
        // SAFETY: valid out pointers; an index past the last parameter returns an error.
        let r = unsafe { sys::cuFuncGetParamInfo(f, params.len(), &mut off, &mut size) };
        if r != sys::CUresult::CUDA_SUCCESS {
            break;
        }
        params.push((off, size));
    }
    Ok(CudaKernel {
        module: Arc::clone(&module.inner),
        func: f,
        params: Arc::new(params),
    })
}

/// # Safety
/// `args` must be the kernel's parameters laid out as a `#[repr(C)]` struct; pointers in it
/// must stay valid until the kernel finishes.
pub(super) unsafe fn launch(
    k: &CudaKernel,
    cfg: &LaunchConfig,
    stream: &CudaStream,
    args: &[u8],
) -> Result<()> {
    let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(k.params.len());
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
        ptrs.push(unsafe { args.as_ptr().add(*off) } as *mut c_void);
    }
    k.module.dev.bind()?;
    let (g, b) = (cfg.grid, cfg.block);
    // SAFETY: every parameter pointer points into `args`, alive for the call (the driver copies
    // the values at launch); function and stream are live.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            k.func,
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            cfg.shared_mem_bytes,
            stream.raw,
            ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}
